"""``jaxsim profiles``: list, show and validate measured (and derived) FPM profiles."""

from __future__ import annotations

import json

import typer

from jaxsim.cli.common import EXIT_INVALID, console, fail, guarded

LIST_HELP = """List the profiles bundled with jaxsim: name, model, system, tensor-parallel sizes and data source.

Every profile says what its numbers are (data_source): "measured" profiles come from real forward-pass logs or
planner sweeps; "derived" ones are computed from measured tables by a documented model; "modelled" ones are
priced by an op-level model (jaxsim import op-model); "calibrated" ones are a modelled surface corrected to
measured passes. Provenance says how.

Examples:

  jaxsim profiles list

  jaxsim profiles list --json
"""

SYSTEMS_HELP = """List the GPU spec sheets bundled with jaxsim (usable as `system` in configs and by `jaxsim import
op-model`): memory, bandwidth, tensor-core FLOPS, node layout and where each sheet comes from (aisimulate or
aiconfigurator-core, NVIDIA, Apache-2.0). Spec-sheet values, not measurements.

Examples:

  jaxsim profiles systems

  jaxsim profiles systems --json
"""

SHOW_HELP = """Show a profile (bundled name or directory): identity, resources, measured support per deployment
(decode batches and total-KV range, prefill batches and tokens), provenance and licence.

Examples:

  jaxsim profiles show qwen3-32b-bf16-b300

  jaxsim profiles show ./my-profile --json
"""

VALIDATE_HELP = """Validate a profile directory (or bundled name): the profile JSON, the table sidecar and rows, that
every deployment matches genuine decode and prefill rows, and that its memory is physically possible: the KV pool
plus the rank's weights and overheads (when memory.json states them) fit the GPU at the recorded
gpu_memory_utilization (gpu-memory-fit), and the pool holds one max_model_len request (kv-pool-holds-request).
Exit 0 when valid, 2 with one line per problem otherwise.

Examples:

  jaxsim profiles validate ./my-profile

  jaxsim profiles validate qwen3-32b-bf16-b300-eagle3-k3
"""


def _bundled_entry(name_or_path: str):
    from jaxsim.data.registry import list_bundled

    for p in list_bundled():
        if p.name == name_or_path:
            return p
    return None


def _range(a) -> list[int] | None:
    return None if len(a) == 0 else [int(min(a)), int(max(a))]


def describe_profile(name_or_path: str) -> dict:
    """A JSON-ready description of a profile directory or bundled profile."""
    from jaxsim.data.registry import resolve_profile
    from jaxsim.errors import TableError
    from jaxsim.profile import load_profile_dir
    from jaxsim.profile.memory_breakdown import deployment_key, load_memory_breakdown

    entry = _bundled_entry(name_or_path)
    path = resolve_profile(name_or_path)
    bundle = load_profile_dir(path)
    prof = bundle.profile
    memory = load_memory_breakdown(path)
    deps = []
    for d in prof.deployments:
        res = d.resources
        rm = res.runtime_memory
        item = {
            "identity": d.describe(),
            "system": d.system, "backend": d.backend, "backend_version": d.backend_version, "tp": d.tp, "dp": d.dp,
            "moe_tp": d.moe_tp, "moe_ep": d.moe_ep, "worker_type": d.worker_type,
            "precision": {"gemm": d.gemm_quant_mode, "moe": d.moe_quant_mode, "fmha": d.fmha_quant_mode,
                          "comm": d.comm_quant_mode, "kv_cache": d.kv_cache_dtype},
            "execution_profile": None if d.execution_profile is None else d.execution_profile.to_dict(),
            "memory": (memory or {}).get(deployment_key(d)),
            "resources": {
                "cache_layout": res.cache_layout, "memory_source": res.memory_source,
                "kv_bytes_per_token": res.kv_bytes_per_token, "cache_groups": [g.to_dict() for g in res.cache_groups],
                "kv_cache_bytes": None if rm is None else rm.kv_cache_bytes,
                "kv_cache_tokens": None if rm is None or not res.kv_bytes_per_token else rm.kv_cache_bytes // res.kv_bytes_per_token,
                "gpu_memory_utilization": None if rm is None else rm.gpu_memory_utilization,
                "max_model_len": None if rm is None else rm.max_model_len,
                "max_num_batched_tokens": res.max_num_tokens, "max_num_seqs": res.max_batch_size,
                "provenance": res.provenance,
            },
        }
        try:
            cell = bundle.cell(d)
            item["support"] = {
                "decode_rows": cell.num_decode_rows,
                "decode_batches": sorted({int(b) for b in cell.decode_batch}),
                "decode_kv_range": _range(cell.decode_kv),
                "prefill_rows": cell.num_prefill_rows,
                "prefill_batches": sorted({int(b) for b in cell.prefill_batch}),
                "prefill_token_range": _range(cell.prefill_tokens),
                "prefill_kv_range": _range(cell.prefill_kv),
            }
        except TableError as e:
            item["support"] = {"error": str(e)}
        deps.append(item)
    return {
        "name": entry.name if entry else None,
        "path": str(path),
        "kind": entry.kind if entry else None,
        "data_source": prof.source,
        "model": prof.model, "model_revision": prof.model_revision, "architecture": prof.architecture,
        "context_length": prof.context_length, "num_experts": prof.num_experts,
        "measurement_policy": bundle.table.measurement_policy,
        "provenance": prof.provenance,
        "licence": entry.licence if entry else "not recorded: see the provenance and the data's own licence",
        "calibration": _calibration(path),
        "deployments": deps,
    }


