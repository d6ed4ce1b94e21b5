"""Schema calls: typed function calling with several valid call paths (JAX-native).

The prompt lists the tools' typed schemas, an optional constraint and a query, an
expression tree of d binary operations (d in [min_depth, max_depth], up to 6):

  BOS "add(a:int,b:int)\n" "sum(x:int,y:int)\n" "mul(a:int,b:int)\n"
      "sub(a:int,b:int)\n" ["Never call sum.\n"] "Q: ((3+4)*5)-2\n" PAD...

Tool catalogue (the first `num_tools` are offered; all parameters are int):

  add(a:int,b:int) = a+b     sum(x:int,y:int) = x+y   (equivalent tools)
  mul(a:int,b:int) = a*b     sub(a:int,b:int) = a-b
  max(a:int,b:int)           min(a:int,b:int)

A call is `CALL name(p=v,p=v) CALL_END` with v a decimal int (optionally negative,
up to 7 digits), e.g. `CALL sum(x=4,y=3) CALL_END`; the observation is
`OBS <value> OBS_END`, or `OBS "error" OBS_END` when the call does not execute
(malformed, unknown tool, wrong parameter names, a forbidden tool). The final
answer is `ANSWER <int> ANSWER_END`.

Valid call paths. A tree node is *ready* when its children are resolved (leaves are
constants). A call *resolves* a ready node when the tool implements the node's
operation (add and sum both implement +), its parameter names are the tool's
schema names, and its values are the children's values, in either order when the
operation is commutative (+ * max min). Tasks with two independent sub-expressions
("branch" tasks, (x0 o x1) o (x2 o x3) ...) can be resolved in either order. Every
valid path gets the same facts.

Per-turn facts ([K], False / 0 on turns that are not calls), scored against the
best-matching ready node (the gold call is that node with the called tool when the
tool implements the node's operation, else the canonical tool of the operation):
  call_format_ok        the call parses (name, parentheses, 1..3 `p=int` slots)
  call_schema_ok        it names an offered tool with exactly that tool's
                        parameter names, int values (adherence to the called
                        tool's own schema; no reference call involved)
  call_name_ok          the tool implements a ready node's operation
  call_param_names_ok   the parameter names are exactly the gold tool's names
  call_param_names_frac Jaccard |given & gold| / |given | gold| of parameter names
  call_param_values_ok  every gold parameter has the node's value (some valid order)
  call_param_values_frac fraction of gold parameters with the right value
  call_exec_ok          the tool executed (format, known tool, its names, allowed)
  call_forbidden        the call names the forbidden tool (a constraint violation)
  call_resolves         the call resolved a ready node
  call_ref_match        the call at turn k equals the reference call k: the
                        canonical reference trajectory resolves node k at turn k
                        with the canonical tool of its operation (add for +,
                        never `sum`) and values in schema order (a = left, b =
                        right). Valid alternatives (sum, swapped commutative
                        values, the other order of independent sub-expressions)
                        do NOT match; used by reference-trajectory-matching
                        rewards (call_rewards.ref_match_reward, TIER TIER
                        baseline).
Per-episode facts: 'correct', 'answered', 'format_error', 'num_tool_calls',
'num_tool_errors' (calls that did not execute), 'num_redundant_calls' (executed
calls that resolve no ready node but match an already-resolved node),
'num_forbidden_calls', 'has_constraint' (the prompt forbids a tool),
'num_nodes' (d), 'nodes_resolved', 'hard' (d >= 2),
'tool_necessary' (True: the query asks for the tools), 'tool_call_turn' [K],
'progress' [K + 1] (nodes resolved / d after each turn), 'gold_answer' [Ag],
'gold_answer_len'.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from agentic_text import tokenizers as tok
from environments import common

# Operations.
OP_ADD, OP_MUL, OP_SUB, OP_MAX, OP_MIN = 0, 1, 2, 3, 4
OP_CHARS = ("+", "*", "-", ">", "<")  # query rendering (> max, < min)
COMMUTATIVE = (True, True, False, True, True)
# Tool catalogue: name, operation, parameter names (one letter each).
TOOLS = (
    ("add", OP_ADD, "ab"),
    ("sum", OP_ADD, "xy"),
    ("mul", OP_MUL, "ab"),
    ("sub", OP_SUB, "ab"),
    ("max", OP_MAX, "ab"),
    ("min", OP_MIN, "ab"),
)
_NAME_IDS = np.array(
    [[ord(c) for c in t[0]] for t in TOOLS], np.int32
)  # [T, 3]
_TOOL_OP = np.array([t[1] for t in TOOLS], np.int32)
_TOOL_PARAMS = np.array(
    [[ord(c) for c in t[2]] for t in TOOLS], np.int32
)  # [T, 2]
# Canonical tool of each operation.
_CANON = np.array([0, 2, 3, 4, 5], np.int32)
_MAX_VALUE_DIGITS = 7
_MAX_SLOTS = 3


def _tool_schema_bytes(t: int) -> tuple[int, ...]:
  name, _, params = TOOLS[t]
  return tuple(f"{name}({params[0]}:int,{params[1]}:int)\n".encode())


def _apply(op, a, b):
  return jnp.select(
      [op == OP_ADD, op == OP_MUL, op == OP_SUB, op == OP_MAX],
      [a + b, a * b, a - b, jnp.maximum(a, b)],
      jnp.minimum(a, b),
  )


@flax.struct.dataclass
class SchemaTask:
  """One task (or a batch with a leading dim n; D = max_depth).

  Attributes:
    depth: int32 []; d, the number of operation nodes (nodes d..D-1 are unused).
    branch: bool []; nodes 0 and 1 are independent leaves-only nodes and node 2
      combines them (needs d >= 3); else a left-associated chain.
    op: int32 [D]; each node's operation.
    leaf: int32 [D + 1]; the constants x0..xD in query order.
    left_ref, right_ref: int32 [D]; child node index, or -1 for a constant.
    left_const, right_const: int32 [D]; the constant (when the ref is -1).
    value: int32 [D]; each node's value.
    answer: int32 []; the root's value (node d - 1).
    forbidden: int32 []; index of the forbidden tool, or -1 (no constraint).
  """

  depth: jax.Array
  branch: jax.Array
  op: jax.Array
  leaf: jax.Array
  left_ref: jax.Array
  right_ref: jax.Array
  left_const: jax.Array
  right_const: jax.Array
  value: jax.Array
  answer: jax.Array
  forbidden: jax.Array


@flax.struct.dataclass
class SchemaState:
  """Unbatched episode state (K = max_turns, D = max_depth); fields as in facts."""

  task: SchemaTask
  turn: jax.Array
  done: jax.Array
  answered: jax.Array
  correct: jax.Array
  format_error: jax.Array
  num_tool_calls: jax.Array
  num_tool_errors: jax.Array
  num_redundant_calls: jax.Array
  num_forbidden_calls: jax.Array
  resolved: jax.Array  # bool [D]
  last_call: jax.Array  # int32 [3]: tool, value a, value b of the last call
  tool_call_turn: jax.Array
  progress: jax.Array
  per_turn: dict  # name -> [K] arrays (the call_* facts)


_PER_TURN = (
    "call_format_ok",
    "call_schema_ok",
    "call_name_ok",
    "call_param_names_ok",
    "call_param_names_frac",
    "call_param_values_ok",
    "call_param_values_frac",
    "call_exec_ok",
    "call_forbidden",
    "call_resolves",
    "call_ref_match",
)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _make_tasks(
    key,
    n: int,
    min_depth: int,
    max_depth: int,
    num_tools: int,
    branch_prob: jax.Array,
    forbid_prob: jax.Array,
) -> SchemaTask:
  """Draws n tasks; static sizes, one jitted program."""
  ops_offered = np.unique(_TOOL_OP[:num_tools])

  def one(k):
    kd, kb, ko, kx, kf = jax.random.split(k, 5)
    d = jax.random.randint(kd, (), min_depth, max_depth + 1)
    branch = (d >= 3) & (jax.random.uniform(kb) < branch_prob)
    op = jnp.asarray(ops_offered)[
        jax.random.randint(ko, (max_depth,), 0, len(ops_offered))
    ]
    leaf = jax.random.randint(kx, (max_depth + 1,), 0, 10)
    i = jnp.arange(max_depth)
    # Chain: node i = node(i-1) o x_{i+1}. Branch: node0 = x0 o x1,
    # node1 = x2 o x3, node2 = node0 o node1, node i>2 = node(i-1) o x_{i+1}.
    left_ref = jnp.where(i == 0, -1, i - 1)
    right_ref = jnp.full((max_depth,), -1)
    left_ref = jnp.where(branch & (i == 1), -1, left_ref)
    left_ref = jnp.where(branch & (i == 2), 0, left_ref)
    right_ref = jnp.where(branch & (i == 2), 1, right_ref)
    left_const = jnp.where(i == 0, leaf[0], 0)
    left_const = jnp.where(branch & (i == 1), leaf[2], left_const)
    right_const = jnp.where(
        branch & (i == 1), leaf[3], leaf[jnp.minimum(i + 1, max_depth)]
    )
    # Branch tasks use x_{i+1} for nodes i > 2 too (x4..); node 2 has no constant.

    def body(vals, j):
      lv = jnp.where(
          left_ref[j] >= 0, vals[jnp.maximum(left_ref[j], 0)], left_const[j]
      )
      rv = jnp.where(
          right_ref[j] >= 0, vals[jnp.maximum(right_ref[j], 0)], right_const[j]
      )
      return vals.at[j].set(_apply(op[j], lv, rv)), None

    value, _ = jax.lax.scan(body, jnp.zeros((max_depth,), jnp.int32), i)
    adds = [t for t in range(num_tools) if _TOOL_OP[t] == OP_ADD]
    forbidden = jnp.int32(-1)
    if len(adds) == 2:  # only an equivalent tool may be forbidden
      forbidden = jnp.where(
          jax.random.uniform(kf) < forbid_prob, jnp.int32(adds[1]), -1
      )
    return SchemaTask(
        depth=d.astype(jnp.int32),
        branch=branch,
        op=op.astype(jnp.int32),
        leaf=leaf.astype(jnp.int32),
        left_ref=left_ref.astype(jnp.int32),
        right_ref=right_ref.astype(jnp.int32),
        left_const=left_const.astype(jnp.int32),
        right_const=right_const.astype(jnp.int32),
        value=value,
        answer=value[d - 1],
        forbidden=forbidden,
    )

  return jax.vmap(one)(jax.random.split(key, n))


def _parse_int(tokens, start, end):
  """[-]digits in tokens[start:end] -> (value int32, ok bool)."""
  neg = tokens[jnp.clip(start, 0, tokens.shape[0] - 1)] == common.MINUS
  s = start + neg.astype(jnp.int32)
  mag, ok = common.parse_uint(tokens, s, end, _MAX_VALUE_DIGITS)
  return jnp.where(neg, -mag, mag).astype(jnp.int32), ok


@dataclasses.dataclass(frozen=True)
class SchemaCallsEnv:
  """Typed function calling over an expression tree (see module docstring).

  Attributes:
    max_prompt_len: P (checked against the longest prompt).
    max_action_len: A (>= 26: CALL "sub(a=-123456,b=-123456)" CALL_END).
    max_obs_len: O (>= 10).
    max_turns: K (>= max_depth + 1).
    num_tools: tools offered, the first num_tools of TOOLS (2..6; >= 2 so that
      add and sum are both offered).
    min_depth, max_depth: range of d (1 <= min_depth <= max_depth <= 6).
    branch_prob: probability that a task with d >= 3 has two independent
      sub-expressions (two valid call orders).
    forbid_prob: probability that the prompt forbids `sum` (then only `add` is
      valid for +).
    expert_overcall_prob: per expert call after the first, probability of
      repeating its previous call (redundant).
    expert_undercall_prob: per episode (drawn at turn 0), probability of
      answering at once, without calls.
    expert_wrong_arg_prob: per expert call, probability that its second value is
      off by one.
    expert_wrong_name_prob: per expert call, probability of calling `mul` for
      a + node or `add` otherwise (a wrong tool).
    expert_violation_prob: per expert call on a + node of a task that forbids
      `sum`, probability of calling `sum` anyway (a constraint violation; 0 =
      the expert always obeys, the old behaviour).
  """

  max_prompt_len: int = 104
  max_action_len: int = 28
  max_obs_len: int = 12
  max_turns: int = 5
  num_tools: int = 4
  min_depth: int = 1
  max_depth: int = 3
  branch_prob: float = 0.5
  forbid_prob: float = 0.25
  expert_overcall_prob: float = 0.0
  expert_undercall_prob: float = 0.0
  expert_wrong_arg_prob: float = 0.0
  expert_wrong_name_prob: float = 0.0
  expert_violation_prob: float = 0.0

  def __post_init__(self):
    if not 2 <= self.num_tools <= len(TOOLS):
      raise ValueError(
          f"num_tools must be in [2, {len(TOOLS)}], got {self.num_tools}"
      )
    if not 1 <= self.min_depth <= self.max_depth <= 6:
      raise ValueError(
          "min_depth/max_depth: need 1 <= min_depth <= max_depth <= 6, got min_depth="
          f"{self.min_depth}, max_depth={self.max_depth}"
      )
    if self.max_prompt_len < self.prompt_len_needed:
      raise ValueError(
          f"max_prompt_len must be >= {self.prompt_len_needed}, got "
          f"{self.max_prompt_len}"
      )
    if self.max_action_len < 26:
      raise ValueError(
          f"max_action_len must be >= 26, got {self.max_action_len}"
      )
    if self.max_obs_len < 10:
      raise ValueError(f"max_obs_len must be >= 10, got {self.max_obs_len}")
    if self.max_turns < self.max_depth + 1:
      raise ValueError(
          f"max_turns must be >= max_depth + 1 = {self.max_depth + 1},"
          f" got {self.max_turns}"
      )
    common.check_probabilities(
        self,
        (
            "branch_prob",
            "forbid_prob",
            "expert_overcall_prob",
            "expert_undercall_prob",
            "expert_wrong_arg_prob",
            "expert_wrong_name_prob",
            "expert_violation_prob",
        ),
    )

  @property
  def prompt_len_needed(self) -> int:
    """Longest prompt: BOS, schemas, constraint, "Q: " + expression + "\\n"."""
    schemas = sum(len(_tool_schema_bytes(t)) for t in range(self.num_tools))
    expr = (self.max_depth + 1) + self.max_depth + 2 * self.max_depth + 2
    return 1 + schemas + len(b"Never call sum.\n") + 3 + expr + 1

  @property
  def max_answer_len(self) -> int:
    """Ag: ANSWER, sign, up to 10 digits, ANSWER_END."""
    return 13

  def sample_tasks(self, key, n: int) -> SchemaTask:
    """n i.i.d. tasks (leading dim n)."""
    return _make_tasks(
        key,
        n,
        self.min_depth,
        self.max_depth,
        self.num_tools,
        jnp.float32(self.branch_prob),
        jnp.float32(self.forbid_prob),
    )

  def eval_tasks(self, n: int, seed: int) -> SchemaTask:
    """A fixed held-out set, deterministic in (n, seed)."""
    return self.sample_tasks(jax.random.key(seed), n)

  # ------------------------------------------------------------------ rendering

  def _expr_pieces(self, task: SchemaTask):
    """Masked pieces of the query expression for both templates, selected by
    task.branch (static layout for max_depth, kept by d)."""
    d, D = task.depth, self.max_depth
    c = common.const_piece
    opb = lambda j: (
        jnp.asarray([ord(ch) for ch in OP_CHARS], jnp.int32)[
            task.op[j]
        ].reshape(1),
        jnp.ones((1,), bool),
    )
    leaf = lambda j: (
        jnp.reshape(common.ZERO + task.leaf[j], (1,)),
        jnp.ones((1,), bool),
    )

    def keep(piece, k):
      return piece[0], piece[1] & k

    # Chain: '('*(d-1) x0 o0 x1 { ')' o_j x_{j+1} } for j < d.
    chain = [
        (
            jnp.full((max(D - 1, 1),), ord("("), jnp.int32),
            jnp.arange(max(D - 1, 1)) < d - 1,
        ),
        leaf(0),
        opb(0),
        leaf(1),
    ]
    for j in range(1, D):
      chain += [
          keep(c([ord(")")]), j < d),
          keep(opb(j), j < d),
          keep(leaf(j + 1), j < d),
      ]
    # Branch (d >= 3): '('*(d-3) '(' x0 o0 x1 ')' o2 '(' x2 o1 x3 ')'
    # { ')' o_j x_{j+1} } for 3 <= j < d.
    br = [
        (
            jnp.full((max(D - 3, 1),), ord("("), jnp.int32),
            jnp.arange(max(D - 3, 1)) < d - 3,
        ),
        c([ord("(")]),
        leaf(0),
        opb(0),
        leaf(1),
        c([ord(")")]),
    ]
    if D >= 3:
      br += [opb(2), c([ord("(")]), leaf(2), opb(1), leaf(3), c([ord(")")])]
    for j in range(3, D):
      br += [
          keep(c([ord(")")]), j < d),
          keep(opb(j), j < d),
          keep(leaf(j + 1), j < d),
      ]
    return chain, br

  def reset(self, task: SchemaTask):
    """Starts an episode.

    Returns:
      state; prompt_tokens int32 [P]; prompt_len int32 [].
    """
    c = common.const_piece
    head = [c([tok.BOS])]
    for t in range(self.num_tools):
      head.append(c(_tool_schema_bytes(t)))
    rule = tuple(b"Never call sum.\n")
    head.append(
        (
            jnp.asarray(rule, jnp.int32),
            jnp.full((len(rule),), task.forbidden >= 0),
        )
    )
    head.append(c(tuple(b"Q: ")))
    chain, br = self._expr_pieces(task)
    tail = [c(tuple(b"\n"))]
    p_chain, l_chain = common.assemble(head + chain + tail, self.max_prompt_len)
    p_br, l_br = common.assemble(head + br + tail, self.max_prompt_len)
    prompt = jnp.where(task.branch, p_br, p_chain)
    prompt_len = jnp.where(task.branch, l_br, l_chain)
    k, d = self.max_turns, self.max_depth
    z, f = jnp.zeros((), jnp.int32), jnp.zeros((), bool)
    per_turn = {
        name: jnp.zeros((k,), jnp.float32 if name.endswith("frac") else bool)
        for name in _PER_TURN
    }
    state = SchemaState(
        task=task,
        turn=z,
        done=f,
        answered=f,
        correct=f,
        format_error=f,
        num_tool_calls=z,
        num_tool_errors=z,
        num_redundant_calls=z,
        num_forbidden_calls=z,
        resolved=jnp.zeros((d,), bool),
        last_call=jnp.full((3,), -1, jnp.int32),
        tool_call_turn=jnp.zeros((k,), bool),
        progress=jnp.zeros((k + 1,), jnp.float32),
        per_turn=per_turn,
    )
    return state, prompt.astype(jnp.int32), prompt_len.astype(jnp.int32)

  # -------------------------------------------------------------------- parsing

  def _parse_call(self, tokens, length):
    """Parses `CALL name(p=v,...) CALL_END`.

    Returns:
      dict with format_ok bool [], tool int32 [] (-1 unknown), names int32 [3]
      (parameter-name bytes, -1 for absent slots), values int32 [3],
      num_slots int32 [].
    """
    a = tokens.shape[0]
    pos = jnp.arange(a)
    lp = 4  # CALL + 3-letter name
    name = tokens[1:4]
    tool_match = jnp.all(
        name[None, :] == jnp.asarray(_NAME_IDS[: self.num_tools]), 1
    )
    tool = jnp.where(jnp.any(tool_match), jnp.argmax(tool_match), -1)
    rp = length - 2  # ')' before CALL_END
    shape_ok = (
        (length >= 8)
        & (tokens[lp] == ord("("))
        & (tokens[jnp.clip(rp, 0, a - 1)] == ord(")"))
        & (tokens[jnp.clip(length - 1, 0, a - 1)] == tok.CALL_END)
        & (tokens[0] == tok.CALL)
    )
    inside = (pos > lp) & (pos < rp)
    commas = inside & (tokens == ord(","))
    num_commas = jnp.sum(commas)
    cpos = jnp.nonzero(commas, size=_MAX_SLOTS - 1, fill_value=rp)[0]
    starts = jnp.concatenate([jnp.array([lp + 1]), cpos + 1])
    ends = jnp.concatenate([cpos, jnp.array([rp])])
    slot_used = jnp.arange(_MAX_SLOTS) <= num_commas
    names, values, oks = [], [], []
    for s in range(_MAX_SLOTS):
      st, en = starts[s], ends[s]
      nm = tokens[jnp.clip(st, 0, a - 1)]
      eq = tokens[jnp.clip(st + 1, 0, a - 1)] == ord("=")
      is_letter = (nm >= ord("a")) & (nm <= ord("z"))
      v, vok = _parse_int(tokens, st + 2, en)
      oks.append(is_letter & eq & vok)
      names.append(jnp.where(slot_used[s], nm, -1))
      values.append(v)
    names = jnp.stack(names)
    oks = jnp.stack(oks)
    # Duplicate parameter names are malformed.
    dup = jnp.any(
        (names[:, None] == names[None, :])
        & (names[:, None] >= 0)
        & ~jnp.eye(_MAX_SLOTS, dtype=bool)
    )
    format_ok = (
        shape_ok
        & (tool >= 0)
        & (num_commas <= _MAX_SLOTS - 1)
        & jnp.all(oks | ~slot_used)
        & ~dup
    )
    return dict(
        format_ok=format_ok,
        tool=tool.astype(jnp.int32),
        names=names,
        values=jnp.stack(values),
        num_slots=num_commas + 1,
    )

  def _score_node(self, parsed, task, resolved, node):
    """Scores the parsed call against one node (all jnp)."""
    tool = jnp.maximum(parsed["tool"], 0)
    node_op = task.op[node]
    implements = (parsed["tool"] >= 0) & (
        jnp.asarray(_TOOL_OP)[tool] == node_op
    )
    gold_tool = jnp.where(implements, tool, jnp.asarray(_CANON)[node_op])
    gold_names = jnp.asarray(_TOOL_PARAMS)[gold_tool]  # [2]
    given = parsed["names"]  # [3], -1 absent
    in_gold = jnp.any(given[:, None] == gold_names[None, :], 1) & (given >= 0)
    inter = jnp.sum(in_gold)
    union = jnp.sum(given >= 0) + 2 - inter
    names_frac = inter / jnp.maximum(union, 1)
    names_ok = (inter == 2) & (jnp.sum(given >= 0) == 2)
    lref, rref = task.left_ref[node], task.right_ref[node]
    lv = jnp.where(
        lref >= 0, task.value[jnp.maximum(lref, 0)], task.left_const[node]
    )
    rv = jnp.where(
        rref >= 0, task.value[jnp.maximum(rref, 0)], task.right_const[node]
    )

    def given_value(pname):
      hit = given == pname
      return jnp.any(hit), jnp.sum(jnp.where(hit, parsed["values"], 0))

    h0, v0 = given_value(gold_names[0])
    h1, v1 = given_value(gold_names[1])
    straight = (h0 & (v0 == lv)).astype(jnp.float32) + (h1 & (v1 == rv))
    swapped = (h0 & (v0 == rv)).astype(jnp.float32) + (h1 & (v1 == lv))
    comm = jnp.asarray(COMMUTATIVE)[node_op]
    hits = jnp.where(comm, jnp.maximum(straight, swapped), straight)
    values_frac = hits / 2.0
    ready = ~resolved[node] & (node < task.depth)
    ready &= (lref < 0) | resolved[jnp.maximum(lref, 0)]
    ready &= (rref < 0) | resolved[jnp.maximum(rref, 0)]
    exact = parsed["format_ok"] & implements & names_ok & (hits == 2)
    return dict(
        implements=implements,
        names_ok=names_ok,
        names_frac=names_frac,
        values_ok=hits == 2,
        values_frac=values_frac,
        ready=ready,
        exact=exact,
        done_node=resolved[node] & (node < task.depth),
    )

  def step(self, state: SchemaState, action_tokens, action_len):
    """Applies one assistant turn (rules in the module docstring).

    Returns:
      (state, obs_tokens int32 [O], obs_len int32 [], done bool []).
    """
    tokens, length, first, last, stopped = common.turn_frame(
        action_tokens, action_len
    )
    task = state.task
    active = ~state.done
    is_call = active & stopped & (first == tok.CALL)
    is_answer = active & stopped & (first == tok.ANSWER)
    is_other = active & ~is_call & ~is_answer

    parsed = self._parse_call(tokens, length)
    nodes = jnp.arange(self.max_depth)
    sc = jax.vmap(lambda i: self._score_node(parsed, task, state.resolved, i))(
        nodes
    )
    # Best ready node: exact match first, then name, names, values.
    score = (
        sc["exact"] * 8.0
        + sc["implements"] * 4.0
        + sc["names_frac"]
        + sc["values_frac"]
    ) * sc["ready"] - (~sc["ready"]) * 100.0
    best = jnp.argmax(score)
    any_ready = jnp.any(sc["ready"])
    pick = (
        lambda k: sc[k][best] & any_ready
        if sc[k].dtype == bool
        else jnp.where(any_ready, sc[k][best], 0.0)
    )

    tool = parsed["tool"]
    forbidden = parsed["format_ok"] & (tool >= 0) & (tool == task.forbidden)
    own_names = jnp.asarray(_TOOL_PARAMS)[jnp.maximum(tool, 0)]
    own_ok = (
        (parsed["num_slots"] == 2)
        & (parsed["names"][0] >= 0)
        & jnp.all(jnp.sort(parsed["names"][:2]) == jnp.sort(own_names))
        & (parsed["names"][2] < 0)
    )
    exec_ok = parsed["format_ok"] & own_ok & ~forbidden
    # Arguments in schema order.
    arg = lambda p: jnp.sum(
        jnp.where(parsed["names"] == p, parsed["values"], 0)
    )
    result = _apply(
        jnp.asarray(_TOOL_OP)[jnp.maximum(tool, 0)],
        arg(own_names[0]),
        arg(own_names[1]),
    )
    va, vb = arg(own_names[0]), arg(own_names[1])
    # Values have <= 7 digits, so only a product can overflow int32.
    overflow = (jnp.asarray(_TOOL_OP)[jnp.maximum(tool, 0)] == OP_MUL) & (
        jnp.abs(va) > (2**31 - 1) // jnp.maximum(jnp.abs(vb), 1)
    )
    fits = (jnp.abs(result) < 10 ** min(self.max_obs_len - 3, 9)) & ~overflow
    exec_ok &= fits
    resolves = is_call & exec_ok & pick("exact")
    redundant = (
        is_call
        & exec_ok
        & ~resolves
        & jnp.any(
            sc["exact"]
            | (
                sc["done_node"]
                & sc["implements"]
                & sc["names_ok"]
                & sc["values_ok"]
            )
        )
    )
    # Note: `exact` requires `ready`-independent matching; a resolved node is
    # matched through done_node above.
    resolved = state.resolved | (resolves & (nodes == best))

    obs_ok, len_ok = common.wrapped(
        tok.OBS, tok.OBS_END, [common.int_piece(result)], self.max_obs_len
    )
    obs_err, len_err = common.error_obs(self.max_obs_len)
    obs = jnp.where(is_call, jnp.where(exec_ok, obs_ok, obs_err), tok.PAD)
    obs_len = jnp.where(is_call, jnp.where(exec_ok, len_ok, len_err), 0)

    # Reference trajectory: call k resolves node k with the canonical tool of
    # its operation, values in schema order (module docstring).
    k_ref = jnp.clip(state.turn, 0, self.max_depth - 1)
    ref_l = jnp.where(
        task.left_ref[k_ref] >= 0,
        task.value[jnp.maximum(task.left_ref[k_ref], 0)],
        task.left_const[k_ref],
    )
    ref_r = jnp.where(
        task.right_ref[k_ref] >= 0,
        task.value[jnp.maximum(task.right_ref[k_ref], 0)],
        task.right_const[k_ref],
    )
    ref_match = (
        is_call
        & parsed["format_ok"]
        & own_ok
        & (state.turn < task.depth)
        & (tool == jnp.asarray(_CANON)[task.op[k_ref]])
        & (va == ref_l)
        & (vb == ref_r)
    )

    ans, ans_ok = _parse_int(tokens, 1, length - 1)
    ans_ok &= (length >= 3) & (last == tok.ANSWER_END)
    answered = is_answer & ans_ok
    turn = state.turn + active.astype(jnp.int32)
    done = state.done | is_answer | is_other | (turn >= self.max_turns)
    at = (jnp.arange(self.max_turns) == state.turn) & is_call
    fmt = parsed["format_ok"]
    values = {
        "call_format_ok": fmt,
        "call_schema_ok": fmt & own_ok,
        "call_name_ok": fmt & pick("implements"),
        "call_param_names_ok": fmt & pick("names_ok"),
        "call_param_names_frac": jnp.where(fmt, pick("names_frac"), 0.0),
        "call_param_values_ok": fmt & pick("values_ok"),
        "call_param_values_frac": jnp.where(fmt, pick("values_frac"), 0.0),
        "call_exec_ok": exec_ok,
        "call_forbidden": forbidden,
        "call_resolves": resolves,
        "call_ref_match": ref_match,
    }
    per_turn = {
        k: jnp.where(
            at,
            jnp.asarray(values[k], state.per_turn[k].dtype),
            state.per_turn[k],
        )
        for k in _PER_TURN
    }
    i32 = lambda b: b.astype(jnp.int32)
    nres = jnp.sum(resolved & (nodes < task.depth))
    new = state.replace(
        turn=turn,
        done=done,
        answered=state.answered | answered,
        correct=state.correct | (answered & (ans == task.answer)),
        format_error=state.format_error | is_other | (is_answer & ~ans_ok),
        num_tool_calls=state.num_tool_calls + i32(is_call),
        num_tool_errors=state.num_tool_errors + i32(is_call & ~exec_ok),
        num_redundant_calls=state.num_redundant_calls + i32(redundant),
        num_forbidden_calls=state.num_forbidden_calls
        + i32(is_call & forbidden),
        resolved=resolved,
        last_call=jnp.where(
            is_call,
            jnp.stack([tool, arg(own_names[0]), arg(own_names[1])]),
            state.last_call,
        ).astype(jnp.int32),
        tool_call_turn=state.tool_call_turn | at,
        progress=common.progress_update(
            state.progress, turn, active, nres / jnp.maximum(task.depth, 1)
        ),
        per_turn=per_turn,
    )
    return new, obs.astype(jnp.int32), obs_len.astype(jnp.int32), done

  def gold_answer(self, task: SchemaTask):
    """int32 [Ag] `ANSWER <answer> ANSWER_END` (PAD-filled) and its length."""
    return common.wrapped(
        tok.ANSWER,
        tok.ANSWER_END,
        [common.int_piece(task.answer)],
        self.max_answer_len,
    )

  def facts(self, state: SchemaState) -> dict[str, jax.Array]:
    """Verifiable facts (listed in the module docstring)."""
    gold, gold_len = self.gold_answer(state.task)
    d = state.task.depth
    out = {
        "correct": state.correct,
        "answered": state.answered,
        "format_error": state.format_error,
        "num_tool_calls": state.num_tool_calls,
        "num_tool_errors": state.num_tool_errors,
        "num_redundant_calls": state.num_redundant_calls,
        "num_forbidden_calls": state.num_forbidden_calls,
        "has_constraint": state.task.forbidden >= 0,
        "num_nodes": d,
        "nodes_resolved": jnp.sum(
            state.resolved & (jnp.arange(self.max_depth) < d)
        ).astype(jnp.int32),
        "hard": d >= 2,
        "tool_necessary": jnp.ones((), bool),
        "tool_call_turn": state.tool_call_turn,
        "progress": state.progress,
        "gold_answer": gold,
        "gold_answer_len": gold_len,
    }
    out.update(state.per_turn)
    return out

  def expert_action(self, state: SchemaState, key):
    """The demonstrator's next turn.

    It resolves the lowest-index ready node with a valid call: the canonical tool
    of its operation, except that a + node uses `sum` (x, y) instead of `add` with
    probability 1/2 unless `sum` is forbidden, and a commutative node's values are
    swapped with probability 1/2 (so demonstrations cover every valid path). After
    all nodes are resolved it answers the root value. Imperfections (see the class
    attributes): under-calling (answer at turn 0), over-calling (repeat the
    previous call), wrong argument (second value + 1), wrong tool name, and
    constraint violation (`sum` on a + node although forbidden).

    Returns:
      action_tokens int32 [A] (then PAD), action_len int32 [].
    """
    task = state.task
    u = jax.random.uniform(key, (6,))
    nodes = jnp.arange(self.max_depth)
    lref, rref = task.left_ref, task.right_ref
    ready = (
        ~state.resolved
        & (nodes < task.depth)
        & ((lref < 0) | state.resolved[jnp.maximum(lref, 0)])
        & ((rref < 0) | state.resolved[jnp.maximum(rref, 0)])
    )
    node = jnp.argmax(ready)
    any_ready = jnp.any(ready)
    op = task.op[node]
    lv = jnp.where(
        lref[node] >= 0,
        task.value[jnp.maximum(lref[node], 0)],
        task.left_const[node],
    )
    rv = jnp.where(
        rref[node] >= 0,
        task.value[jnp.maximum(rref[node], 0)],
        task.right_const[node],
    )
    # A separate draw, so the old draws (u) are unchanged.
    violate = (task.forbidden == 1) & (
        jax.random.uniform(jax.random.fold_in(key, 7))
        < self.expert_violation_prob
    )
    use_sum = (
        (op == OP_ADD)
        & (((u[0] < 0.5) & (task.forbidden != 1)) | violate)
        & (self.num_tools >= 2)
    )
    tool = jnp.where(use_sum, 1, jnp.asarray(_CANON)[op])
    wrong_name = u[4] < self.expert_wrong_name_prob
    tool = jnp.where(wrong_name, jnp.where(op == OP_ADD, 2, 0), tool)
    swap = jnp.asarray(COMMUTATIVE)[op] & (u[1] < 0.5)
    a_val, b_val = jnp.where(swap, rv, lv), jnp.where(swap, lv, rv)
    b_val = b_val + (u[2] < self.expert_wrong_arg_prob).astype(jnp.int32)
    repeat = (
        (state.num_tool_calls > 0)
        & (u[3] < self.expert_overcall_prob)
        & any_ready
    )
    tool = jnp.where(repeat, state.last_call[0], tool)
    a_val = jnp.where(repeat, state.last_call[1], a_val)
    b_val = jnp.where(repeat, state.last_call[2], b_val)
    names = jnp.asarray(_TOOL_PARAMS)[jnp.clip(tool, 0, len(TOOLS) - 1)]
    c = common.const_piece
    name_piece = (
        jnp.asarray(_NAME_IDS)[jnp.clip(tool, 0, len(TOOLS) - 1)],
        jnp.ones((3,), bool),
    )
    call, call_len = common.wrapped(
        tok.CALL,
        tok.CALL_END,
        [
            name_piece,
            c([ord("(")]),
            (names[:1], jnp.ones((1,), bool)),
            c([ord("=")]),
            common.int_piece(a_val),
            c([ord(",")]),
            (names[1:], jnp.ones((1,), bool)),
            c([ord("=")]),
            common.int_piece(b_val),
            c([ord(")")]),
        ],
        self.max_action_len,
    )
    ans, ans_len = common.wrapped(
        tok.ANSWER,
        tok.ANSWER_END,
        [common.int_piece(task.answer)],
        self.max_action_len,
    )
    under = (state.turn == 0) & (u[5] < self.expert_undercall_prob)
    use_tool = (
        any_ready & ~under & ~((state.turn > 0) & (state.num_tool_calls == 0))
    )
    return (
        jnp.where(use_tool, call, ans).astype(jnp.int32),
        jnp.where(use_tool, call_len, ans_len).astype(jnp.int32),
    )
