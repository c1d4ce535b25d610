"""Import layers: every jaxsim module imports only its own or lower layers (the table is in
tests/import_layers.py: profile I/O → rules → kernels → deploy → sweep / replay → CLI), and validation (rules)
reaches no kernels and no JAX."""

from __future__ import annotations

import import_layers as L

JAX = {"jax", "jaxlib", "equinox", "jaxtyping"}


def test_every_module_has_a_layer():
    graph, _ = L.import_graph()
    assert [m for m in graph if L.layer_of(m) is None] == []


def test_no_module_imports_a_higher_layer():
    graph, _ = L.import_graph()
    assert L.upward_imports(graph) == []


def test_rules_import_no_kernels_and_no_jax():
    graph, external = L.import_graph()
    reach = L.closure(graph, "jaxsim.rules")
    assert not any(m == "jaxsim.kernels" or m.startswith("jaxsim.kernels.") for m in reach), sorted(reach)
    assert {m for m in reach if m.startswith("jaxsim.")} <= {m for m in reach if L.layer_of(m) <= L.LAYERS["jaxsim.rules"]}
    assert {m: sorted(external[m] & JAX) for m in reach if external[m] & JAX} == {}


def test_kernels_import_no_rules():
    """rules/ and kernels/ do not import each other: host-side assembly that needs both lives in deploy/."""
    graph, _ = L.import_graph()
    kernels = [m for m in graph if m == "jaxsim.kernels" or m.startswith("jaxsim.kernels.")]
    assert {m: sorted(d for d in graph[m] if d == "jaxsim.rules" or d.startswith("jaxsim.rules."))
            for m in kernels if any(d == "jaxsim.rules" or d.startswith("jaxsim.rules.") for d in graph[m])} == {}


def test_the_checker_sees_every_kind_of_import(tmp_path):
    """An upward import at module level, in a function, under TYPE_CHECKING or as ``from package import
    module`` is reported (the check can fail)."""
    pkg = tmp_path / "jaxsim"
    for sub in ("rules", "kernels", "deploy"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "kernels" / "rounds.py").write_text("import numpy\n")
    bad = {
        "a.py": "from jaxsim.kernels.rounds import x\n",
        "b.py": "def f():\n    import jaxsim.kernels.rounds\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jaxsim.deploy import binding\n",
        "d.py": "from jaxsim.kernels import rounds\n",
        "e.py": "from ..kernels import rounds\n",
    }
    for name, text in bad.items():
        (pkg / "rules" / name).write_text(text)
    (pkg / "rules" / "ok.py").write_text("import math\nfrom jaxsim import errors\n")
    graph, external = L.import_graph(tmp_path)
    found = L.upward_imports(graph)
    assert sorted(line.split()[0] for line in found) == [f"jaxsim.rules.{n[0]}" for n in sorted(bad)]
    assert "jaxsim.rules.d (layer 1) imports jaxsim.kernels.rounds (layer 2)" in found
    assert graph["jaxsim.rules.c"] == {"jaxsim.deploy"} and graph["jaxsim.rules.ok"] == {"jaxsim.errors"}
    assert external["jaxsim.rules.ok"] == {"math"} and external["jaxsim.rules.c"] == {"typing"}
    assert L.closure(graph, "jaxsim.rules") >= {"jaxsim.kernels.rounds"}


def test_layer_table_names_only_existing_modules():
    mods = set(L.modules())
    assert [k for k in L.LAYERS if k not in mods] == []


def test_no_library_function_is_longer_than_100_lines():
    """Issue 22: long functions read as named steps. Outside the CLI's command registrations (Typer's
    signatures are long by nature) no function of the package spans more than 100 lines."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "jaxsim"
    long = []
    for path in sorted(pkg.rglob("*.py")):
        if path.parent.name == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100:
                long.append(f"{path.relative_to(pkg.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
