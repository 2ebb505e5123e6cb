"""``latentsift transfer``: the transfer matrix over the agents of several runs (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from .._jobs.transfer import transfer_matrix
from ._help import listed
from ._progress import StageProgress, messages
from ._options import Boot, Draws, Folds, Ks, ScorerEpochs, Seed, StatesDirs


def register(app: typer.Typer) -> None:
    app.command("transfer", cls=listed())(transfer_cmd)


def transfer_cmd(
    pools: List[Path] = typer.Argument(..., metavar="POOLS",
                                       help="Canonical JSONL files of labelled candidates (several runs)."),
    states: StatesDirs = ...,
    out: Path = typer.Option(..., "--out", help="Folder for summary.json and report.md."),
    folds: Folds = 4,
    k: Ks = (4, 6),
    draws: Draws = 50,
    boot: Boot = 1000,
    scorer_epochs: ScorerEpochs = 40,
    seed: Seed = 0,
    group_by: str = typer.Option("repo", "--group-by", help="Disjoint folds by repo, or by instance (one repository "
                                 "or none, e.g. two policies on the same tasks: a bank never holds the task it "
                                 "scores)."),
) -> None:
    """Banks from other agents on each agent's pools: all agents, the nearest one, each single agent.

    Retention is measured at each K only where the pools hold at least K >= 4 candidates; the shift guard's flags
    of the all-agent bank on each set's pools are reported beside.
    """
    console = messages()
    # one line per fold and evaluated set (plain lines when stdout is not a terminal: CI, nohup)
    with StageProgress(console) as bar:
        report = transfer_matrix(pools, states, out, n_folds=folds, ks=tuple(k), n_draws=draws,
                                 n_boot=boot, scorer_epochs=scorer_epochs, seed=seed, group_by=group_by,
                                 log=bar.print)
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json beside it)")
