"""``jaxsim capacity``: KV pool, blocks and max concurrency of a bound deployment."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from jaxsim import limits
from jaxsim.cli.common import console, fail, guarded, paragraphs
from jaxsim.fields import is_int

CAPACITY_HELP = paragraphs("""KV capacity of a deployment config: pool bytes, tokens, blocks, blocks per request and max concurrency, per role.

The recorded runtime pool is used as recorded: tokens = floor(kv_cache_bytes / kv_bytes_per_token), blocks =
floor(tokens / block_size). A request needs ceil((ISL + OSL [+ K + 1 when speculating]) / block_size) blocks; max
concurrency per rank = min(max_num_seqs, blocks / per-request blocks), multiplied by dp x replicas per role. Without
--isl/--osl one request spans the context length.

Examples:

  jaxsim capacity configs/deployment_aggregated.toml --isl 4096 --osl 512

  jaxsim capacity configs/deployment_speculative.toml --json
""")


def capacity_report(path: Path, isl: int | None, osl: int | None) -> dict:
    """Bind ``path`` and return the capacity report (JSON-ready)."""
    from jaxsim.deploy.binding import bind
    from jaxsim.kernels import status
    from jaxsim.rules.config import load_config

    if (isl is None) != (osl is None):
        fail("give both --isl and --osl, or neither")
    if isl is not None:
        limits.check("tokens", isl, "--isl")
        limits.check("tokens", osl, "--osl")
    b = bind(load_config(path))
    if isl is None:
        isl, osl = b.context_length, 0
    elif isl + osl > b.context_length:
        fail(f"--isl {isl:,} + --osl {osl:,} = {isl + osl:,} tokens exceeds the deployment's context length "
             f"{b.context_length:,} ({path}); such a request cannot be served")
    roles = {}
    for name, r in b.roles.items():
        c = r.capacity(isl, osl)
        kv = r.kv
        ranks = r.role.dp * r.role.replicas
        conc = int(c.max_concurrency)
        roles[name] = {
            "profile": str(r.profile_dir),
            "deployment": r.deployment.describe(),
            "speculative": r.is_speculative,
            "num_draft_tokens": r.num_draft_tokens,
            "memory_source": kv.source,
            "kv_cache_bytes": kv.total_kv_size_bytes,
            "usable_kv_bytes": kv.usable_kv_bytes,
            "kv_bytes_per_token": kv.kv_size_per_token_bytes,
            "kv_tokens": kv.total_kv_size_tokens if kv.tolerance_kv_size_tokens is None else kv.tolerance_kv_size_tokens,
            "kv_blocks": kv.num_gpu_blocks,
            "request_blocks": int(c.request_blocks) if int(c.request_blocks) >= 0 else None,
            "request_bytes": int(c.request_bytes),
            "max_num_seqs": r.max_num_seqs,
            "max_num_batched_tokens": r.max_num_batched_tokens,
            "gpu_memory_utilization": r.gpu_memory_utilization,
            "max_concurrency_per_rank": conc,
            "ranks": ranks,
            "max_concurrency": conc * ranks if conc >= 0 else None,
            "status": status.name(int(c.status)),
            "max_measured_decode_batch": int(r.cell.decode_batch.max()) if r.cell.num_decode_rows else None,
        }
    return {
        "config": str(path),
        "mode": b.mode,
        "nextn": b.nextn,
        "block_size": b.block_size,
        "context_length": b.context_length,
        "gpu_memory_bytes": b.gpu_memory_bytes,
        "isl": isl,
        "osl": osl,
        "roles": roles,
    }


def capacity_warnings(rep: dict) -> list[str]:
    """Where a role's KV/seq concurrency per rank exceeds the largest decode batch its profile measured:
    such a batch is a capacity bound only, its round times are outside measured support."""
    out = []
    for name, r in rep["roles"].items():
        top = r["max_measured_decode_batch"]
        conc = r["max_concurrency_per_rank"]
        if name != "prefill" and top is not None and conc is not None and conc > top:
            out.append(f"{name}: max concurrency per rank {conc:,} exceeds the largest measured decode batch {top:,}; "
                       f"timings above batch {top:,} are outside measured support (a sweep or replay refuses them)")
    return out


def _print_table(rep: dict) -> None:
    from rich.table import Table

    t = Table(title=f"KV capacity: {rep['config']} (ISL {rep['isl']} + OSL {rep['osl']}, block {rep['block_size']})")
    t.add_column("quantity")
    for name in rep["roles"]:
        t.add_column(name, justify="right")
    rows = [
        ("deployment", "deployment"),
        ("memory source", "memory_source"),
        ("KV pool bytes", "usable_kv_bytes"),
        ("KV bytes / token", "kv_bytes_per_token"),
        ("KV tokens", "kv_tokens"),
        ("KV blocks", "kv_blocks"),
        ("blocks / request", "request_blocks"),
        ("max_num_seqs", "max_num_seqs"),
        ("max concurrency / rank", "max_concurrency_per_rank"),
        ("ranks (dp x replicas)", "ranks"),
        ("max concurrency", "max_concurrency"),
        ("status", "status"),
        ("largest measured decode batch", "max_measured_decode_batch"),
    ]
    for label, key in rows:
        vals = []
        for r in rep["roles"].values():
            v = r[key]
            vals.append("-" if v is None else f"{v:,}" if is_int(v) else str(v))
        t.add_row(label, *vals)
    console().print(t)


def register(app: typer.Typer) -> None:
    @app.command("capacity", help=CAPACITY_HELP)
    @guarded
    def capacity_cmd(
        config: Path = typer.Argument(..., help="Deployment config file (TOML)."),
        isl: int | None = typer.Option(None, "--isl", help="Input (prompt) length in tokens."),
        osl: int | None = typer.Option(None, "--osl", help="Output length in tokens."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    ) -> None:
        rep = capacity_report(config, isl, osl)
        if as_json:
            typer.echo(json.dumps(rep, indent=1))
        else:
            _print_table(rep)
        for warning in capacity_warnings(rep):
            typer.echo(f"warning: {warning}", err=True)
