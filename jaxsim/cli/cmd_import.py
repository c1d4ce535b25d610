"""``jaxsim import``: turn measured forward-pass logs or planner sweeps into FPM profile directories."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from jaxsim.cli.common import guarded, refuse_output_dir

FPM_LOG_HELP = """Import a per-iteration forward-pass log into a profile directory (profile.json + schema-7 table).

LOG is the CSV of aiconfigurator FPM runs (fpm_metrics_detail.csv) or JSONL of Dynamo ForwardPassMetrics.
Decode-only iterations become decode curves (per batch size, binned over total KV, upper median per bin,
outliers and mis-split admission steps dropped); prefill-only iterations become prefill rows; mixed
iterations are kept out of the table. Identity and the runtime KV pool come from the Dynamo model card
(total_kv_blocks x block size x kv_bytes_per_token), the vLLM metadata and options. The scheduler envelope is
the vLLM metadata's, else the model card's: the first the log's passes respect, named in the summary and the
provenance. A recorded KV pool smaller than the KV the log's own passes hold at once is refused (or, with
--widen-kv-pool, widened to that maximum and said so). A model revision is never invented: pass
--model-revision when the files record none. Prints a summary (rows read, used, dropped by reason, curves,
bins, coverage, where the envelope and the pool came from).

Example:

  jaxsim import fpm-log run/fpm_metrics_detail.csv --model-card run/dynamo_model_card_runtime.json
  --vllm-metadata run/vllm_metadata.json --hf-config Qwen3-32B/config.json --system b300_sxm
  --model-revision 9216db5781bf21249d130ec9da846c4624c16137 --output profiles/qwen3-32b-tp1
"""

PLANNER_HELP = """Import Dynamo planner profiling results (prefill.csv TTFT vs ISL, decode.csv ITL vs KV usage and
context) into a profile directory. Decode rows approximate the active batch as round(kv_usage x max_kv /
context) with total KV = batch x context, resampled on power-of-two batches at each measured context; prefill
rows are TTFT at batch 1. The approximation is recorded in the profile's provenance.

Example:

  jaxsim import dynamo-planner H200_TP1P_TP1D --system h200_sxm --backend-version 0.11.0
  --model-revision <40-hex> --architecture LlamaForCausalLM --kv-bytes-per-token 131072
  --gemm-quant-mode fp8 --context-length 16384 --output profiles/llama-8b-h200
"""


OP_MODEL_HELP = """Price a MODELLED profile directory with NVIDIA aiconfigurator's op-level forward-pass model (needs the
optional extra: pip install -e '.\\[opmodel]').

