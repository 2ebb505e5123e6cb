"""``latentsift evaluate`` (cascade + metrics + report) and ``latentsift verify`` (EF verifier).

Parsing and progress only; the logic is ``latentsift._jobs.evaluate`` and ``latentsift._jobs.verify``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.evaluate import EvaluateOptions, run_evaluate
from .._jobs.verify import VerifyOptions, verifier_backends, verify_to_folder
from ._help import listed
from ._options import Draws, Dtype, Model, Seed, Threads, command_options
from ._progress import StageProgress

#: The declared defaults (EvaluateOptions, VerifyOptions): the command line shows these.
_E = EvaluateOptions.defaults()
_V = VerifyOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("evaluate", cls=listed(EvaluateOptions))(evaluate_cmd)
    app.command("verify", cls=listed(VerifyOptions, verifier_backends=verifier_backends))(verify_cmd)


def evaluate_cmd(
    ctx: typer.Context,
    pools: Path = typer.Argument(..., metavar="POOLS", help="POOLS.jsonl: one pool per line (docs/evaluation.md)."),
    scores: List[Path] = typer.Option(..., "--scores", help="A score folder or file; repeat. Filters "
                                      "(scores.jsonl) and EF-verifier results (verdicts.jsonl)."),
    out: Path = typer.Option(..., "--out", help="Report folder (summary.json, report.md, PNG figures)."),
    final_verifier: Optional[str] = typer.Option(_E["final_verifier"], "--final-verifier", help="EF input used in "
                                                 "Stage 4 by non-EF filters (default: the only EF input)."),
    reference: Optional[str] = typer.Option(_E["reference"], "--reference", help="Workflow that savings are "
                                            "measured against (default: the first EF input)."),
    k: Optional[List[int]] = typer.Option(_E["k"], "--k", help="K values (repeat; default 2..smallest pool)."),
    draws: Draws = _E["draws"],
    seed: Seed = _E["seed"],
    tie: str = typer.Option(_E["tie"], "--tie", help="Ties after Stage 4: mean (expected label) or random."),
    missing: str = typer.Option(_E["missing"], "--missing", help="Missing Stage-2/3 values: skip-stage or keep."),
    bootstrap: int = typer.Option(_E["bootstrap"], "--bootstrap", help="Bootstrap resamples over instances."),
    small_pools: str = typer.Option(_E["small_pools"], "--small-pools", help="Pools smaller than K: error or drop."),
    exact: bool = typer.Option(_E["exact"], "--exact/--no-exact", help="Enumerate all subsets when C(n,K) <= draws."),
    stop_when_single: bool = typer.Option(_E["stop_when_single"], "--stop-when-single/--no-stop-when-single",
                                          help="Later stages are not reached once one candidate is left."),
    no_filter: bool = typer.Option(_E["no_filter"], "--no-filter", help="Also evaluate Stage 1 without a filter "
                                   "('none')."),
    headline: Optional[List[str]] = typer.Option(_E["headline"], "--headline", help="Filters in the main table and "
                                                 "figures."),
    ablations: Optional[Path] = typer.Option(_E["ablations"], "--ablations", help="JSON: table -> {title, filters, "
                                            "layout, labels}."),
    distributions: Optional[str] = typer.Option(_E["distributions"], "--distributions", help="Score input whose "
                                                "components and score are plotted (default: the first with "
                                                "components)."),
    dist_instances: Optional[int] = typer.Option(_E["dist_instances"], "--dist-instances", help="Instances sampled for "
                                                 "the distribution figure (default: all)."),
    names: Optional[Path] = typer.Option(_E["names"], "--names", help="JSON: filter -> display name."),
) -> None:
    """Run the four-stage cascade for every Stage-1 filter and write the evaluation report."""
    options = EvaluateOptions(**command_options(ctx))  # every option checked here, before any file is read
    with StageProgress(transient=True) as bar:
        written = run_evaluate(options, progress=lambda done, total: bar.update("cascade", done, total))
    typer.echo(f"wrote {len(written)} files to {out}: " + ", ".join(sorted(written)))


def verify_cmd(
    ctx: typer.Context,
    pools: Path = typer.Argument(..., metavar="POOLS", help="Canonical trajectories (.jsonl or .jsonl.gz)."),
    out: Path = typer.Option(..., "--out", help="Output folder (manifest.json + verdicts.jsonl)."),
    name: str = typer.Option(_V["name"], "--name", help="Name of this verifier in the evaluation."),
    backend: str = typer.Option(_V["backend"], "--backend", help="local (a local model), openai (an "
                                "OpenAI-compatible endpoint) or another registered verifier backend: "
                                "{verifier_backends}."),
    model: Model = _V["model"],
    base_url: Optional[str] = typer.Option(_V["base_url"], "--base-url", help="Endpoint root, e.g. "
                                           "http://127.0.0.1:8000/v1."),
    api_model: Optional[str] = typer.Option(_V["api_model"], "--api-model", help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(_V["api_key_env"], "--api-key-env", help="Environment variable "
                                             "holding the API key."),
    max_prompt_tokens: int = typer.Option(_V["max_prompt_tokens"], "--verifier-max-tokens", help="The verifier's "
                                          "prompt budget; longer logs are condensed."),
    cache: Optional[Path] = typer.Option(_V["cache"], "--cache", help="Disk cache folder (default: OUT/cache)."),
    ids: Optional[Path] = typer.Option(_V["ids"], "--ids", help="Text file: only these traj_ids (one per line)."),
    timeout: float = typer.Option(_V["timeout"], "--timeout", help="Seconds per remote call."),
    retries: int = typer.Option(_V["retries"], "--retries", help="Retries per remote call."),
    concurrency: int = typer.Option(_V["concurrency"], "--concurrency", help="Parallel remote calls."),
    dtype: Dtype = _V["dtype"],
    threads: Threads = _V["threads"],
) -> None:
    """Score trajectories with the execution-free verifier (P(YES) from the first answer token).

    --model, --dtype and --threads apply to the local backend.
    """
    options = VerifyOptions(**command_options(ctx))  # every option checked here, before any file is read
    with StageProgress(transient=True) as bar:
        results = verify_to_folder(options, progress=lambda done, total: bar.update("verify", done, total),
                                   log=lambda m: typer.echo(m, err=True))
    n_fail = sum(1 for r in results.values() if r.score is None)
    typer.echo(f"scored {len(results) - n_fail} of {len(results)} candidates ({n_fail} failures) -> {out}")
