"""``latentsift extract``: policy states of canonical trajectories into a state store.

Parsing and progress only: the options are ``latentsift._jobs.extract.ExtractOptions``, the work
``extract_to_store``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._jobs.extract import (DEFAULT_CHUNK, DEFAULT_PACK_TOKENS, ExtractOptions, extract_to_store,
                             extraction_backends, renderer_names)
from ._help import listed
from ._options import Device, Dtype, FirstInstances, Model, Threads, command_options
from ._progress import StageProgress, messages

#: The declared defaults (ExtractOptions): the command line shows these.
_D = ExtractOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("extract", cls=listed(ExtractOptions, renderers=renderer_names, extraction_backends=extraction_backends))(extract_cmd)


def extract_cmd(
    ctx: typer.Context,
    pools: Path = typer.Argument(..., metavar="POOLS",
                                 help="Canonical trajectory JSONL (from 'latentsift import'), .gz allowed."),
    out: Path = typer.Option(..., "--out", help="STATES_DIR: the state store (created, or resumed)."),
    model: Model = _D["model"],
    dtype: Dtype = _D["dtype"],
    device: Device = _D["device"],
    max_tokens: Optional[int] = typer.Option(_D["max_tokens"], "--max-tokens", help="Keep the first N tokens of "
                                             "each rendered trajectory (later spans get no state)."),
    instances: FirstInstances = _D["instances"],
    max_span_tokens: Optional[int] = typer.Option(_D["max_span_tokens"], "--max-span-tokens", help="Keep the first "
                                                  "N tokens of every cot/obs/fn span (passed to render)."),
    max_prompt_tokens: Optional[int] = typer.Option(_D["max_prompt_tokens"], "--max-prompt-tokens", help="Keep the "
                                                    "first N tokens of each context message (passed to render)."),
    layers: str = typer.Option(_D["layers"], "--layers", help="Stored layers: all, final, or e.g. '10,20,30' "
                               "(the scorer needs all)."),
    chunk_tokens: Optional[int] = typer.Option(_D["chunk_tokens"], "--chunk-tokens", help="Prefill chunk size "
                                               f"(memory bound); default: the device's, {DEFAULT_CHUNK['cpu']} on a CPU, "
                                               f"{DEFAULT_CHUNK['cuda']} on CUDA."),
    shard_size: int = typer.Option(_D["shard_size"], "--shard-size", help="Trajectories per shard (the resume unit)."),
    pack_tokens: Optional[int] = typer.Option(_D["pack_tokens"], "--pack-tokens", help="Replay several short "
                                              "trajectories per forward, up to N tokens (0: one per forward; default: "
                                              f"off on a CPU, {DEFAULT_PACK_TOKENS['cuda']} on CUDA, halved to fit "
                                              "8 GiB of activations; same states up to rounding)."),
    threads: Threads = _D["threads"],
    per_step: bool = typer.Option(_D["per_step"], "--per-step", help="Replay each step in its own context (chat "
                                  "templates that drop earlier <think> blocks, e.g. Qwen3; O(T^2) tokens): "
                                  "--renderer render_per_step."),
    renderer: Optional[str] = typer.Option(_D["renderer"], "--renderer", help="The span renderer, a registered "
                                           "one: {renderers} (default: render)."),
    backend: Optional[str] = typer.Option(_D["backend"], "--backend", help="The extraction backend, a registered "
                                          "one: {extraction_backends} (default: local, or ray with --ray)."),
    patch_step_tokens: Optional[int] = typer.Option(_D["patch_step_tokens"], "--patch-step-tokens", help="Keep the "
                                                    "first N tokens of each span of the step that wrote the final "
                                                    "patch instead of --max-span-tokens."),
    ray_address: Optional[str] = typer.Option(_D["ray_address"], "--ray", help="Extract on Ray workers: local, auto or HOST:PORT "
                                      "(needs the optional extra: pip install ray==2.60.0; same states as one "
                                      "process)."),
    workers: int = typer.Option(_D["workers"], "--workers", help="Ray workers (each loads the model once)."),
    gpus_per_worker: float = typer.Option(_D["gpus_per_worker"], "--gpus-per-worker", help="GPUs each Ray worker "
                                          "claims."),
    device_map: Optional[str] = typer.Option(_D["device_map"], "--device-map", help="auto: split a policy bigger "
                                             "than one GPU over this machine's GPUs (then CPU, then disk) with "
                                             "accelerate; with --ray, over each worker's --gpus-per-worker GPUs."),
) -> None:
    """Replay trajectories through the policy and store their pooled hidden states (resumable)."""
    options = ExtractOptions(**command_options(ctx))  # every option checked here, before anything loads
    console = messages()
    with StageProgress(console) as bar:
        def progress(p) -> None:
            rate = f"{p.tokens / p.elapsed:,.0f} tok/s" if p.elapsed > 0 and p.done else ""
            bar.update("extract", p.done, p.total, rate)

        report = extract_to_store(options, log=bar.print, progress=progress)
    if report.redone:
        console.print(f"{len(report.redone)} stored trajectories were in a missing or damaged shard and were "
                      "extracted again.")
    console.print(f"{report.n_extracted} extracted, {report.n_skipped} already stored, "
                  f"{report.n_tokens:,} tokens in {report.seconds:.1f} s ({report.tokens_per_s:,.0f} tok/s); "
                  f"{report.n_truncated} cut by --max-tokens, {report.n_windowed} longer than the context "
                  f"(sliding window). States in {out}.")
