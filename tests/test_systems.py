"""Bundled GPU spec sheets (aisimulate + aiconfigurator-core, Apache-2.0) and ``jaxsim profiles systems``."""

from __future__ import annotations

import json
from importlib import resources

from typer.testing import CliRunner

from jaxsim import systems
from jaxsim.cli.main import app

runner = CliRunner()
FROM_AICONFIGURATOR = ("a100_pcie", "a30", "b200_sxm", "gb200", "gb300", "h100_pcie", "l4", "l40s", "rtx_pro_6000_server")


def test_every_sheet_has_a_recorded_source_and_a_licence_file():
    root = resources.files("jaxsim.data").joinpath("systems")
    names = systems.list_systems()
    assert set(FROM_AICONFIGURATOR) | {"h200_sxm", "b300_sxm", "a100_sxm", "h100_sxm"} <= set(names)
    for name in names:
        src = systems.system_source(name)
        assert src["source"] in ("aisimulate", "aiconfigurator-core 0.12.0"), name
        assert root.joinpath(src["licence"]).is_file() and "Apache License" in root.joinpath(src["licence"]).read_text()
        assert systems.gpu_memory_bytes(name) > 8 * 2**30 and systems.memory_bandwidth_bytes_per_s(name) > 1e11
    for name in FROM_AICONFIGURATOR:
        assert systems.system_source(name)["source"].startswith("aiconfigurator-core")
    # values as published: B200 180 GiB HBM3e at 7.7 TB/s; L4 24 GiB at 300 GB/s
    assert abs(systems.gpu_memory_bytes("b200_sxm") / 2**30 - 180) < 1
    assert systems.memory_bandwidth_bytes_per_s("l4") == 300e9


def test_profiles_systems_lists_them():
    r = runner.invoke(app, ["profiles", "systems", "--json"])
    assert r.exit_code == 0, r.output
    items = {s["system"]: s for s in json.loads(r.output)}
    assert set(items) == set(systems.list_systems())
    assert items["gb300"]["gpus_per_node"] == 4 and items["h200_sxm"]["source"] == "aisimulate"
    r = runner.invoke(app, ["profiles", "systems"])
    assert r.exit_code == 0 and "rtx_pro_6000_server" in r.output and "not measurements" in r.output
