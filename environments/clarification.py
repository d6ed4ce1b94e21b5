"""Clarification: a required argument is missing; an `ask` action gets it from a
rule-based simulated user (JAX-native). Built on the calculator tasks of
environments/arithmetic.py.

With probability missing_prob one operand of `a op b` is withheld and named by its
variable instead ("Compute 483*b.\n" or "Compute a*27.\n"). Actions:

  ask:     CALL "?" <var> CALL_END   -> the user answers by rule:
           the missing variable      -> OBS "b=27" OBS_END
           a variable already given  -> OBS "known" OBS_END (an unneeded ask,
                                        counted as a redundant call)
           anything else after "?"   -> OBS "error" OBS_END (a tool error)
  calc:    CALL <int><op><int> CALL_END  (as in arithmetic; a variable in it is a
           malformed call)
  answer:  ANSWER [-]<digits> ANSWER_END

Facts: 'correct', 'answered', 'format_error', 'num_tool_calls' (asks and calc
calls), 'num_tool_errors', 'num_redundant_calls' (unneeded asks, repeated asks and
repeated identical calc calls), 'num_asks', 'asked' (the missing value was
obtained), 'missing' (an argument was withheld), 'hard' (as in arithmetic),
'tool_necessary' (missing or hard), 'tool_call_turn' [K], 'progress' [K + 1]
((missing value obtained + result observed) / (missing + hard), 0 when nothing is
needed), 'gold_answer' [13], 'gold_answer_len'.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp

from agentic_text import tokenizers as tok
from environments import arithmetic
from environments import common

NONE, MISSING_A, MISSING_B = 0, 1, 2
_KNOWN = tuple(b"known")


@flax.struct.dataclass
class ClarificationTask:
  """The arithmetic task plus `missing` (int32: NONE, MISSING_A or MISSING_B)."""

  arith: arithmetic.ArithmeticTask
  missing: jax.Array


@flax.struct.dataclass
class ClarificationState:
  """Arithmetic state plus ask bookkeeping (all scalars int32/bool)."""

  arith: arithmetic.ArithmeticState
  missing: jax.Array
  asked: jax.Array
  num_asks: jax.Array
  num_ask_redundant: jax.Array
  num_ask_errors: jax.Array
  ask_turns: jax.Array  # bool [K]


@functools.partial(jax.jit, static_argnums=(1,))
def _missing(key, n: int, missing_prob):
  u = jax.random.uniform(jax.random.fold_in(key, 0x636C), (2, n))
  return jnp.where(
      u[0] < missing_prob, jnp.where(u[1] < 0.5, MISSING_A, MISSING_B), NONE
  ).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class ClarificationEnv:
  """Arithmetic with a withheld argument and an `ask` action (module docstring).

  Attributes:
    max_prompt_len, max_action_len, max_obs_len, max_turns: P, A, O, K (as in
      ArithmeticEnv; O >= 10 for "b=<3 digits>").
    hard_fraction: probability that a task is a hard (3-digit x 2-digit) item.
    missing_prob: probability that an operand is withheld.
    expert_undercall_prob: per episode, probability that the expert skips the ask
      (and the calculator) and answers a guess (the task's answer with the missing
      operand read as 0).
    expert_overcall_prob: per episode, probability that the expert asks although
      nothing is missing (asks for "a": an unneeded ask).
    expert_wrong_arg_prob: per calc call, probability that the right operand is
      off by one.
  """

  max_prompt_len: int = 24
  max_action_len: int = 16
  max_obs_len: int = 12
  max_turns: int = 4
  hard_fraction: float = 0.5
  missing_prob: float = 0.5
  expert_undercall_prob: float = 0.0
  expert_overcall_prob: float = 0.0
  expert_wrong_arg_prob: float = 0.0

  def __post_init__(self):
    if self.max_obs_len < 10:
      raise ValueError(f"max_obs_len must be >= 10, got {self.max_obs_len}")
    if self.max_turns < 3:
      raise ValueError(
          f"max_turns must be >= 3 (ask, calc, answer), got "
          f"{self.max_turns}"
      )
    common.check_probabilities(
        self,
        (
            "hard_fraction",
            "missing_prob",
            "expert_undercall_prob",
            "expert_overcall_prob",
            "expert_wrong_arg_prob",
        ),
    )
    object.__setattr__(
        self,
        "_arith",
        arithmetic.ArithmeticEnv(
            max_prompt_len=self.max_prompt_len,
            max_action_len=self.max_action_len,
            max_obs_len=self.max_obs_len,
            max_turns=self.max_turns,
            hard_fraction=self.hard_fraction,
            expert_imperfect_prob=0.0,
        ),
    )

  @property
  def arith(self) -> arithmetic.ArithmeticEnv:
    return self._arith  # pytype: disable=attribute-error

  @property
  def max_answer_len(self) -> int:
    return self.arith.max_answer_len

  def sample_tasks(self, key, n: int) -> ClarificationTask:
    """n i.i.d. tasks (the arithmetic draw plus a folded-off `missing` draw)."""
    return ClarificationTask(
        arith=self.arith.sample_tasks(key, n),
        missing=_missing(key, n, jnp.float32(self.missing_prob)),
    )

  def eval_tasks(self, n: int, seed: int) -> ClarificationTask:
    """Fixed held-out set: arithmetic's eval set plus deterministic `missing`."""
    return ClarificationTask(
        arith=self.arith.eval_tasks(n, seed),
        missing=_missing(
            jax.random.key(seed), n, jnp.float32(self.missing_prob)
        ),
    )

  def reset(self, task: ClarificationTask):
    """Prompt "Compute 483*b.\\n" (or "a*27", or both operands); state."""
    t = task.arith
    var = lambda ch: (jnp.array([ord(ch)], jnp.int32), jnp.ones((1,), bool))
    hide = lambda piece, h: (piece[0], piece[1] & ~h)
    show = lambda piece, s: (piece[0], piece[1] & s)
    ma, mb = task.missing == MISSING_A, task.missing == MISSING_B
    prompt, prompt_len = common.assemble(
        [
            common.const_piece([tok.BOS, *b"Compute "]),
            hide(common.int_piece(t.a), ma),
            show(var("a"), ma),
            common.const_piece(arithmetic._op_byte(t.op)),
            hide(common.int_piece(t.b), mb),
            show(var("b"), mb),
            common.const_piece(tuple(b".\n")),
        ],
        self.max_prompt_len,
    )
    arith_state, _, _ = self.arith.reset(t)
    z, f = jnp.zeros((), jnp.int32), jnp.zeros((), bool)
    return (
        ClarificationState(
            arith=arith_state,
            missing=task.missing,
            asked=f,
            num_asks=z,
            num_ask_redundant=z,
            num_ask_errors=z,
            ask_turns=jnp.zeros((self.max_turns,), bool),
        ),
        prompt,
        prompt_len,
    )

  def step(self, state: ClarificationState, action_tokens, action_len):
    """Applies one turn: asks are answered by the simulated user, everything else
    goes to the arithmetic rules.

    Returns:
      (state, obs_tokens int32 [O], obs_len int32 [], done bool []).
    """
    tokens, length, first, last, stopped = common.turn_frame(
        action_tokens, action_len
    )
    a_state = state.arith
    active = ~a_state.done
    is_ask = active & stopped & (first == tok.CALL) & (tokens[1] == ord("?"))
    var = tokens[2]
    ask_ok = (
        (length == 4)
        & (last == tok.CALL_END)
        & ((var == ord("a")) | (var == ord("b")))
    )
    asks_missing = ask_ok & (
        ((var == ord("a")) & (state.missing == MISSING_A))
        | ((var == ord("b")) & (state.missing == MISSING_B))
    )
    t = a_state.task
    value = jnp.where(var == ord("a"), t.a, t.b)
    reply, reply_len = common.wrapped(
        tok.OBS,
        tok.OBS_END,
        [
            (jnp.stack([var, jnp.int32(ord("="))]), jnp.ones((2,), bool)),
            common.int_piece(value),
        ],
        self.max_obs_len,
    )
    known, known_len = common.wrapped(
        tok.OBS, tok.OBS_END, [common.const_piece(_KNOWN)], self.max_obs_len
    )
    err, err_len = common.error_obs(self.max_obs_len)
    ask_obs = jnp.where(asks_missing, reply, jnp.where(ask_ok, known, err))
    ask_len = jnp.where(
        asks_missing, reply_len, jnp.where(ask_ok, known_len, err_len)
    )

    # Non-ask turns: the arithmetic rules (the hidden operand is still the task's).
    new_a, obs, obs_len, done = self.arith.step(a_state, tokens, length)
    # Ask turns: count as a tool call and a turn in the arithmetic state.
    turn = a_state.turn + 1
    at = jnp.arange(self.max_turns) == a_state.turn
    ask_a = a_state.replace(
        turn=turn,
        done=turn >= self.max_turns,
        num_tool_calls=a_state.num_tool_calls + 1,
        num_tool_errors=a_state.num_tool_errors + (~ask_ok).astype(jnp.int32),
        tool_call_turn=a_state.tool_call_turn | at,
        progress=a_state.progress,
    )
    new_a = jax.tree.map(lambda x, y: jnp.where(is_ask, x, y), ask_a, new_a)
    obs = jnp.where(is_ask, ask_obs, obs).astype(jnp.int32)
    obs_len = jnp.where(is_ask, ask_len, obs_len).astype(jnp.int32)
    done = new_a.done
    asked = state.asked | (is_ask & asks_missing)
    redundant_ask = is_ask & ask_ok & (~asks_missing | state.asked)
    # Progress: (missing value obtained + calculator result observed) / needed.
    missing = state.missing != NONE
    need = missing.astype(jnp.float32) + t.hard.astype(jnp.float32)
    got = asked.astype(jnp.float32) + (t.hard & (new_a.resolved > 0)).astype(
        jnp.float32
    )
    progress = common.progress_update(
        a_state.progress,
        new_a.turn,
        active,
        jnp.where(need > 0, got / jnp.maximum(need, 1), 0.0),
    )
    new_a = new_a.replace(progress=progress)
    new = state.replace(
        arith=new_a,
        asked=asked,
        num_asks=state.num_asks + is_ask.astype(jnp.int32),
        num_ask_redundant=state.num_ask_redundant
        + redundant_ask.astype(jnp.int32),
        num_ask_errors=state.num_ask_errors
        + (is_ask & ~ask_ok).astype(jnp.int32),
        ask_turns=state.ask_turns | (is_ask & at),
    )
    return new, obs, obs_len, done

  def facts(self, state: ClarificationState) -> dict[str, jax.Array]:
    """Verifiable facts (listed in the module docstring)."""
    out = self.arith.facts(state.arith)
    del out["num_noisy_results"]
    missing = state.missing != NONE
    out["num_redundant_calls"] = (
        out["num_redundant_calls"] + state.num_ask_redundant
    )
    out["num_asks"] = state.num_asks
    out["asked"] = state.asked
    out["missing"] = missing
    out["tool_necessary"] = missing | out["hard"]
    return out

  def expert_action(self, state: ClarificationState, key):
    """The demonstrator's next turn.

    If an operand is missing and not yet obtained, it asks for it; then it acts as
    the arithmetic expert with imperfection 0 (calc on hard items, then answer;
    answer directly on easy items). Imperfections (per episode, drawn at turn 0
    from `key` and kept through the episode by re-deriving from the state):
    under-calling answers a guess at turn 0; over-calling asks for "a" at turn 0
    when nothing is missing; a wrong argument adds 1 to the calc call's b.

    Returns:
      action_tokens int32 [A] (then PAD), action_len int32 [].
    """
    a_state = state.arith
    t = a_state.task
    u = jax.random.uniform(key, (3,))
    first = a_state.turn == 0
    under = first & (u[0] < self.expert_undercall_prob)
    over = first & (state.missing == NONE) & (u[1] < self.expert_overcall_prob)
    need_ask = (state.missing != NONE) & ~state.asked
    var = jnp.where(state.missing == MISSING_A, ord("a"), ord("b"))
    var = jnp.where(over, ord("a"), var)
    ask, ask_len = common.wrapped(
        tok.CALL,
        tok.CALL_END,
        [
            (
                jnp.stack([jnp.int32(ord("?")), jnp.int32(var)]),
                jnp.ones((2,), bool),
            )
        ],
        self.max_action_len,
    )
    # The arithmetic expert, at imperfection 0, on a state whose turn counter
    # excludes asks (so "turn 0" means "no calc call yet").
    calls = a_state.num_tool_calls - state.num_asks
    shadow = a_state.replace(turn=calls, num_tool_calls=calls)
    arith_expert = dataclasses.replace(
        self.arith, expert_wrong_arg_prob=self.expert_wrong_arg_prob
    )
    act, act_len = arith_expert.expert_action(
        shadow, jax.random.fold_in(key, 7)
    )
    guess_a = jnp.where(state.missing == MISSING_A, 0, t.a)
    guess_b = jnp.where(state.missing == MISSING_B, 0, t.b)
    guess, guess_len = common.wrapped(
        tok.ANSWER,
        tok.ANSWER_END,
        [common.int_piece(arithmetic._apply_op(guess_a, t.op, guess_b))],
        self.max_action_len,
    )
    use_ask = (need_ask | over) & ~under
    out = jnp.where(use_ask, ask, jnp.where(under, guess, act))
    out_len = jnp.where(use_ask, ask_len, jnp.where(under, guess_len, act_len))
    return out.astype(jnp.int32), out_len.astype(jnp.int32)
