"""Less padding in the learner's batches: length buckets and trimming.

Rollouts write episodes into a fixed [B, L] buffer (L = config.max_len) and
pad the rest; in the default, kv_chain and schema_calls configs the episodes
fill 39-56% of it and the trained (POLICY) tokens 10-14%. Everything the
update computes on a token is causal or masked, so the columns after the
longest episode of a batch change nothing but the cost: `trim` drops them,
cut at `bucket_length` (the longest episode rounded up to a multiple of
`bucket`, so that a jitted update compiles once per bucket, at most
ceil(L / bucket) programs, not once per length).

Trimming is exact for every per-token quantity (log-probs, entropies, values,
KL, advantages: position t reads tokens 0..t only, and the columns dropped are
padding) and for the loss aggregations 'token-mean' and 'seq-mean-token-mean'.
'seq-mean-token-sum-norm' divides by norm_constant, which defaults to the
buffer length: a trimmed batch must pass the untrimmed L explicitly.

Host rollouts (agentic_rl/host_rollout.py) return to Python before the
update, so their trajectories can be trimmed there. A JAX-native step that
rolls out and updates in one program cannot change shapes inside it: there
`bucketed_update` compiles the update for a few fixed lengths
(`rl.update_length_buckets`, `update_lengths`) and picks, at run time with
`lax.switch`, the shortest one that holds every trained position
(`loss_length`). `first_fit_rows` and `metrics` measure what trimming or
packing would reach.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:  # annotations only
  from agentic_rl.learner.batch import LearnerBatch


def bucket_length(length_b: Any, *, bucket: int, max_len: int) -> int:
  """Buffer length that holds every episode: max(length) rounded up to `bucket`.

  Args:
    length_b: [B] int episode lengths (non-pad tokens), numpy or jax (read on
      the host: one device-to-host transfer of B ints).
    bucket: rounding step in positions (> 0).
    max_len: the untrimmed buffer length L (the result never exceeds it).

  Returns:
    An int in [min(bucket, max_len), max_len]; a multiple of `bucket` unless
    it is max_len.

  Raises:
    ValueError: bucket or max_len not a positive integer, or a length above
      max_len.
  """
  for name, v in (("bucket", bucket), ("max_len", max_len)):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
      raise ValueError(f"{name}={v!r}: must be a positive integer")
  longest = int(np.max(np.asarray(length_b))) if np.size(length_b) else 0
  if longest > max_len:
    raise ValueError(f"length={longest}: exceeds max_len={max_len}")
  return min(max_len, max(1, -(-longest // bucket)) * bucket)


def host_trim_length(config, length_b: Any) -> int:
  """Length a host-rollout batch is cut to before the update (max_len = none).

  `bucket_length` with `config.trim_bucket`, except where trimming would
  change the update: `config.trim_bucket` = 0 (off), a replay buffer
  (`rl.replay_capacity` > 0: its rows hold max_len tokens and replace batch
  rows), and Dr.GRPO's constant normaliser left at its default L
  (`rl.loss_agg_mode='seq-mean-token-sum-norm'` with `rl.loss_norm_constant`
  = 0). With an SFT-only config (no `rl` block) only trim_bucket matters.

  Args:
    config: the experiment config (max_len, trim_bucket, rl).
    length_b: [B] int episode lengths.

  Returns:
    An int in [1, config.max_len].
  """
  max_len = config.max_len
  rl = config.rl if "rl" in config else None
  if config.trim_bucket == 0 or (
      rl is not None
      and (
          rl.replay_capacity > 0
          or (
              rl.loss_agg_mode == "seq-mean-token-sum-norm"
              and not rl.loss_norm_constant
          )
      )
  ):
    return max_len
  return bucket_length(length_b, bucket=config.trim_bucket, max_len=max_len)


def trim(tree: Any, full_len: int, new_len: int) -> Any:
  """Cuts axis 1 of every [B, full_len, ...] leaf of a pytree to new_len.

  Works on a `types.Trajectory` (tokens, role, logprob, turn) and on the
  learner's batch alike; leaves of other shapes ([B], per-turn [B, K]
  with K != full_len, scalars) are returned unchanged.

  Args:
    tree: pytree of arrays (numpy or jax).
    full_len: the buffer length L of the token-aligned leaves.
    new_len: 1 <= new_len <= full_len (e.g. `bucket_length`).

  Returns:
    The same structure with token-aligned leaves [B, new_len, ...].

  Raises:
    ValueError: new_len outside [1, full_len].
  """
  if not 1 <= new_len <= full_len:
    raise ValueError(f"new_len={new_len}: must be in [1, full_len={full_len}]")
  if new_len == full_len:
    return tree

  def cut(x):
    if getattr(x, "ndim", 0) >= 2 and x.shape[1] == full_len:
      return x[:, :new_len]
    return x

  return jax.tree.map(cut, tree)


def first_fit_rows(length_b: Any, row_len: int) -> int:
  """Rows of `row_len` positions that first-fit-decreasing packing needs.

  Episodes are placed longest first, each into the first row with room
  (Johnson 1973 bin packing; at most 11/9 OPT + 1 rows). A measure of what
  packing episodes with segment ids (`Transformer.hidden_states(...,
  segment_ids_bt=...)`) would reach: real-token share = sum(length) /
  (rows * row_len).

  Args:
    length_b: [B] int episode lengths, each <= row_len.
    row_len: positions per packed row (> 0).

  Returns:
    The number of rows (0 for no episodes).

  Raises:
    ValueError: an episode longer than row_len.
  """
  lengths = sorted(
      (int(x) for x in np.asarray(length_b).reshape(-1)), reverse=True
  )
  if lengths and lengths[0] > row_len:
    raise ValueError(f"length={lengths[0]}: exceeds row_len={row_len}")
  room: list[int] = []
  for n in lengths:
    for i, r in enumerate(room):
      if r >= n:
        room[i] -= n
        break
    else:
      room.append(row_len - n)
  return len(room)


def metrics(
    loss_mask_bl: jax.Array, length_b: jax.Array
) -> dict[str, jax.Array]:
  """Token shares of a batch buffer (what the update computes on).

  Args:
    loss_mask_bl: [B, L] bool/int, True on trained tokens.
    length_b: [B] int, non-pad tokens per row.

  Returns:
    {'trained_token_share': trained tokens / (B L),
     'real_token_share': non-pad tokens / (B L)}, float32 scalars.
  """
  b, l = loss_mask_bl.shape
  return {
      "trained_token_share": jnp.mean(loss_mask_bl.astype(jnp.float32)),
      "real_token_share": jnp.sum(length_b).astype(jnp.float32) / (b * l),
  }


# The learner batch's token-aligned [B, L] fields (learner/batch.py
# LearnerBatch); 'sil' (its own episodes) and per-row fields stay whole.
SEQUENCE_KEYS = (
    "tokens",
    "mask",
    "behaviour_logp",
    "ref_logp",
    "advantage",
    "old_values",
    "returns",
    "obs_mask",
    "obs_targets",
    "aux_advantage",
    "behaviour_shift",
)


def update_lengths(max_len: int, buckets: int, multiple: int = 16) -> tuple:
  """The K lengths a bucketed update is compiled for.

  L_i = min(max_len, ceil(max_len * i / K) rounded up to `multiple`), i =
  1..K, duplicates dropped; the last is always max_len.

  Args:
    max_len: the buffer length L.
    buckets: K >= 1.
    multiple: round each length up to a multiple of this (>= 1).

  Returns:
    Increasing tuple of ints ending in max_len.

  Raises:
    ValueError: buckets < 1 or multiple < 1.
  """
  if buckets < 1 or multiple < 1:
    raise ValueError(
        f"update_lengths: buckets={buckets}, multiple={multiple}: need >= 1"
    )
  out = []
  for i in range(1, buckets + 1):
    n = -(-max_len * i // buckets)
    n = min(max_len, -(-n // multiple) * multiple)
    if n not in out:
      out.append(n)
  if out[-1] != max_len:
    out.append(max_len)
  return tuple(out)


def explicit_lengths(lengths, max_len: int) -> tuple:
  """A bucketed update's lengths as given: strictly increasing positive ints
  <= max_len, with max_len appended when it is not the last.

  Args:
    lengths: sequence of ints (e.g. `sft.bucket_lengths`).
    max_len: the buffer length L.

  Returns:
    Increasing tuple of ints ending in max_len.

  Raises:
    ValueError: a length is not an int, not in [1, max_len], or the lengths
      are not strictly increasing.
  """
  out = []
  for n in lengths:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_len:
      raise ValueError(
          f"bucket lengths {tuple(lengths)}: {n!r} is not an int in "
          f"[1, max_len={max_len}]"
      )
    if out and n <= out[-1]:
      raise ValueError(
          f"bucket lengths {tuple(lengths)}: not strictly increasing"
      )
    out.append(n)
  if not out or out[-1] != max_len:
    out.append(max_len)
  return tuple(out)


def loss_length(batch: LearnerBatch) -> jax.Array:
  """1 + the last position any loss reads: int32 scalar in [1, L].

  The loss terms are masked by 'mask' (POLICY tokens) and, for the auxiliary
  next-observation loss, 'obs_mask'; position t's log-prob reads tokens 0..t
  only, so the columns after this length change no loss, gradient or metric.
  `batch`: a `learner.batch.LearnerBatch`.
  """
  return loss_length_of(batch.mask, batch.obs_mask)


def loss_length_of(mask_bl: jax.Array, obs_mask_bl=None) -> jax.Array:
  """`loss_length` from the masks themselves: 1 + the last position set in
  mask_bl [B, L] or obs_mask_bl [B, L] (None: not used), int32 scalar."""
  m = mask_bl.astype(bool)
  if obs_mask_bl is not None:
    m = m | obs_mask_bl.astype(bool)
  pos = jnp.arange(m.shape[1], dtype=jnp.int32)
  last = jnp.max(jnp.where(m, pos[None, :], 0))
  return last + 1


def bucket_index(
    lengths: tuple, need, axis_name: str | None = None
) -> jax.Array:
  """Index of the shortest of the increasing `lengths` that is >= need
  (int32 scalar; the `lax.switch` branch of a bucketed program).

  `axis_name`: a `jax.vmap` axis the program runs under (the seed axis of
  `agentic_rl/seeds.py`): `need` is first maximised over it, so every
  vmapped instance takes the same branch and the index stays unbatched (a
  per-instance index would turn `lax.switch` into a select that runs every
  branch). None: no such axis.
  """
  if axis_name is not None:
    need = jax.lax.pmax(need, axis_name)
  return jnp.searchsorted(jnp.asarray(lengths, jnp.int32), need)


def bucketed_forward(forward, lengths: tuple, tokens_bl: jax.Array, need):
  """`forward` run on the shortest of `lengths` that holds `need` columns.

  The behaviour and reference forwards of the one-jit step need only the
  positions the loss reads (`loss_length`); with the update on a length
  bucket (`bucketed_update`) they run on the same bucket, so the update's
  loss forward and the trainer-side behaviour forward see arrays of equal
  shape (their log-probs then agree bitwise, `behaviour_gap_max_first`).

  Args:
    forward: tokens [B, n] int32 -> pytree of [B, n] float arrays (None
      leaves allowed).
    lengths: increasing static lengths ending at L = tokens_bl.shape[1]
      (`update_lengths`).
    tokens_bl: [B, L] int32.
    need: int32 scalar, the columns that must be computed (`loss_length_of`).

  Returns:
    forward's pytree with every [B, n] leaf zero-padded back to [B, L]:
    columns >= n are 0, the others equal `forward(tokens_bl)`'s up to float
    summation order (causal attention: column t reads tokens 0..t only).

  Raises:
    ValueError: lengths not ending at L.
  """
  full = tokens_bl.shape[1]
  if lengths[-1] != full:
    raise ValueError(
        f"bucketed_forward: lengths={lengths} must end at the token length "
        f"{full}"
    )
  index = bucket_index(lengths, need)

  def branch(n):
    def go(tokens):
      out = forward(tokens[:, :n])
      pad = lambda x: jnp.pad(
          x, [(0, 0), (0, full - n)] + [(0, 0)] * (x.ndim - 2)
      )
      return jax.tree.map(pad, out)

    return go

  return jax.lax.switch(index, [branch(n) for n in lengths], tokens_bl)


def trim_batch(batch: LearnerBatch, new_len: int) -> LearnerBatch:
  """The learner batch with its SEQUENCE_KEYS fields cut to [B, new_len].

  Args:
    batch: a `learner.batch.LearnerBatch` of [B, L] arrays (None: unused).
    new_len: 1 <= new_len <= L.

  Returns:
    The batch with every set SEQUENCE_KEYS field [B, new_len]; the others
    (per-row reward_hat, prompt_embedding, the sil batch) unchanged. The cuts
    are made in sorted field order, the batch's leaf order.
  """
  cut = {
      k: getattr(batch, k)[:, :new_len]
      for k in sorted(SEQUENCE_KEYS)
      if getattr(batch, k) is not None
  }
  return dataclasses.replace(batch, **cut)


def bucketed_update(update, lengths: tuple, axis_name: str | None = None):
  """`update` run on the shortest of `lengths` that holds the batch's loss.

  Args:
    update: `learner.make_update_fn`'s `update(params, opt_state, batch,
      kl_coef, log_z_state=None, dropout_key=None)`.
    lengths: increasing static lengths, the last = the batch's L
      (`update_lengths`).
    axis_name: the `jax.vmap` axis of vmapped seeds, or None
      (`bucket_index`: one bucket, the longest need's, for all of them).

  Returns:
    A function with update's signature and results; its metrics gain
    'update_length' (the length used, float32). All len(lengths) versions
    are compiled into the program (lax.switch); the update is the same as on
    the whole buffer up to float summation order (tests/test_padding.py).
  """

  def run(
      params, opt_state, batch, kl_coef, log_z_state=None, dropout_key=None
  ):
    full = batch.tokens.shape[1]
    if lengths[-1] != full:
      raise ValueError(
          f"bucketed_update: lengths={lengths} must end at the batch length "
          f"{full}"
      )
    index = bucket_index(lengths, loss_length(batch), axis_name)

    def branch(n):
      def go(operands):
        p, o, b, kl, z, key = operands
        out = update(p, o, trim_batch(b, n), kl, z, dropout_key=key)
        metrics = dict(out[2])
        metrics["update_length"] = jnp.float32(n)
        return (out[0], out[1], metrics, *out[3:])

      return go

    return jax.lax.switch(
        index,
        [branch(n) for n in lengths],
        (params, opt_state, batch, kl_coef, log_z_state, dropout_key),
    )

  return run
