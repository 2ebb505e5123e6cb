"""``latentsift explore`` on files: the static HTML explorer of a filter output (``latentsift.report.explore``)."""
from __future__ import annotations

from pathlib import Path

from .._core.outputs import owned_output
from ..report.explore import write_filter_site

__all__ = ["write_explorer"]


def write_explorer(filter_json: str | Path, pools: str | Path | None, out: str | Path,
                   bank: str | Path | None = None) -> Path:
    """``latentsift explore``: the site written to ``out`` (refused before any work when it would touch an
    input; a second writer to it is refused); returns its index page."""
    with owned_output(out, [filter_json, pools, bank], kind="site"):
        return write_filter_site(filter_json, pools, out, bank_dir=bank)
