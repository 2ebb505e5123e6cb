"""``latentsift transfer`` on files: the transfer matrix (``latentsift.protocol.transfer``) written as
OUT/summary.json and OUT/report.md (``latentsift.report.transfer``), under the output guard and lock."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .._core.outputs import check_output
from .._core.io import atomic_write_json, atomic_write_text, output_lock
from ..protocol.folds import group_noun
from ..protocol.transfer import transfer_summary
from ..report.transfer import transfer_markdown

__all__ = ["transfer_matrix"]


def transfer_matrix(pools_paths: Sequence[str | Path], states_dirs: Sequence[str | Path], out: str | Path, *,
                    log: Callable[[str], None] = print, **settings) -> Path:
    """``latentsift transfer``: the matrix over every evaluation set; writes OUT/summary.json and report.md."""
    out = Path(out)
    check_output(out, [*pools_paths, *states_dirs], kind="report")
    with output_lock(out):
        summary = transfer_summary(pools_paths, states_dirs, out, log=log, **settings)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "report.md",
                          transfer_markdown(summary, group_noun(summary["settings"].get("group_by", "repo"), 1)))
        atomic_write_json(out / "summary.json", summary)  # last: its presence means the report is complete
    log(f"[transfer] report: {out / 'report.md'}")
    return out
