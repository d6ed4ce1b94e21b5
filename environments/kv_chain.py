"""Key-value chains: follow a hidden map with a `get(key)` tool (JAX-native).

Each task hides a random map over the 26 lowercase letters: a path
k_0 -> k_1 -> ... -> k_d of d hops (d uniform in [min_hops, max_hops]) plus
distractor keys (in the map, off the path, each pointing at a random key of the
map). The prompt names the start key and the number of hops; the answer is the key
reached after d hops, which only the tool reveals.

Episode format (byte ids plus tokenizer specials):

  prompt:  BOS "From q hop 3.\n" PAD...
  call:    CALL "q" CALL_END        -> OBS "w" OBS_END   (get(q) = w)
           a key outside the map, or anything but one lowercase letter between
           CALL and CALL_END         -> OBS "error" OBS_END (a tool error)
  answer:  ANSWER "z" ANSWER_END    -> done

Turn classification in `step` (same order as environments/arithmetic.py):
an empty turn or one that does not end in a stop token, or one that starts with
neither CALL nor ANSWER, is a format error (done); a CALL turn is a tool call (not
done unless the turn budget is spent); an ANSWER turn ends the episode (format
error unless it is exactly one letter). Stepping a finished episode is a no-op.

Facts (per episode unless noted): 'correct', 'answered', 'format_error',
'num_tool_calls', 'num_tool_errors' (malformed calls and keys outside the map),
'num_redundant_calls' (well-formed calls of a key queried before),
'num_offpath_calls' (well-formed first-time calls that do not resolve the next hop),
'hops' (d), 'hard' (d >= 2), 'tool_necessary' (always true: d >= 1 and the answer is
hidden), 'tool_call_turn' [K], 'valid_call_turn' [K] (turns that were well-formed calls
of a key in the map, repeats included: the per-call step reward of
`rl.step_reward='valid_call'`), 'progress' [K + 1] (hops resolved in order / d after
each turn; a PBRS potential), 'gold_answer' [3] (ANSWER letter ANSWER_END) and
'gold_answer_len'.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp

from agentic_text import tokenizers as tok
from environments import common

NUM_KEYS = 26  # lowercase letters
_A = ord("a")
_PROMPT_HEAD = tuple(b"From ")
_PROMPT_MID = tuple(b" hop ")
_PROMPT_TAIL = tuple(b".\n")


@flax.struct.dataclass
class KVChainTask:
  """One task (or a batch with a leading dim n).

  Attributes:
    next_key: int32 [26]; get(key) for keys in the map, -1 for keys outside it.
    path: int32 [H + 1] (H = max_hops); path[0] is the start key, path[i] the key
      after i hops (entries past `hops` continue along the map).
    hops: int32 []; d, the number of hops asked for.
    answer: int32 []; path[d], the letter index of the answer.
    distractor: int32 []; a key of the map that is not on path[0..d] (the expert's
      wrong argument).
  """

  next_key: jax.Array
  path: jax.Array
  hops: jax.Array
  answer: jax.Array
  distractor: jax.Array


@flax.struct.dataclass
class KVChainState:
  """Unbatched episode state (K = max_turns).

  Attributes:
    task: the episode's KVChainTask.
    turn, num_tool_calls, num_tool_errors, num_redundant_calls, num_offpath_calls,
      resolved: int32 []; resolved = hops resolved in order (path[i] queried
      for i < resolved).
    done, answered, correct, format_error: bool [].
    queried: bool [26]; keys queried by well-formed calls so far.
    tool_call_turn: bool [K]; valid_call_turn: bool [K] (well-formed calls of a
      key in the map, repeats included); progress: float32 [K + 1].
  """

  task: KVChainTask
  turn: jax.Array
  done: jax.Array
  answered: jax.Array
  correct: jax.Array
  format_error: jax.Array
  num_tool_calls: jax.Array
  num_tool_errors: jax.Array
  num_redundant_calls: jax.Array
  num_offpath_calls: jax.Array
  resolved: jax.Array
  queried: jax.Array
  tool_call_turn: jax.Array
  valid_call_turn: jax.Array
  progress: jax.Array


def _letter(x: jax.Array):
  """A one-token piece: the byte of letter index x."""
  return jnp.reshape(_A + jnp.asarray(x, jnp.int32), (1,)), jnp.ones((1,), bool)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _make_tasks(
    key: jax.Array, n: int, min_hops: int, max_hops: int, num_distractors: int
) -> KVChainTask:
  """Draws n tasks (see KVChainTask); static sizes, one jitted program."""
  num_map = max_hops + 1 + num_distractors

  def one(k):
    kp, kh, kt, kd = jax.random.split(k, 4)
    perm = jax.random.permutation(kp, NUM_KEYS).astype(jnp.int32)
    d = jax.random.randint(kh, (), min_hops, max_hops + 1).astype(jnp.int32)
    i = jnp.arange(num_map)
    rand_target = perm[jax.random.randint(kt, (num_map,), 0, num_map)]
    target = jnp.where(
        i < d, perm[jnp.minimum(i + 1, num_map - 1)], rand_target
    )
    next_key = (
        jnp.full((NUM_KEYS,), -1, jnp.int32).at[perm[:num_map]].set(target)
    )

    def walk(cur, _):
      nxt = next_key[cur]
      return nxt, cur

    _, path = jax.lax.scan(walk, perm[0], None, length=max_hops + 1)
    # A distractor: a map key not on path[0..d] (perm[d + 1 ..]); with no room
    # left in the map, a key outside it.
    j = jax.random.randint(kd, (), d + 1, jnp.maximum(num_map, d + 2))
    distractor = perm[jnp.minimum(j, NUM_KEYS - 1)]
    return KVChainTask(
        next_key=next_key,
        path=path,
        hops=d,
        answer=perm[d],
        distractor=distractor,
    )

  return jax.vmap(one)(jax.random.split(key, n))


@dataclasses.dataclass(frozen=True)
class KVChainEnv:
  """Key-value chains with a `get(key)` tool (see module docstring).

  Attributes:
    max_prompt_len: P (>= 15).
    max_action_len: A (>= 3).
    max_obs_len: O (>= 7 for "error").
    max_turns: K (>= max_hops + 1, so that the expert can finish).
    min_hops, max_hops: range of d (1 <= min_hops <= max_hops <= 6).
    num_distractors: extra map keys off the path (max_hops + 1 + num_distractors
      <= 26).
    expert_overcall_prob: per expert call after the first, probability of
      re-querying the previous key first (a redundant call).
    expert_undercall_prob: per expert turn with hops left, probability of answering
      at once with the current key (too early: wrong).
    expert_wrong_arg_prob: per expert call, probability of querying the
      distractor key instead (an off-path call).
  """

  max_prompt_len: int = 16
  max_action_len: int = 8
  max_obs_len: int = 8
  max_turns: int = 5
  min_hops: int = 1
  max_hops: int = 3
  num_distractors: int = 4
  expert_overcall_prob: float = 0.0
  expert_undercall_prob: float = 0.0
  expert_wrong_arg_prob: float = 0.0

  def __post_init__(self):
    if not 1 <= self.min_hops <= self.max_hops <= 6:
      raise ValueError(
          "min_hops/max_hops: need 1 <= min_hops <= max_hops <= 6, got min_hops="
          f"{self.min_hops}, max_hops={self.max_hops}"
      )
    if not 0 <= self.num_distractors <= NUM_KEYS - self.max_hops - 1:
      raise ValueError(
          f"num_distractors must be in [0, {NUM_KEYS - self.max_hops - 1}], got "
          f"{self.num_distractors}"
      )
    if self.max_prompt_len < 15:
      raise ValueError(
          f"max_prompt_len must be >= 15, got {self.max_prompt_len}"
      )
    if self.max_action_len < 3:
      raise ValueError(
          f"max_action_len must be >= 3, got {self.max_action_len}"
      )
    if self.max_obs_len < 7:
      raise ValueError(f"max_obs_len must be >= 7, got {self.max_obs_len}")
    if self.max_turns < self.max_hops + 1:
      raise ValueError(
          f"max_turns must be >= max_hops + 1 = {self.max_hops + 1}, got "
          f"{self.max_turns}"
      )
    common.check_probabilities(
        self,
        (
            "expert_overcall_prob",
            "expert_undercall_prob",
            "expert_wrong_arg_prob",
        ),
    )

  @property
  def max_answer_len(self) -> int:
    """Ag, the length of the 'gold_answer' fact (ANSWER letter ANSWER_END)."""
    return 3

  def sample_tasks(self, key: jax.Array, n: int) -> KVChainTask:
    """n i.i.d. tasks (fields with leading dim n)."""
    return _make_tasks(
        key, n, self.min_hops, self.max_hops, self.num_distractors
    )

  def eval_tasks(self, n: int, seed: int) -> KVChainTask:
    """A fixed held-out set, deterministic in (n, seed)."""
    return self.sample_tasks(jax.random.key(seed), n)

  def reset(self, task: KVChainTask):
    """Starts an episode.

    Returns:
      state; prompt_tokens int32 [P] (BOS "From q hop 3.\\n" then PAD);
      prompt_len int32 [].
    """
    prompt, prompt_len = common.assemble(
        [
            common.const_piece([tok.BOS, *_PROMPT_HEAD]),
            _letter(task.path[0]),
            common.const_piece(_PROMPT_MID),
            common.int_piece(task.hops),
            common.const_piece(_PROMPT_TAIL),
        ],
        self.max_prompt_len,
    )
    z = jnp.zeros((), jnp.int32)
    f = jnp.zeros((), bool)
    state = KVChainState(
        task=task,
        turn=z,
        done=f,
        answered=f,
        correct=f,
        format_error=f,
        num_tool_calls=z,
        num_tool_errors=z,
        num_redundant_calls=z,
        num_offpath_calls=z,
        resolved=z,
        queried=jnp.zeros((NUM_KEYS,), bool),
        tool_call_turn=jnp.zeros((self.max_turns,), bool),
        valid_call_turn=jnp.zeros((self.max_turns,), bool),
        progress=jnp.zeros((self.max_turns + 1,), jnp.float32),
    )
    return state, prompt, prompt_len

  def step(
      self, state: KVChainState, action_tokens: jax.Array, action_len: jax.Array
  ):
    """Applies one assistant turn (rules in the module docstring).

    Args:
      state: unbatched KVChainState.
      action_tokens: int [A]; the turn is action_tokens[:action_len].
      action_len: int []; clipped to [0, A].

    Returns:
      (state, obs_tokens int32 [O], obs_len int32 [], done bool []).
    """
    tokens, length, first, last, stopped = common.turn_frame(
        action_tokens, action_len
    )
    active = ~state.done
    is_call = active & stopped & (first == tok.CALL)
    is_answer = active & stopped & (first == tok.ANSWER)
    is_other = active & ~is_call & ~is_answer

    letter = tokens[1] - _A
    one_letter = (length == 3) & (letter >= 0) & (letter < NUM_KEYS)
    key_idx = jnp.clip(letter, 0, NUM_KEYS - 1)
    task = state.task
    value = task.next_key[key_idx]
    call_ok = one_letter & (last == tok.CALL_END) & (value >= 0)
    answer_ok = one_letter & (last == tok.ANSWER_END)

    obs_ok, len_ok = common.wrapped(
        tok.OBS, tok.OBS_END, [_letter(value)], self.max_obs_len
    )
    obs_err, len_err = common.error_obs(self.max_obs_len)
    obs = jnp.where(is_call, jnp.where(call_ok, obs_ok, obs_err), tok.PAD)
    obs_len = jnp.where(is_call, jnp.where(call_ok, len_ok, len_err), 0)

    good = is_call & call_ok
    redundant = good & state.queried[key_idx]
    want = task.path[jnp.clip(state.resolved, 0, task.path.shape[0] - 1)]
    advance = good & (state.resolved < task.hops) & (key_idx == want)
    offpath = good & ~redundant & ~advance
    resolved = state.resolved + advance.astype(jnp.int32)

    answered = is_answer & answer_ok
    turn = state.turn + active.astype(jnp.int32)
    done = state.done | is_answer | is_other | (turn >= self.max_turns)
    i32 = lambda b: b.astype(jnp.int32)
    new = state.replace(
        turn=turn,
        done=done,
        answered=state.answered | answered,
        correct=state.correct | (answered & (key_idx == task.answer)),
        format_error=state.format_error | is_other | (is_answer & ~answer_ok),
        num_tool_calls=state.num_tool_calls + i32(is_call),
        num_tool_errors=state.num_tool_errors + i32(is_call & ~call_ok),
        num_redundant_calls=state.num_redundant_calls + i32(redundant),
        num_offpath_calls=state.num_offpath_calls + i32(offpath),
        resolved=resolved,
        queried=state.queried | (good & (jnp.arange(NUM_KEYS) == key_idx)),
        tool_call_turn=state.tool_call_turn
        | (is_call & (jnp.arange(self.max_turns) == state.turn)),
        valid_call_turn=state.valid_call_turn
        | (good & (jnp.arange(self.max_turns) == state.turn)),
        progress=common.progress_update(
            state.progress,
            turn,
            active,
            resolved.astype(jnp.float32) / jnp.maximum(task.hops, 1),
        ),
    )
    return new, obs.astype(jnp.int32), obs_len.astype(jnp.int32), done

  def gold_answer(self, task: KVChainTask):
    """int32 [3] `ANSWER letter ANSWER_END` and its length (3)."""
    return common.wrapped(
        tok.ANSWER, tok.ANSWER_END, [_letter(task.answer)], self.max_answer_len
    )

  def facts(self, state: KVChainState) -> dict[str, jax.Array]:
    """Verifiable facts (listed in the module docstring)."""
    gold, gold_len = self.gold_answer(state.task)
    return {
        "correct": state.correct,
        "answered": state.answered,
        "format_error": state.format_error,
        "num_tool_calls": state.num_tool_calls,
        "num_tool_errors": state.num_tool_errors,
        "num_redundant_calls": state.num_redundant_calls,
        "num_offpath_calls": state.num_offpath_calls,
        "hops": state.task.hops,
        "hard": state.task.hops >= 2,
        "tool_necessary": jnp.ones((), bool),
        "tool_call_turn": state.tool_call_turn,
        "valid_call_turn": state.valid_call_turn,
        "progress": state.progress,
        "gold_answer": gold,
        "gold_answer_len": gold_len,
    }

  def expert_action(self, state: KVChainState, key: jax.Array):
    """The demonstrator's next turn.

    With hops left it calls get(path[resolved]); with all d hops resolved it
    answers path[d]. Imperfections, each drawn per turn from `key`: with
    expert_undercall_prob it answers path[resolved] at once (wrong unless all hops
    are resolved); with expert_overcall_prob (only after a first call) it re-queries
    path[resolved - 1] (redundant); with expert_wrong_arg_prob it queries the
    distractor key.

    Returns:
      action_tokens int32 [A] (then PAD), action_len int32 [].
    """
    task = state.task
    u = jax.random.uniform(key, (3,))
    left = state.resolved < task.hops
    cur = task.path[jnp.clip(state.resolved, 0, task.path.shape[0] - 1)]
    prev = task.path[jnp.clip(state.resolved - 1, 0, task.path.shape[0] - 1)]
    under = left & (u[0] < self.expert_undercall_prob)
    over = left & (state.resolved > 0) & (u[1] < self.expert_overcall_prob)
    wrong = left & (u[2] < self.expert_wrong_arg_prob)
    arg = jnp.where(over, prev, jnp.where(wrong, task.distractor, cur))
    call, call_len = common.wrapped(
        tok.CALL, tok.CALL_END, [_letter(arg)], self.max_action_len
    )
    ans, ans_len = common.wrapped(
        tok.ANSWER, tok.ANSWER_END, [_letter(cur)], self.max_action_len
    )
    use_tool = left & ~under
    return (
        jnp.where(use_tool, call, ans).astype(jnp.int32),
        jnp.where(use_tool, call_len, ans_len).astype(jnp.int32),
    )