def _calibration(path) -> dict | None:
    """A calibrated profile's held-out verdict from its calibration.json (one report, or one per deployment):
    the threshold and the weak phases (held-out median |error| above it) of each report."""
    from pathlib import Path

    p = Path(path) / "calibration.json"
    if not p.is_file():
        return None
    from jaxsim.calibrate import WEAK_PHASE_APE_PCT, weak_phases

    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return {"error": f"{p}: {' '.join(str(e).split())}"}
    reports = {"": doc} if isinstance(doc, dict) and "held_out" in doc else {k: v for k, v in doc.items() if isinstance(v, dict)}
    weak = {k: weak_phases(v.get("held_out") or {}) for k, v in reports.items()}
    return {"weak_phase_threshold_pct": WEAK_PHASE_APE_PCT, "weak_phases": {k: v for k, v in weak.items() if v}}


def _fmt_range(r) -> str:
    return "-" if not r else f"{r[0]:,} .. {r[1]:,}"


def _fmt_batches(bs: list[int]) -> str:
    if not bs:
        return "-"
    if bs == list(range(bs[0], bs[-1] + 1)) and len(bs) > 2:
        return f"{bs[0]}..{bs[-1]} (all)"
    return ", ".join(map(str, bs)) if len(bs) <= 12 else f"{', '.join(map(str, bs[:6]))}, ... {bs[-1]} ({len(bs)})"