MODEL is a model id whose config ships with aiconfigurator-core (see --list-models), SYSTEM a GPU with op-level
vLLM data (see --list-systems). One deployment per parallel layout: --tp N gives pure tensor parallelism (an MoE
model with moe_tp = N), --layout adds layouts such as tp8:ep8 (attention TP8, experts over 8 GPUs: moe_tp 1 x
moe_ep 8) or tp2:dp2:ep4 (attention data parallelism: a worker of 2 ranks of TP2, 4 GPUs, the experts over all 4;
each rank priced at its own batch, swept as an engine at 1/dp of the worker's clients); a layout the op model
cannot price is refused with its reason. Per layout: decode curves over a batch x
per-request KV grid up to the modelled KV pool / max_model_len, prefill rows for batches 1..--max-prefill-batch
over a new-token x cached-prefix grid up to --max-num-batched-tokens (chunked prefill with prefix reads), and the
resources from the op model's memory estimate: the KV pool in bytes at --gpu-memory-utilization and the KV layout
by attention kind (full attention per token; sliding-window layers capped at their window and linear-attention /
state-space layers as one state per sequence, a grouped cache). Precisions default to the checkpoint's own
(--gemm-quant-mode / --moe-quant-mode force another; a quantised checkpoint has only its own). A pool that does not
fit the GPU or cannot hold one max_model_len request is refused. With --nextn K the rows are whole speculative
rounds: multi-token prediction priced natively for models with MTP layers, or, with --draft-config FILE, EAGLE-3
rounds composed from op-model pieces (the target's K+1-token verify pass plus K draft decode steps; the op model
has no native EAGLE-3 path). Every number is labelled data_source "modelled".

Examples:

  jaxsim import op-model meta-llama/Meta-Llama-3.1-70B --system b200_sxm --tp 2,4,8 --output profiles/llama70-b200

  jaxsim import op-model Qwen/Qwen3-30B-A3B --system h200_sxm --tp 1,2,4,8 --layout tp4:ep4,tp8:ep8 --output profiles/q30
"""


def _print_summary(title: str, lines: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    for k, v in lines:
        t.add_row(k, v)
    Console().print(t)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Import measured logs or planner sweeps as FPM profiles.", no_args_is_help=True)
    app.add_typer(group, name="import")

    @group.command("fpm-log", help=FPM_LOG_HELP)
    @guarded
    def fpm_log_cmd(
        log: Path = typer.Argument(..., help="fpm_metrics_detail.csv or ForwardPassMetrics JSONL."),
        model_card: Path = typer.Option(..., "--model-card", help="Dynamo model card JSON (runtime KV blocks, envelope)."),
        output: Path = typer.Option(..., "--output", "-o", help="Profile directory to write."),
        vllm_metadata: Path | None = typer.Option(None, "--vllm-metadata", help="vLLM metadata JSON (effective config)."),
        hf_config: Path | None = typer.Option(None, "--hf-config", help="Checkpoint config.json (architecture, KV size)."),
        model: str | None = typer.Option(None, "--model", help="Model id (default: the model card's)."),
        model_revision: str | None = typer.Option(None, "--model-revision", help="Pinned checkpoint revision."),
        system: str | None = typer.Option(None, "--system", help="Hardware id, e.g. h200_sxm (never recorded in logs)."),
        backend_version: str | None = typer.Option(None, "--backend-version", help="vLLM version (default: metadata)."),
        tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel size (default: metadata)."),
        architecture: str | None = typer.Option(None, "--architecture", help="architectures[0] of config.json."),
        kv_bytes_per_token: int | None = typer.Option(None, "--kv-bytes-per-token", help="Rank-local KV bytes per token."),
        gemm_quant_mode: str | None = typer.Option(None, "--gemm-quant-mode", help="GEMM precision (default: metadata)."),
        kv_cache_dtype: str | None = typer.Option(None, "--kv-cache-dtype", help="KV cache dtype (default: metadata)."),
        fmha_quant_mode: str | None = typer.Option(
            None, "--fmha-quant-mode", help="Attention precision (default: from the KV cache dtype / model dtype)."
        ),
        comm_quant_mode: str | None = typer.Option(None, "--comm-quant-mode", help="Collective precision (default: half)."),
        gpu_memory_utilization: float | None = typer.Option(None, "--gpu-memory-utilization", help="Recorded vLLM setting."),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", help="Serving token budget."),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="Serving max sequences."),
        context_length: int | None = typer.Option(None, "--context-length", help="Profile context length (default: model card / metadata)."),
        max_model_len: int | None = typer.Option(None, "--max-model-len", help="vLLM max_model_len (default: metadata / model card)."),
        num_experts: int | None = typer.Option(None, "--num-experts", help="Routed experts (default: HF config, else 0 = dense)."),
        kv_cache_tokens: int | None = typer.Option(
            None, "--kv-cache-tokens", help="Runtime KV pool in tokens (default: model card blocks x block size)."
        ),
        kv_bin_tokens: int = typer.Option(512, "--kv-bin-tokens", help="Decode total-KV bin width (tokens, even)."),
        widen_kv_pool: bool = typer.Option(
            False,
            "--widen-kv-pool",
            help=(
                "When the log's passes hold more KV at once than the recorded pool, widen the pool to that maximum (said in the "
                "provenance) instead of refusing."
            ),
        ),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing output directory."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        from jaxsim.importers.fpm_log import BinningConfig, import_fpm_log, resolve_identity, write_import

        refuse_output_dir(output, force, (log, model_card, vllm_metadata, hf_config))
        ident = resolve_identity(
            model_card=model_card, vllm_metadata=vllm_metadata, hf_config=hf_config, model=model,
            model_revision=model_revision, system=system, backend_version=backend_version, tp=tp,
            architecture=architecture, kv_bytes_per_token=kv_bytes_per_token, gemm_quant_mode=gemm_quant_mode,
            kv_cache_dtype=kv_cache_dtype, gpu_memory_utilization=gpu_memory_utilization,
            max_num_tokens=max_num_batched_tokens, max_batch_size=max_num_seqs, fmha_quant_mode=fmha_quant_mode,
            comm_quant_mode=comm_quant_mode, context_length=context_length, max_model_len=max_model_len,
            num_experts=num_experts, kv_cache_tokens=kv_cache_tokens,
        )
        result = import_fpm_log(log, ident, binning=BinningConfig(kv_bin_tokens=kv_bin_tokens), widen_kv_pool=widen_kv_pool)
        write_import(output, result, force=True)
        if as_json:
            typer.echo(json.dumps({"output": str(output), **result.summary.to_dict()}, indent=1))
        else:
            _print_summary(f"Imported {log.name} -> {output}", result.summary.lines())

    @group.command("dynamo-planner", help=PLANNER_HELP)
    @guarded
    def planner_cmd(
        directory: Path = typer.Argument(..., help="Planner profiling results (prefill.csv, decode.csv)."),
        output: Path = typer.Option(..., "--output", "-o", help="Profile directory to write."),
        model: str | None = typer.Option(None, "--model", help="Model id (default: disagg.yaml --model)."),
        model_revision: str | None = typer.Option(None, "--model-revision", help="Pinned checkpoint revision (required)."),
        system: str | None = typer.Option(None, "--system", help="Hardware id, e.g. h200_sxm (required)."),
        backend_version: str | None = typer.Option(None, "--backend-version", help="vLLM version label (required)."),
        architecture: str | None = typer.Option(None, "--architecture", help="architectures[0] of config.json (required)."),
        kv_bytes_per_token: int | None = typer.Option(None, "--kv-bytes-per-token", help="Rank-local KV bytes per token (required)."),
        context_length: int | None = typer.Option(None, "--context-length", help="Profile context length (required)."),
        max_model_len: int | None = typer.Option(None, "--max-model-len", help="vLLM max_model_len (default: context length)."),
        gemm_quant_mode: str = typer.Option("bfloat16", "--gemm-quant-mode", help="GEMM precision."),
        kv_cache_dtype: str = typer.Option("bfloat16", "--kv-cache-dtype", help="KV cache dtype."),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="vLLM setting used."),
        max_num_batched_tokens: int = typer.Option(8192, "--max-num-batched-tokens", help="Serving token budget."),
        max_num_seqs: int = typer.Option(1024, "--max-num-seqs", help="Serving max sequences (decode points above are dropped)."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing output directory."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        from jaxsim.errors import JaxsimError
        from jaxsim.importers.dynamo_planner import import_planner_dir
        from jaxsim.importers.fpm_log import write_profile_dir

        refuse_output_dir(output, force, (directory,))
        for name, v in (("--model-revision", model_revision), ("--system", system), ("--backend-version", backend_version),
                        ("--architecture", architecture), ("--kv-bytes-per-token", kv_bytes_per_token),
                        ("--context-length", context_length)):
            if v is None:
                raise JaxsimError(f"{name} is required: planner results do not record it")
        result = import_planner_dir(
            directory, model=model, model_revision=model_revision, architecture=architecture, system=system,
            backend_version=backend_version, kv_bytes_per_token=kv_bytes_per_token, gemm_quant_mode=gemm_quant_mode,
            kv_cache_dtype=kv_cache_dtype, gpu_memory_utilization=gpu_memory_utilization,
            max_num_tokens=max_num_batched_tokens, max_batch_size=max_num_seqs, context_length=context_length,
            max_model_len=max_model_len,
        )
        write_profile_dir(output, result.profile, result.columns, force=True)
        rows = result.rows
        summary = {
            "output": str(output), "model": result.profile.model, "prefill_points": int(result.data.prefill_isl.size),
            "decode_points": int(result.data.itl_ms.size), "dropped_above_max_num_seqs": result.dropped_above_max_num_seqs,
            "decode_rows": int(rows.decode_batch.size), "decode_batches": sorted({int(b) for b in rows.decode_batch}),
            "prefill_rows": int(rows.prefill_batch.size),
        }
        if as_json:
            typer.echo(json.dumps(summary, indent=1))
        else:
            _print_summary(f"Imported {directory} -> {output}", [(k, str(v)) for k, v in summary.items()])

    @group.command("op-model", help=OP_MODEL_HELP)
    @guarded
    def op_model_cmd(
        model: str | None = typer.Argument(None, help="Model id, e.g. Qwen/Qwen3-32B (see --list-models)."),
        system: str | None = typer.Option(None, "--system", help="GPU, e.g. h200_sxm (see --list-systems)."),
        tp: str | None = typer.Option(None, "--tp", help="Comma-separated tensor-parallel sizes, e.g. 1,2,4,8 (default 1 without --layout)."),
        layout: str | None = typer.Option(
            None, "--layout", help="Comma-separated parallel layouts tpN[:dpN][:epN][:moetpN], e.g. tp4:ep4,tp8:ep8 (MoE expert parallel), "
            "tp2:dp2:ep4 (attention DP)."
        ),
        output: Path | None = typer.Option(None, "--output", "-o", help="Profile directory to write."),
        backend_version: str | None = typer.Option(None, "--backend-version", help="Op-model vLLM database version (default: its current one)."),
        kv_cache_dtype: str | None = typer.Option(None, "--kv-cache-dtype", help="bfloat16, fp8 or int8 (default: the model's)."),
        gemm_quant_mode: str | None = typer.Option(None, "--gemm-quant-mode", help="GEMM precision (default: the checkpoint's)."),
        moe_quant_mode: str | None = typer.Option(
            None, "--moe-quant-mode", help="MoE expert precision, e.g. fp8, nvfp4, w4a16_mxfp4 (default: the checkpoint's)."
        ),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="vLLM memory fraction for the KV pool."),
        max_num_seqs: int = typer.Option(
            256, "--max-num-seqs", help="Serving max sequences (decode batch grid bound; at most 1,024, docs/limits.md)."
        ),
        max_num_batched_tokens: int = typer.Option(8192, "--max-num-batched-tokens", help="Serving token budget (prefill token bound)."),
        max_prefill_batch: int = typer.Option(16, "--max-prefill-batch", help="Prefill rows for batches 1..this."),
        max_model_len: int | None = typer.Option(None, "--max-model-len", help="vLLM max_model_len (default: the model's context length)."),
        nextn: int = typer.Option(0, "--nextn", help="Draft tokens per speculative round, 1..5 (0: autoregressive; MTP unless --draft-config)."),
        draft_config: Path | None = typer.Option(None, "--draft-config", help="EAGLE-3 draft model config.json (with --nextn)."),
        precision_fallback: bool = typer.Option(
            False, "--precision-fallback",
            help="Where the op model cannot price the checkpoint's block-quantised MoE weights at a layout (fp8_block whose block "
            "does not divide the per-rank MoE width), price them with its per-tensor fp8 data (stated in provenance, printed).",
        ),
        block_gemm_data: str | None = typer.Option(
            None, "--block-gemm-data",
            help="Dense GEMMs of a block-scaled FP8 (fp8_block) checkpoint: price them with the op model's per-tensor fp8 GEMM data "
            "(per-tensor, the default: its fp8_block GEMM data is host-bound at decode sizes, 55-250 us per GEMM) or with that "
            "collected fp8_block data (collected, as aiconfigurator does). Stated in provenance and printed.",
        ),
        list_models: bool = typer.Option(False, "--list-models", help="List the op model's models and exit."),
        list_systems: bool = typer.Option(False, "--list-systems", help="List the op model's systems and exit."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing output directory."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        from jaxsim.errors import JaxsimError
        from jaxsim.importers import op_model as om

        if list_models or list_systems:
            typer.echo("\n".join(om.known_models() if list_models else om.known_systems()))
            return
        if model is None or system is None or output is None:
            raise JaxsimError("MODEL, --system and --output are required (or --list-models / --list-systems)")
        refuse_output_dir(output, force, (draft_config,))
        tp_text = tp if tp is not None else (None if layout else "1")
        req = om.OpModelRequest(
            model=model, system=system, tp=om.parse_tp_list(tp_text) if tp_text is not None else (),
            backend_version=backend_version, kv_cache_dtype=kv_cache_dtype, gemm_quant_mode=gemm_quant_mode,
            moe_quant_mode=moe_quant_mode, gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_prefill_batch=max_prefill_batch, max_model_len=max_model_len,
            num_draft_tokens=nextn, draft_config=draft_config, layouts=om.parse_layouts(layout) if layout else (),
            precision_fallback=precision_fallback,
            **({"block_gemm_data": block_gemm_data} if block_gemm_data is not None else {}),  # None: the importer's default
        )
        result = om.import_op_model(req)
        om.write_op_model(output, result, force=True)
        for c in result.cells:
            if c.fallback:
                typer.echo(f"warning: precision fallback: {c.fallback}", err=True)
            if c.block_gemm_note:
                typer.echo(f"note: GEMM data: {c.block_gemm_note}", err=True)
        summary = {"output": str(output), **result.summary}
        if as_json:
            typer.echo(json.dumps(summary, indent=1))
        else:
            lines = [(k, str(v)) for k, v in summary.items() if k != "cells"]
            for c in result.summary["cells"]:
                pool = f"{c['kv_pool_bytes'] / 2**30:,.2f} GiB" + (f" = {c['kv_pool_tokens']:,} tokens" if c["kv_pool_tokens"] else
                                                                     f" ({c['cache_layout']}: {c['kv_geometry']})")
                priced = f" (priced with per-tensor {om.BLOCK_GEMM_PRICED_AS} GEMM data)" if "block_gemm_data" in c else ""
                lines.append((c["layout"], f"{c['decode_rows']} decode rows ({c['decode_curves']} curves), {c['prefill_rows']} "
                              f"prefill rows, KV pool {pool}, {c['max_sequences_at_max_model_len']:,} max-length sequences, "
                              f"gemm {c['gemm_quant_mode']}{priced} / "
                              f"moe {c['moe_quant_mode']} / kv {c['kv_cache_dtype']}, {c['seconds']} s"))
            _print_summary(f"Imported op model {model} on {system} -> {output}", lines)
