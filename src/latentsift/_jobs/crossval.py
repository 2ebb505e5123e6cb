"""``latentsift crossval`` on files: the evaluation protocol (``latentsift.protocol.crossval``) on a team's own
labelled pools, with the output guarded before any work."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._core.outputs import owned_output
from ..protocol.crossval import CrossvalSettings, crossval

__all__ = ["CrossvalSettings", "run_crossval"]


def run_crossval(pools_path: str | Path | Sequence, states_dir: str | Path | Sequence, out: str | Path, *,
                 verifier: str | Path | None = None, **settings) -> Path:
    """``latentsift crossval``: ``crossval`` into the run folder ``out`` (refused before any work when it
    would touch an input; a second writer to it is refused); returns the report folder."""
    with owned_output(out, [pools_path, states_dir, verifier], kind="run"):
        return crossval(pools_path, states_dir, out, verifier=verifier, **settings)