def _fmt_pool(r: dict, memory: dict | None) -> str:
    """The KV pool: bytes, and tokens x bytes per token (linear) or the groups (grouped); the rank's other bytes."""
    if r["kv_cache_bytes"] is None:
        return "-"
    out = f"{r['kv_cache_bytes'] / 2**30:,.1f} GiB"
    if r["cache_layout"] == "linear":
        out += f" = {r['kv_cache_tokens']:,} tok x {r['kv_bytes_per_token']:,} B"
    else:
        def group(g: dict) -> str:
            if g["kind"] == "convolution" and r["max_model_len"] and g["block_size_tokens"] >= r["max_model_len"]:
                return f"{g['name']} {g['page_size_bytes']:,} B/sequence"  # one page per sequence: a recurrent state
            return (f"{g['name']} {g['page_size_bytes']:,} B/{g['block_size_tokens']:,} tok"
                    + (f" window {g['sliding_window']:,}" if g.get("sliding_window") else ""))

        out += " grouped: " + ", ".join(group(g) for g in r["cache_groups"])
    out += f" (gmu {r['gpu_memory_utilization']:g})"
    if memory:
        out += f"; weights {memory['weights_bytes'] / 2**30:,.1f} GiB of {memory['gpu_memory_bytes'] / 2**30:,.0f} GiB"
    return out


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="List, show and validate FPM profiles (bundled or on disk).", no_args_is_help=True)
    app.add_typer(group, name="profiles")

    @group.command("list", help=LIST_HELP)
    @guarded
    def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print a JSON array.")) -> None:
        from jaxsim.data.registry import list_bundled

        items = list_bundled()
        if as_json:
            typer.echo(json.dumps([p.to_dict() for p in items], indent=1))
            return
        from rich.table import Table

        t = Table(title="Bundled profiles")
        t.add_column("name", no_wrap=True)
        for col in ("model", "system", "TP", "data source", "K"):
            t.add_column(col)
        for p in items:
            kind = p.kind if p.kind == "measured" else f"[bold yellow]{p.kind}[/]"
            t.add_row(p.name, p.model, p.system, ",".join(map(str, p.tps)), kind, str(p.num_draft_tokens or "-"))
        console().print(t)

    @group.command("systems", help=SYSTEMS_HELP)
    @guarded
    def systems_cmd(as_json: bool = typer.Option(False, "--json", help="Print a JSON array.")) -> None:
        from jaxsim.systems import describe_systems

        items = describe_systems()
        if as_json:
            typer.echo(json.dumps(items, indent=1))
            return
        from rich.table import Table

        t = Table(title="GPU spec sheets (spec-sheet values, not measurements)")
        for col in ("system", "memory GiB", "HBM TB/s", "BF16 TFLOPS", "FP8 TFLOPS", "GPUs/node", "intra-node GB/s", "source"):
            t.add_column(col, justify="left" if col in ("system", "source") else "right", no_wrap=col == "system")
        for s in items:
            t.add_row(
                s["system"],
                f"{s['gpu_memory_bytes'] / 2**30:,.0f}",
                f"{s['memory_bandwidth_bytes_per_s'] / 1e12:.2f}",
                f"{s['bfloat16_tc_flops'] / 1e12:,.0f}",
                f"{s['fp8_tc_flops'] / 1e12:,.0f}" if s["fp8_tc_flops"] else "-",
                str(s["gpus_per_node"]),
                f"{s['intra_node_bytes_per_s'] / 1e9:,.0f}",
                s["source"],
            )
        console().print(t)
        console().print("Licences and attribution: jaxsim/data/systems/README.md")

    @group.command("presets", help="List the bundled speculative-decoding acceptance presets: the names a deployment config's "
                   "acceptance_preset or a sweep's [speculation] acceptance takes, with their measured acceptance.\n\n"
                   "Example:\n\n  jaxsim profiles presets")
    @guarded
    def presets_cmd(as_json: bool = typer.Option(False, "--json", help="Print a JSON array.")) -> None:
        from dataclasses import asdict

        from jaxsim.acceptance import list_presets

        items = list_presets()
        if as_json:
            typer.echo(json.dumps([asdict(p) for p in items], indent=1))
            return
        from rich.table import Table


        t = Table(title="acceptance presets (per-position acceptance measured on the named dataset; conditional rates derived)")
        for col in ("name", "method", "target", "draft tokens", "dataset", "mean accepted length", "conditional rates"):
            t.add_column(col, no_wrap=col == "name", justify="right" if col in ("draft tokens", "mean accepted length") else "left")
        for p in items:
            t.add_row(p.name, p.method, p.target_model, str(p.num_spec_tokens), p.dataset, f"{p.mean_acceptance_length:.2f}",
                      "/".join(f"{r:.2f}" for r in p.conditional_rates))
        console().print(t)
        console().print("Sources and licences: jaxsim/data/ATTRIBUTION.md")

    @group.command("show", help=SHOW_HELP)
    @guarded
    def show_cmd(
        profile: str = typer.Argument(..., help="Bundled profile name or profile directory."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        info = describe_profile(profile)
        if as_json:
            typer.echo(json.dumps(info, indent=1))
            return
        from rich.table import Table

        con = console()
        title = info["name"] or info["path"]
        con.print(f"[bold]{title}[/] (data source: {info['data_source']})")
        con.print(f"model {info['model']} @ {info['model_revision']} ({info['architecture']}, context {info['context_length']:,}, "
                  f"{'dense' if not info['num_experts'] else str(info['num_experts']) + ' experts'}); policy {info['measurement_policy']}")
        t = Table(title="Deployments")
        for col in ("deployment", "precision", "K", "KV pool", "envelope", "decode support", "prefill support"):
            t.add_column(col)
        for d in info["deployments"]:
            r, s = d["resources"], d["support"]
            env = f"{r['max_num_batched_tokens']:,} tok / {r['max_num_seqs']:,} seqs"
            k = str(d["execution_profile"]["num_draft_tokens"]) if d["execution_profile"] else "-"
            p = d["precision"]
            prec = f"gemm {p['gemm']}" + (f" / moe {p['moe']}" if info["num_experts"] else "") + f" / attn {p['fmha']} / kv {p['kv_cache']}"
            if "error" in s:
                dec = pre = s["error"]
            else:
                dec = f"b {_fmt_batches(s['decode_batches'])}; KV {_fmt_range(s['decode_kv_range'])} ({s['decode_rows']} rows)"
                pre = f"b {_fmt_batches(s['prefill_batches'])}; tokens {_fmt_range(s['prefill_token_range'])} ({s['prefill_rows']} rows)"
            layout = f"TP{d['tp']}" + (f" DP{d['dp']}" if d["dp"] != 1 else "") + (
                f" (moe_tp {d['moe_tp']} x moe_ep {d['moe_ep']})" if info["num_experts"] else "")
            t.add_row(f"{d['system']} {d['backend']} {d['backend_version']} {layout}", prec, k, _fmt_pool(r, d["memory"]), env, dec, pre)
        con.print(t)
        weak = (info.get("calibration") or {}).get("weak_phases")
        if weak:
            what = "; ".join(f"{k + ': ' if k else ''}{', '.join(f'{ph} {v:.1f} %' for ph, v in w.items())}" for k, w in weak.items())
            con.print(f"[bold red]Weak calibration:[/] held-out median |error| above "
                      f"{info['calibration']['weak_phase_threshold_pct']:g} % ({what})")
        con.print(f"[bold]Provenance:[/] {info['provenance']}")
        con.print(f"[bold]Licence:[/] {info['licence']}")

    @group.command("validate", help=VALIDATE_HELP)
    def validate_cmd(profile: str = typer.Argument(..., help="Profile directory or bundled profile name.")) -> None:
        from jaxsim.data.registry import resolve_profile
        from jaxsim.errors import JaxsimError
        from jaxsim.profile import validate_profile_dir

        try:
            path = resolve_profile(profile)
        except JaxsimError as e:
            fail(str(e))
        from jaxsim.rules.memory_fit import profile_dir_memory_problems

        problems = validate_profile_dir(path) + profile_dir_memory_problems(path)
        if problems:
            for line in problems:
                typer.echo(" ".join(str(line).split()))
            typer.echo(f"error: {len(problems)} problem(s) in {path}", err=True)
            raise typer.Exit(EXIT_INVALID)
        typer.echo(f"{path}: ok")
