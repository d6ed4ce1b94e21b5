"""The project's module import graph has no cycle and respects the layers.

The graph is read from the source with `ast` (no module is imported): every
`import` and `from ... import` statement anywhere in a file, including those
inside functions and under `if TYPE_CHECKING:` (an annotation-only import is
still a dependency: a cycle through one is a cycle of the design), is an edge.
`importlib.import_module` calls are not followed.
Layers, lowest first (docs/design.md, "Layers"): a module may import its own
layer and the layers below it, never one above.
"""

import ast
import os

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = (
    "agentic_text",
    "environments",
    "agentic_rl",
    "configs",
    "experiments",
)

# (layer, module-name prefixes), lowest first. A module belongs to the layer of
# its longest matching prefix, so `agentic_rl.learner` also covers a future
# `agentic_rl.learner.collect` when learner.py becomes a package.
LAYERS = (
    ("text", ("agentic_text",)),
    ("environments", ("environments",)),
    ("core", ("agentic_rl",)),
    ("configs", ("configs",)),
    ("validation", ("agentic_rl.validation",)),
    (
        "drivers",
        (
            "agentic_rl.train",
            "agentic_rl.rm_train",
            "agentic_rl.reward_model_loader",
            "agentic_rl.seeds",
            "agentic_rl.workdir_lock",
        ),
    ),
    ("entry points", ("main", "experiments")),
)


def _modules() -> dict[str, str]:
  """{dotted module name: file path} of every .py file of the project."""
  mods = {"main": os.path.join(_ROOT, "main.py")}
  for pkg in _PACKAGES:
    for dirpath, dirnames, filenames in os.walk(os.path.join(_ROOT, pkg)):
      dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
      for f in filenames:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, f), _ROOT)[:-3]
          name = rel.replace(os.sep, ".")
          mods[name.removesuffix(".__init__")] = os.path.join(dirpath, f)
  return mods


def _imports(tree: ast.AST):
  """Every Import / ImportFrom node of the tree, `if TYPE_CHECKING:` included."""
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node


def _owner(name: str, mods) -> str | None:
  """The project module a dotted name refers to (itself or a parent)."""
  while name:
    if name in mods:
      return name
    name = name.rpartition(".")[0]
  return None


def build_graph() -> dict[str, set[str]]:
  """{module: project modules it imports} (self-imports dropped)."""
  mods = _modules()
  graph = {}
  for mod, path in mods.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), filename=path)
    is_pkg = path.endswith("__init__.py")
    deps = set()
    for node in _imports(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      else:
        base = node.module or ""
        if node.level:  # relative import
          parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
          parts = parts[: len(parts) - (node.level - 1)]
          base = ".".join(parts + ([base] if base else []))
        # `from pkg import name`: the submodule pkg.name if there is one.
        targets = [
            f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
            for a in node.names
        ]
      for t in targets:
        owner = _owner(t, mods)
        if owner is not None and owner != mod:
          deps.add(owner)
    graph[mod] = deps
  return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan, 1972)."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def layer_of(module: str) -> int:
  """Index in LAYERS of the layer with the longest prefix matching `module`."""
  best, best_len = None, -1
  for i, (_, prefixes) in enumerate(LAYERS):
    for p in prefixes:
      if (module == p or module.startswith(p + ".")) and len(p) > best_len:
        best, best_len = i, len(p)
  if best is None:
    raise ValueError(f"module {module!r} is in no layer of LAYERS")
  return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
  """'a (layer) -> b (layer)' for every import of a higher layer."""
  bad = []
  for a, deps in sorted(graph.items()):
    for b in sorted(deps):
      if layer_of(b) > layer_of(a):
        bad.append(
            f"{a} ({LAYERS[layer_of(a)][0]}) -> "
            f"{b} ({LAYERS[layer_of(b)][0]})"
        )
  return bad


@pytest.fixture(scope="module")
def graph():
  return build_graph()


def test_the_graph_sees_top_level_function_level_and_relative_imports(graph):
  # Top-level imports.
  assert "agentic_text.tokenizers" in graph["environments.arithmetic"]
  assert "agentic_rl.reward_model_loader" in graph["agentic_rl.train"]
  # A function-level import (train.make_env imports the loader lazily).
  assert "agentic_rl.datasets.tasks" in graph["agentic_rl.train"]
  # Every project module is a node and nothing outside the project is one.
  assert {
      "agentic_text.chat",
      "environments.host.bfcl.checker",
      "agentic_rl.learner",
      "configs.default",
      "main",
  } <= set(graph)
  assert not any(
      d.split(".")[0] in ("jax", "flax", "numpy")
      for deps in graph.values()
      for d in deps
  )


def test_imports_under_type_checking_are_edges():
  # An annotation-only import is a dependency too: a cycle through it would
  # be hidden if it were skipped (types.py once imported credit and replay
  # this way, both of which import types).
  tree = ast.parse(
      "from typing import TYPE_CHECKING\n"
      "if TYPE_CHECKING:\n"
      "  from agentic_rl import replay\n"
      "else:\n"
      "  import agentic_rl.credit\n"
  )
  names = {
      n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
      for n in _imports(tree)
  }
  assert names == {"typing", "agentic_rl", "agentic_rl.credit"}


def test_checks_catch_a_cycle_and_an_upward_import():
  # The checks themselves on a hand-made graph: a -> b -> c -> a is one cycle,
  # d -> d is not reported (self-imports are dropped when building), and a
  # text-layer module importing environments is an upward import.
  assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [
      ["a", "b", "c"]
  ]
  assert upward_imports(
      {
          "agentic_text.x": {"environments.y"},
          "environments.y": {"agentic_text.x"},
      }
  ) == ["agentic_text.x (text) -> environments.y (environments)"]
  assert layer_of("agentic_rl.learner.collect") == layer_of("agentic_rl.losses")
  assert layer_of("agentic_rl.validation") > layer_of("configs.default")


def test_no_import_cycles(graph):
  cycles = find_cycles(graph)
  assert not cycles, "import cycles:\n" + "\n".join(
      " <-> ".join(c) for c in cycles
  )


def test_no_layer_imports_a_higher_one(graph):
  bad = upward_imports(graph)
  assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def test_text_and_environments_import_nothing_above_them(graph):
  for mod, deps in graph.items():
    top = mod.split(".")[0]
    if top == "agentic_text":
      assert all(d.startswith("agentic_text") for d in deps), (mod, deps)
    if top == "environments":
      assert all(
          d.split(".")[0] in ("agentic_text", "environments") for d in deps
      ), (mod, deps)
