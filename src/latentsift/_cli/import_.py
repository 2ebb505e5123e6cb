"""``latentsift import``: any supported trajectory input -> canonical JSONL, with a summary."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .._jobs.imports import format_names, run_import
from ._help import listed
from ._progress import messages


def register(app: typer.Typer) -> None:
    @app.command("import", cls=listed(choices={"format": format_names}, formats=format_names))
    def import_cmd(
        inputs: List[Path] = typer.Argument(..., metavar="INPUT", help="Files, folders, .gz or .tar.gz archives."),
        out: Path = typer.Option(..., "--out", help="Canonical JSONL to write (.jsonl or .jsonl.gz)."),
        format: str = typer.Option("auto", "--format",
                                   help="The input's format: {formats}."),
        labels: Optional[List[Path]] = typer.Option(None, "--labels",
                                                    help="Labels: a CSV (instance_id,resolved; with a run "
                                                         "column when an instance is in several runs), a SWE-bench "
                                                         "harness report, or the harness's logs/ folder "
                                                         "(repeatable)."),
        skip_bad: bool = typer.Option(False, "--skip-bad",
                                      help="Skip records that cannot be imported and report each one."),
        summary_json: Optional[Path] = typer.Option(None, "--summary-json",
                                                    help="Also write the import summary as JSON."),
        scaffold: Optional[str] = typer.Option(None, "--scaffold", help="The scaffold the shift guard compares, "
                                               "for every trajectory (default: each record's agent, never the "
                                               "file format)."),
    ) -> None:
        """Import trajectories into canonical JSONL (one trajectory per line) and print a summary."""
        with messages().status("importing ..."):
            result, n = run_import(inputs, out, format=format, labels=labels, skip_bad=skip_bad,
                                   summary_json=summary_json, scaffold=scaffold)
        typer.echo(result.summary.to_text())
        typer.echo(f"wrote {n} trajectories to {out}")
