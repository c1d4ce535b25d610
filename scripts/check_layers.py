"""Print jaxsim's import graph by layer (the table is tests/import_layers.py; tests/test_layers.py checks it).

    python scripts/check_layers.py          # every module, its layer and what it imports
    python scripts/check_layers.py --short  # one line per layer; exit 1 on any upward import
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import import_layers as L  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="one line per layer")
    args = ap.parse_args()
    graph, _ = L.import_graph()
    for layer, title in enumerate(L.LAYER_NAMES):
        mods = sorted(m for m in graph if L.layer_of(m) == layer)
        print(f"{layer}. {title}: {len(mods)} modules" + (f" ({', '.join(mods)})" if args.short else ""))
        for m in [] if args.short else mods:
            deps = ", ".join(f"{d} [{L.layer_of(d)}]" for d in sorted(graph[m])) or "-"
            print(f"   {m} -> {deps}")
    bad = L.upward_imports(graph)
    for line in bad:
        print("UPWARD:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
