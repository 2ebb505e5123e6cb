"""``latentsift evaluate`` (cascade + metrics + report) and ``latentsift verify`` (EF verifier).

Parsing and progress only; the logic is ``latentsift._jobs.evaluate`` and ``latentsift._jobs.verify``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.evaluate import EvaluateOptions, run_evaluate
from .._jobs.verify import DEFAULT_BACKEND, VerifyOptions, verifier_backends, verify_to_folder
from ._help import listed
from ._options import Draws, Dtype, Model, Seed, Threads, command_options
from ._progress import StageProgress


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_cmd)
    app.command("verify", cls=listed(verifier_backends=verifier_backends))(verify_cmd)


def evaluate_cmd(
    ctx: typer.Context,
    pools: Path = typer.Argument(..., metavar="POOLS", help="POOLS.jsonl: one pool per line (docs/evaluation.md)."),
    scores: List[Path] = typer.Option(..., "--scores", help="A score folder or file; repeat. Filters "
                                      "(scores.jsonl) and EF-verifier results (verdicts.jsonl)."),
    out: Path = typer.Option(..., "--out", help="Report folder (summary.json, report.md, PNG figures)."),
    final_verifier: Optional[str] = typer.Option(None, "--final-verifier", help="EF input used in Stage 4 by "
                                                 "non-EF filters (default: the only EF input)."),
    reference: Optional[str] = typer.Option(None, "--reference", help="Workflow that savings are measured "
                                            "against (default: the first EF input)."),
    k: Optional[List[int]] = typer.Option(None, "--k", help="K values (repeat; default 2..smallest pool)."),
    draws: Draws = 200,
    seed: Seed = 0,
    tie: str = typer.Option("mean", "--tie", help="Ties after Stage 4: mean (expected label) or random."),
    missing: str = typer.Option("skip-stage", "--missing", help="Missing Stage-2/3 values: skip-stage or keep."),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples over instances."),
    small_pools: str = typer.Option("error", "--small-pools", help="Pools smaller than K: error or drop."),
    exact: bool = typer.Option(True, "--exact/--no-exact", help="Enumerate all subsets when C(n,K) <= draws."),
    stop_when_single: bool = typer.Option(True, "--stop-when-single/--no-stop-when-single",
                                          help="Later stages are not reached once one candidate is left."),
    no_filter: bool = typer.Option(False, "--no-filter", help="Also evaluate Stage 1 without a filter ('none')."),
    headline: Optional[List[str]] = typer.Option(None, "--headline", help="Filters in the main table and figures."),
    ablations: Optional[Path] = typer.Option(None, "--ablations", help="JSON: table -> {title, filters, layout, labels}."),
    distributions: Optional[str] = typer.Option(None, "--distributions", help="Score input whose components "
                                                "and score are plotted (default: the first with components)."),
    dist_instances: Optional[int] = typer.Option(None, "--dist-instances", help="Instances sampled for the "
                                                 "distribution figure (default: all)."),
    names: Optional[Path] = typer.Option(None, "--names", help="JSON: filter -> display name."),
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
    name: str = typer.Option("ef", "--name", help="Name of this verifier in the evaluation."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help="local (a local model), openai (an "
                                "OpenAI-compatible endpoint) or another registered verifier backend: "
                                "{verifier_backends}."),
    model: Model = None,
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Endpoint root, e.g. http://127.0.0.1:8000/v1."),
    api_model: Optional[str] = typer.Option(None, "--api-model", help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Environment variable holding the API key."),
    max_prompt_tokens: int = typer.Option(1024, "--verifier-max-tokens", help="The verifier's prompt budget; longer "
                                          "logs are condensed."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Disk cache folder (default: OUT/cache)."),
    ids: Optional[Path] = typer.Option(None, "--ids", help="Text file: only these traj_ids (one per line)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per remote call."),
    retries: int = typer.Option(3, "--retries", help="Retries per remote call."),
    concurrency: int = typer.Option(4, "--concurrency", help="Parallel remote calls."),
    dtype: Dtype = "auto",
    threads: Threads = None,
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
