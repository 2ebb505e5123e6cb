"""``latentsift reproduce``: the main job on the shared SWE-bench Lite pools (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.reproduce import ReproduceOptions, ReproduceSettings, reproduce_command
from ._options import Draws, Dtype, Folds, Ks, Model, Seed, Variants, command_options
from ._progress import StageProgress, messages

_DEFAULT = ReproduceSettings.defaults()


def register(app: typer.Typer) -> None:
    app.command("reproduce")(reproduce_cmd)


def reproduce_cmd(
    ctx: typer.Context,
    data: Path = typer.Option(Path("../shared/datasets/swebench-lite-pools"), "--data",
                              help="The SWE-bench Lite pools folder (candidates.csv, r2egym/, sweagent/)."),
    out: Path = typer.Option(Path("runs/reproduce"), "--out", help="Run folder (cached stages, report/)."),
    full: bool = typer.Option(False, "--full", help="Every instance, whole spans, 8k verifier budget (hours; resumes)."),
    model: Model = None,
    include_leaky: bool = typer.Option(False, "--include-leaky", help="Also use acr-val-only/acr-val-sbfl "
                                       "(their trajectories contain the test outcome: not a fair selection test)."),
    n_unresolved: int = typer.Option(_DEFAULT["n_unresolved"], "--n-unresolved", help="Unresolved-only instances added to the default subset."),
    max_instances: Optional[int] = typer.Option(None, "--max-instances", help="Cap the selected instances "
                                                "(a quick look; hash order, never by score)."),
    max_span_tokens: int = typer.Option(_DEFAULT["max_span_tokens"], "--max-span-tokens", help="Token budget per cot/obs/fn span."),
    verifier_max_tokens: int = typer.Option(_DEFAULT["verifier_max_tokens"], "--verifier-max-tokens", help="EF verifier prompt budget."),
    dtype: Dtype = _DEFAULT["dtype"],
    folds: Folds = _DEFAULT["n_folds"],
    k: Ks = _DEFAULT["ks"],
    draws: Draws = _DEFAULT["n_draws"],
    seed: Seed = _DEFAULT["seed"],
    variants: Variants = _DEFAULT["variants"],
    sweep: Optional[List[str]] = typer.Option(None, "--sweep", help="Also extract and evaluate a representation "
                                              "with states of its own (repeat): gemma (Gemma-3-270M encoder, "
                                              "needs the 'gemma' extra), span (longer spans), patch (longer "
                                              "patch-writing step), or all. Each costs a state extraction "
                                              "(15-40 min on 2 cores; resumes)."),
    sweep_span_tokens: int = typer.Option(_DEFAULT["sweep_span_tokens"], "--sweep-span-tokens", help="Span budget of the sweep's "
                                          "longer-context representation."),
    sweep_patch_tokens: int = typer.Option(_DEFAULT["sweep_patch_tokens"], "--sweep-patch-tokens", help="Tokens kept per span of the "
                                           "patch-writing step in the sweep's patch representation."),
    target_recall: Optional[List[float]] = typer.Option(None, "--target-recall", help="Target pool recalls of the "
                                                        "operating-points evaluation (repeat; default 0.9, 0.95, 0.99); "
                                                        "the paper's selection stays the report's default."),
) -> None:
    """Import -> states -> repo-disjoint banks and scorers -> filters -> cascade -> report."""
    console = messages()
    options = ReproduceOptions(**command_options(ctx))  # every option checked here, before any file is read
    with StageProgress(console) as bar:
        report = reproduce_command(options, log=bar.print, progress=bar.update)
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json and figures beside it)")
    if (report / "index.html").is_file():  # the explorer
        console.print(f"[bold green]Explorer:[/] {report / 'index.html'}")
