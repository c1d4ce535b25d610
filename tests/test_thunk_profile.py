"""scripts/thunk_profile.py: thunks counted from JAX's profiler and attributed to the loops of the optimized HLO."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
from jax._src.lib import _profiler

_SPEC = importlib.util.spec_from_file_location("thunk_profile", Path(__file__).resolve().parents[1] / "scripts" / "thunk_profile.py")
tp = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(tp)


def test_a_loop_body_is_attributed_its_iterations():
    """A program whose loop runs ``n`` iterations: the table gives its body ``n`` iterations, and the body's thunks
    ``n`` times its thunks per iteration."""

    def f(x, n):
        return jax.lax.fori_loop(0, n, lambda i, x: jnp.sin(x) + x[::-1] * 2.0, x)

    compiled = jax.jit(f).lower(jnp.ones(64), 7).compile()
    x = jnp.ones(64)
    compiled(x, 7).block_until_ready()
    rows = {}
    for n in (7, 19):
        session = _profiler.ProfilerSession()
        compiled(x, n).block_until_ready()
        counts = tp.thunk_counts(session.stop())
        table = tp.loop_table(counts, compiled.as_text(), top=10)
        body = [line for line in table[2:] if line.split("|")[1].strip().endswith(".body")]
        assert len(body) == 1, table
        _, where, thunks, width, iterations, _ = body[0].split("|")
        assert where.strip().startswith("while") and int(iterations.replace(",", "")) == n
        assert int(thunks.replace(",", "")) == n * int(width)
        rows[n] = int(width)
    assert rows[7] == rows[19] >= 1


def test_fused_computations_are_one_thunk():
    """Instructions inside a fusion are not thunks: only the fusion instruction's computation is counted."""
    text = """HloModule m

%fused_computation (p: f64[4]) -> f64[4] {
  %p = f64[4]{0} parameter(0)
  ROOT %s = f64[4]{0} sine(%p)
}

ENTRY %main (a: f64[4]) -> f64[4] {
  %a = f64[4]{0} parameter(0)
  ROOT %fusion = f64[4]{0} fusion(%a), kind=kLoop, calls=%fused_computation
}
"""
    owner, parent, fused = tp.hlo_loops(text)
    assert fused == {"fused_computation"} and owner["fusion"] == "main" and owner["s"] == "fused_computation"
    table = tp.loop_table({"fusion": 3, "s": 3}, text, top=5)
    assert table[2:] == ["| (entry) | 3 | 1 | 3 |"]
