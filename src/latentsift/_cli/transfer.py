"""``latentsift transfer``: the transfer matrix over the agents of several runs (parsing and progress only)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("transfer")(transfer_cmd)


def transfer_cmd(
    pools: List[Path] = typer.Argument(..., help="Canonical JSONL files of labelled candidates (several runs)."),
    states: List[Path] = typer.Option(..., "--states", help="STATES_DIR of the candidates' states (repeat; same "
                                      "model and settings)."),
    out: Path = typer.Option(..., "--out", help="Folder for summary.json and report.md."),
    folds: int = typer.Option(4, "--folds", help="Repository folds: banks never hold the scored pools' repositories."),
    k: Optional[List[int]] = typer.Option(None, "--k", help="K values for retention (repeat; default 4 6; only "
                                          "where pools hold K >= 4)."),
    draws: int = typer.Option(50, "--draws", help="Seeded draws of K candidates per instance and K."),
    boot: int = typer.Option(1000, "--boot", help="Bootstrap resamples of instances for the intervals."),
    scorer_epochs: int = typer.Option(40, "--scorer-epochs", help="Epochs of each bank's gated scorer (0 = the "
                                      "distance branch only)."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Banks from other agents on each agent's pools: all agents, the nearest one, each single agent."""
    from rich.console import Console

    from ..transfer import transfer_matrix

    console = Console(stderr=True)
    with console.status("transfer matrix ...") as st:
        report = transfer_matrix(pools, states, out, n_folds=folds, ks=tuple(k or (4, 6)), n_draws=draws,
                                 n_boot=boot, scorer_epochs=scorer_epochs, seed=seed,
                                 log=lambda m: st.update(m))
    console.print(f"[bold green]Report:[/] {report / 'report.md'} (summary.json beside it)")
