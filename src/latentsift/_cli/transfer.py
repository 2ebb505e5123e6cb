"""``latentsift transfer``: the transfer matrix over the agents of several runs (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from .._jobs.transfer import TransferOptions, transfer_command
from ._help import listed
from ._progress import StageProgress, messages
from ._options import Boot, Draws, Folds, Ks, ScorerEpochs, Seed, StatesDirs, command_options

_D = TransferOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("transfer", cls=listed(TransferOptions))(transfer_cmd)


def transfer_cmd(
    ctx: typer.Context,
    pools: List[Path] = typer.Argument(..., metavar="POOLS",
                                       help="Canonical JSONL files of labelled candidates (several runs)."),
    states: StatesDirs = ...,
    out: Path = typer.Option(..., "--out", help="Folder for summary.json and report.md."),
    folds: Folds = _D["folds"],
    k: Ks = _D["k"],
    draws: Draws = _D["draws"],
    boot: Boot = _D["boot"],
    scorer_epochs: ScorerEpochs = _D["scorer_epochs"],
    seed: Seed = _D["seed"],
    group_by: str = typer.Option(_D["group_by"], "--group-by", help="Disjoint folds by repo, or by instance (one "
                                 "repository or none, e.g. two policies on the same tasks: a bank never holds the "
                                 "task it scores)."),
) -> None:
    """Banks from other agents on each agent's pools: all agents, the nearest one, each single agent.

    Retention is measured at each K only where the pools hold at least K >= 4 candidates; the shift guard's flags
    of the all-agent bank on each set's pools are reported beside.
    """
    options = TransferOptions(**command_options(ctx))  # every option checked here, before any file is read
    console = messages()
    # one line per fold and evaluated set (plain lines when stdout is not a terminal: CI, nohup)
    with StageProgress(console) as bar:
        report = transfer_command(options, log=bar.print)
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json beside it)")
