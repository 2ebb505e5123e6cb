"""``latentsift crossval``: the evaluation protocol on any labelled pools with stored states (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.crossval import CrossvalOptions, crossval_command
from ._options import (Boot, Draws, FirstInstances, Folds, GenTestKey, GuardFalseAlarm, Ks, ScorerEpochs, Seed,
                       StatesDirs, TargetRecalls, TestgenTokens, Variants, command_options)
from ._help import listed
from ._progress import StageProgress, messages

#: The declared defaults (CrossvalOptions): the command line shows these.
_D = CrossvalOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("crossval", cls=listed(CrossvalOptions))(crossval_cmd)


def crossval_cmd(
    ctx: typer.Context,
    pools: List[Path] = typer.Argument(..., metavar="POOLS",
                                       help="Canonical JSONL of labelled candidate pools (every candidate has a "
                                       "reward); several files (runs) are evaluated as one."),
    states: StatesDirs = ...,
    out: Path = typer.Option(..., "--out", help="RUN_DIR: cached folds and report/ (the files of reproduce)."),
    group_by: str = typer.Option(_D["group_by"], "--group-by", help="Disjoint folds by repo (paper), agent or "
                                 "instance."),
    folds: Folds = _D["folds"],
    k: Ks = _D["k"],
    draws: Draws = _D["draws"],
    seed: Seed = _D["seed"],
    verifier: Optional[Path] = typer.Option(_D["verifier"], "--verifier", help="EF verifier results (folder or "
                                            "verdicts.jsonl) for Stage 4 and the token columns; without them Stage 4 "
                                            "keeps every survivor and no tokens are charged."),
    instances: FirstInstances = _D["instances"],
    boot: Boot = _D["boot"],
    scorer_epochs: ScorerEpochs = _D["scorer_epochs"],
    variants: Variants = _D["variants"],
    agent_transfer: bool = typer.Option(_D["agent_transfer"], "--agent-transfer/--no-agent-transfer",
                                        help="Also train on one agent's trajectories only (report: agent transfer)."),
    on_leak: str = typer.Option(_D["on_leak"], "--on-leak", help="A pool whose candidates span several fold groups "
                                "(its instance would be in the bank that scores it): error (refuse) or skip "
                                "(leave it out, named in the report's manifest; the other pools are evaluated). "
                                "No 'allow': in evaluation that overlap is leakage."),
    guard_false_alarm: GuardFalseAlarm = _D["guard_false_alarm"],
    target_recall: TargetRecalls = _D["target_recall"],
    gen_test_key: GenTestKey = _D["gen_test_key"],
    testgen_tokens: TestgenTokens = _D["testgen_tokens"],
) -> None:
    """Cross-validate LatentSift, its variants and the baselines on your own labelled pools; write the report."""
    options = CrossvalOptions(**command_options(ctx))  # every option checked here, before any file is read
    console = messages()
    with StageProgress(console) as bar:
        report = crossval_command(options, log=bar.print, progress=bar.update)
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json and figures beside it)")
    console.print(f"[bold green]Explorer:[/] {report / 'index.html'}")
