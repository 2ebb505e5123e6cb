"""``latentsift reproduce``: the main job on the shared SWE-bench Lite pools (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.reproduce import ReproduceOptions, reproduce_command
from ._options import Draws, Dtype, Folds, Ks, Model, Seed, TargetRecalls, Variants, command_options
from ._help import listed
from ._progress import StageProgress, messages

#: The declared defaults (ReproduceOptions): the command line shows these.
_D = ReproduceOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("reproduce", cls=listed(ReproduceOptions))(reproduce_cmd)


def reproduce_cmd(
    ctx: typer.Context,
    data: Path = typer.Option(_D["data"], "--data",
                              help="The SWE-bench Lite pools folder (candidates.csv, r2egym/, sweagent/)."),
    out: Path = typer.Option(_D["out"], "--out", help="Run folder (cached stages, report/)."),
    full: bool = typer.Option(_D["full"], "--full", help="Every instance, whole spans, 8k verifier budget (hours; "
                              "resumes)."),
    model: Model = _D["model"],
    include_leaky: bool = typer.Option(_D["include_leaky"], "--include-leaky", help="Also use "
                                       "acr-val-only/acr-val-sbfl (their trajectories contain the test outcome: not "
                                       "a fair selection test)."),
    n_unresolved: int = typer.Option(_D["n_unresolved"], "--n-unresolved", help="Unresolved-only instances added to "
                                     "the default subset."),
    max_instances: Optional[int] = typer.Option(_D["max_instances"], "--max-instances", help="Cap the selected "
                                                "instances (a quick look; hash order, never by score)."),
    max_span_tokens: int = typer.Option(_D["max_span_tokens"], "--max-span-tokens", help="Token budget per "
                                        "cot/obs/fn span."),
    verifier_max_tokens: int = typer.Option(_D["verifier_max_tokens"], "--verifier-max-tokens", help="EF verifier "
                                            "prompt budget."),
    dtype: Dtype = _D["dtype"],
    folds: Folds = _D["folds"],
    k: Ks = _D["k"],
    draws: Draws = _D["draws"],
    seed: Seed = _D["seed"],
    variants: Variants = _D["variants"],
    sweep: Optional[List[str]] = typer.Option(_D["sweep"], "--sweep", help="Also extract and evaluate a "
                                              "representation with states of its own (repeat): gemma (Gemma-3-270M "
                                              "encoder, needs the 'gemma' extra), span (longer spans), patch (longer "
                                              "patch-writing step), or all. Each costs a state extraction "
                                              "(15-40 min on 2 cores; resumes)."),
    sweep_span_tokens: int = typer.Option(_D["sweep_span_tokens"], "--sweep-span-tokens", help="Span budget of the "
                                          "sweep's longer-context representation."),
    sweep_patch_tokens: int = typer.Option(_D["sweep_patch_tokens"], "--sweep-patch-tokens", help="Tokens kept per "
                                           "span of the patch-writing step in the sweep's patch representation."),
    target_recall: TargetRecalls = _D["target_recall"],
) -> None:
    """Import -> states -> repo-disjoint banks and scorers -> filters -> cascade -> report."""
    console = messages()
    options = ReproduceOptions(**command_options(ctx))  # every option checked here, before any file is read
    with StageProgress(console) as bar:
        report = reproduce_command(options, log=bar.print, progress=bar.update)
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json and figures beside it)")
    if (report / "index.html").is_file():  # the explorer
        console.print(f"[bold green]Explorer:[/] {report / 'index.html'}")
