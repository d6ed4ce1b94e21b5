"""Loss mask and reward shaping stages.

`policy_mask` sets the loss mask, `overlong` applies `rl.overlong_mode` to
the mask or the reward.
"""

from __future__ import annotations

from agentic_rl import batch_policies
from agentic_rl.learner import common
from agentic_rl.learner.batch import Rollout


def policy_mask(r: Rollout, *, exclude_tool_free: bool) -> Rollout:
  """Sets the loss mask: the POLICY tokens of the fresh batch.

  Args:
    r: Rollout with traj (role [B, L]; facts 'tool_free' [B] bool when
      exclude_tool_free).
    exclude_tool_free: drop the dual-path tool-free rows from the loss
      (`rl.dual_path_tool_free` > 0 and not `rl.dual_path_train_tool_free`:
      they only measure tool necessity).

  Returns:
    r with mask [B, L] bool.

  Raises:
    KeyError: exclude_tool_free without facts 'tool_free'.
  """
  traj = r.traj
  mask = common.policy_mask(traj)
  if exclude_tool_free:
    # Tool-free episodes only measure tool necessity: no loss on them.
    mask = mask & ~traj.facts["tool_free"][:, None]
  return r.replace(mask=mask)


def overlong(r: Rollout, *, mode: str, overlong_reward: float) -> Rollout:
  """Overlong (TRUNCATED) episodes by `rl.overlong_mode`.

  'none': unchanged; 'mask': their tokens leave the loss mask (DAPO overlong
  filtering); 'reward': their reward becomes `overlong_reward`
  (`batch_policies.apply_overlong`).

  Args:
    r: Rollout with traj (finish [B] int32), reward [B] float32 and mask
      [B, L] bool.
    mode: `rl.overlong_mode`, one of `batch_policies.OVERLONG_MODES`.
    overlong_reward: `rl.overlong_reward`, the reward of mode 'reward'.

  Returns:
    r with reward [B] float32 and mask [B, L] bool.

  Raises:
    ValueError: unknown mode.
  """
  reward, mask = batch_policies.apply_overlong(
      r.reward,
      r.mask,
      r.traj.finish,
      mode,
      overlong_reward,
  )
  return r.replace(reward=reward, mask=mask)
