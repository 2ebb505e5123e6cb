"""``latentsift import`` on files: any supported trajectory input -> canonical JSONL (sorted by instance and
trajectory) and, optionally, the import summary as JSON (``latentsift.trajectories.import_paths``)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Sequence

from .._core.outputs import owned_output
from .._core.validation import LatentSiftError
from ..trajectories.importers import ImportResult, format_names, import_paths, nothing_read
from ..trajectories.trajectory import save_jsonl

__all__ = ["format_names", "run_import"]


def run_import(inputs: Sequence[str | Path], out: str | Path, *, format: str = "auto",
               labels: Sequence[str | Path] | None = None, skip_bad: bool = False, summary_json: str | Path | None = None,
               scaffold: str | None = None) -> tuple[ImportResult, int]:
    """``latentsift import``: the trajectories of ``inputs`` written to ``out``; (the import result, how many
    were written). Both outputs are refused before any work when they would touch an input or replace a file
that is not this command's own output; a result of no trajectory is refused, nothing written."""
    with contextlib.ExitStack() as held:
        held.enter_context(owned_output(out, [*inputs, *(labels or ())], file="pools"))
        summary = None if summary_json is None else held.enter_context(owned_output(
            summary_json, [*inputs, *(labels or ()), out], file="import-summary", option="--summary-json"))
        result = import_paths(inputs, format=format, labels=labels, skip_bad=skip_bad, scaffold=scaffold)
        if not result.trajectories:  # an input that carries nothing: said, never written as an empty file
            raise LatentSiftError(nothing_read(inputs, result.summary))
        trajs = sorted(result.trajectories, key=lambda t: (t.instance_id, t.traj_id))
        n = save_jsonl(trajs, out)
        if summary is not None:
            summary.write_text(json.dumps(result.summary.to_dict(), indent=1, ensure_ascii=False))
    return result, n
