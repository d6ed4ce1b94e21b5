"""experiments/hlo_identity.py: the canonical text (locations dropped, private
functions renamed by definition order) and the comparison of records, on
hand-made module texts and on a tiny jitted function (no model)."""

import jax
import jax.numpy as jnp

from experiments import hlo_identity as hi

_MODULE = """module @jit_step attributes {mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<f32> loc("x")) -> tensor<f32> {
    %0 = call @_where_3(%arg0) : (tensor<f32>) -> tensor<f32> loc(#loc1)
    %1 = call @clip(%0) : (tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
  func.func private @_where_3(%arg0: tensor<f32>) -> tensor<f32> {
    return %arg0 : tensor<f32> loc(callsite("a"("f.py":1:2) at "b"))
  }
  func.func private @clip(%arg0: tensor<f32>) -> tensor<f32> {
    return %arg0 : tensor<f32>
  }
}
#loc1 = loc("y")
"""


def test_canonical_text_drops_locations_and_renames_private_functions():
  text, names = hi.canonical_text(_MODULE)
  assert names == ["_where_3", "clip"]
  assert "loc" not in text
  assert "@fn0" in text and "@fn1" in text and "@main" in text
  assert "_where" not in text and "@clip" not in text
  # Renaming only: another suffix of the same functions gives the same text.
  other, _ = hi.canonical_text(_MODULE.replace("_where_3", "_where_7"))
  assert other == text
  # A call to another function is not a renaming.
  called = _MODULE.replace("call @clip(%0)", "call @_where_3(%0)")
  assert hi.canonical_text(called)[0] != text


def _record(fn, *args):
  raw = jax.jit(fn).lower(*args).as_text()
  text, names = hi.canonical_text(raw)
  return {
      "sha256": hi.sha256(text),
      "raw_sha256": hi.sha256(raw),
      "private_functions": names,
      "text": text,
  }


def test_compare_finds_float_order_and_accepts_the_same_program():
  x = jnp.ones(3)
  a = _record(lambda v: (v * 2.0) * 3.0, x)
  same = _record(lambda v: (v * 2.0) * 3.0, x)
  other = _record(lambda v: v * (2.0 * 3.0), x)
  assert hi.compare("v", a, same) == ("identical", "")
  status, detail = hi.compare("v", a, other)
  assert status == "DIFFERENT" and detail.startswith("--- ref")
  assert hi.compare("v", None, a)[0] == "NO-REF"
  assert hi.compare("v", {"skipped": "x"}, a)[0] == "SKIPPED"
  assert hi.compare("v", a, {"error": "Traceback\nBoom"}) == ("ERROR", "Boom")
