"""``latentsift explore``: the static HTML explorer of a filter output (parsing and printing only).

The logic is ``latentsift._jobs.explore.write_explorer``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._jobs.explore import write_explorer
from ._help import listed
from ._progress import messages


def register(app: typer.Typer) -> None:
    app.command("explore", cls=listed())(explore_cmd)


def explore_cmd(
    filter_json: Path = typer.Argument(..., metavar="FILTER_JSON", help="FILTER.json written by 'latentsift filter'."),
    pools: Path = typer.Option(..., "--pools", help="The canonical pools JSONL the filter was run on."),
    bank: Optional[Path] = typer.Option(None, "--bank", help="BANK_DIR: the text of evidence's nearest bank "
                                        "steps is read from its pools file (default: the filter output's bank)."),
    out: Path = typer.Option(..., "--out", help="SITE_DIR to write (index.html, instances.html, instances/)."),
) -> None:
    """Write a static HTML site: pools, candidates side by side, trajectories with their evidence."""
    console = messages()
    with console.status("writing pages ..."):
        index = write_explorer(filter_json, pools, out, bank)
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    console.print(f"Explorer: {index} ({size / 1e6:.1f} MB)")
