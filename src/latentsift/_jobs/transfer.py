"""``latentsift transfer`` on files: the transfer matrix (``latentsift.protocol.transfer``) written as
OUT/summary.json and OUT/report.md (``latentsift.report.transfer``), under the output guard and lock."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .._core.outputs import owned_output
from ..protocol.folds import group_noun
from ..protocol.transfer import transfer_summary
from ..report.transfer import transfer_markdown

__all__ = ["transfer_matrix"]


def transfer_matrix(pools_paths: Sequence[str | Path], states_dirs: Sequence[str | Path], out: str | Path, *,
                    log: Callable[[str], None] = print, **settings) -> Path:
    """``latentsift transfer``: the matrix over every evaluation set; writes OUT/summary.json and report.md."""
    out = Path(out)
    with owned_output(out, [*pools_paths, *states_dirs], kind="report") as o:
        summary = transfer_summary(pools_paths, states_dirs, out, log=log, **settings)
        o.write_text(transfer_markdown(summary, group_noun(summary["settings"].get("group_by", "repo"), 1)),
                     "report.md")
        o.write_json(summary, "summary.json")  # last: its presence means the report is complete
    log(f"[transfer] report: {out / 'report.md'}")
    return out
