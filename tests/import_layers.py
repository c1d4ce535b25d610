"""jaxsim's import layers: which module may import which (tests/test_layers.py, scripts/check_layers.py).

Every module under ``jaxsim/`` belongs to one layer (the longest entry of :data:`LAYERS` that is it or a
package above it; the bare ``jaxsim`` entry places only the root package) and may import only modules of its
own or a lower layer. Imports are read from the source with ``ast``: module level, inside functions and under
``TYPE_CHECKING`` alike; ``from package import name`` counts as importing ``package.name`` when that is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYER_NAMES = ("profile I/O", "rules", "kernels", "deploy", "sweep / replay", "CLI")

LAYERS: dict[str, int] = {
    # 0. profile I/O and the ground floor: errors, ranges, schemas, bundled data, profiles, acceptance presets
    "jaxsim": 0,
    "jaxsim._lazy": 0,
    "jaxsim.errors": 0,
    "jaxsim.limits": 0,
    "jaxsim.schema": 0,
    "jaxsim.outputs": 0,
    "jaxsim.systems": 0,
    "jaxsim.cost": 0,
    "jaxsim.progress": 0,
    "jaxsim.acceptance": 0,
    "jaxsim.fields": 0,
    "jaxsim.arrow_values": 0,
    "jaxsim.cache_trust": 0,
    "jaxsim.environment": 0,
    "jaxsim.query_files": 0,
    "jaxsim.data": 0,
    "jaxsim.profile": 0,
    # 1. rules, plain Python: what is decided before anything compiles
    "jaxsim.rules": 1,
    "jaxsim.sla": 1,
    "jaxsim.stats": 1,
    "jaxsim.overhead": 1,
    "jaxsim.router": 1,
    # 2. compiled kernels and the JAX set-up
    "jaxsim._jax": 2,
    "jaxsim.devices": 2,
    "jaxsim.kernels": 2,
    # 3. assembled above the kernels: deployment bindings; importers (profiles checked through the kernels)
    "jaxsim.deploy": 3,
    "jaxsim.importers": 3,
    # 4. sweep / replay and what orchestrates or presents the kernels
    "jaxsim.sweep": 4,
    "jaxsim.replay": 4,
    "jaxsim.calibrate": 4,
    "jaxsim.accuracy": 4,
    "jaxsim.plots": 4,
    "jaxsim.round_queries": 4,
    # 5. the command line
    "jaxsim.cli": 5,
    "jaxsim.__main__": 5,
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under ``jaxsim/`` by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for p in sorted((root / "jaxsim").rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def layer_of(module: str) -> int | None:
    """The layer of a jaxsim module; None when :data:`LAYERS` does not place it."""
    name = module
    while True:
        if name in LAYERS and (name != "jaxsim" or module == "jaxsim"):
            return LAYERS[name]
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]


def _imported(module: str, is_package: bool, tree: ast.AST, known) -> tuple[set[str], set[str]]:
    """(jaxsim modules, top-level names of other modules) that ``tree`` imports anywhere."""
    ours, others = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for n in names:
            if n == "jaxsim" or n.startswith("jaxsim."):
                ours.add(n)
            else:
                others.add(n.split(".")[0])
    return ours, others


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(jaxsim imports, third-party/standard imports) of every jaxsim module."""
    mods = modules(root)
    graph, external = {}, {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name], external[name] = _imported(name, path.name == "__init__.py", tree, mods)
        graph[name].discard(name)
    return graph, external


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer (or of a module no layer places), one line each."""
    out = []
    for mod in sorted(graph):
        lm = layer_of(mod)
        for dep in sorted(graph[mod]):
            ld = layer_of(dep)
            if lm is None or ld is None or ld > lm:
                out.append(f"{mod} (layer {lm}) imports {dep} (layer {ld})")
    return out


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    """The jaxsim modules reachable from ``start`` and the modules of its package (``start`` included)."""
    seen, todo = set(), [m for m in graph if m == start or m.startswith(start + ".")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return seen
