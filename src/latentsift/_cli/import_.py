"""``latentsift import``: any supported trajectory input -> canonical JSONL, with a summary."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from .._core.guard import check_output
from .._core.io import atomic_write_text
from .._core.validation import LatentSiftError
from ..trajectories.importers import format_names, import_paths, nothing_read
from ..trajectories.trajectory import save_jsonl


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_cmd(
        inputs: List[Path] = typer.Argument(..., metavar="INPUT", help="Files, folders, .gz or .tar.gz archives."),
        out: Path = typer.Option(..., "--out", help="Canonical JSONL to write (.jsonl or .jsonl.gz)."),
        format: str = typer.Option("auto", "--format",
                                   help="|".join(format_names())),
        labels: Optional[List[Path]] = typer.Option(None, "--labels",
                                                    help="candidates.csv or SWE-bench report.json (repeatable)."),
        skip_bad: bool = typer.Option(False, "--skip-bad",
                                      help="Skip records that cannot be imported and report each one."),
        summary_json: Optional[Path] = typer.Option(None, "--summary-json",
                                                    help="Also write the import summary as JSON."),
        scaffold: Optional[str] = typer.Option(None, "--scaffold", help="The scaffold the shift guard compares, "
                                               "for every trajectory (default: each record's agent, never the "
                                               "file format)."),
    ) -> None:
        """Import trajectories into canonical JSONL (one trajectory per line) and print a summary."""
        check_output(out, [*inputs, *(labels or ())], file="pools")
        if summary_json is not None:
            check_output(summary_json, [*inputs, *(labels or ()), out], file="import-summary",
                         option="--summary-json")
        console = Console(stderr=True)
        with console.status("importing ..."):
            result = import_paths(inputs, format=format, labels=labels, skip_bad=skip_bad, scaffold=scaffold)
            if not result.trajectories:  # an input that carries nothing: said, never written as an empty file
                raise LatentSiftError(nothing_read(inputs, result.summary))
            trajs = sorted(result.trajectories, key=lambda t: (t.instance_id, t.traj_id))
            n = save_jsonl(trajs, out)
        typer.echo(result.summary.to_text())
        typer.echo(f"wrote {n} trajectories to {out}")
        if summary_json is not None:
            atomic_write_text(summary_json, json.dumps(result.summary.to_dict(), indent=1, ensure_ascii=False))
