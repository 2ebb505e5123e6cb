"""This project's canonical JSONL (``Trajectory.to_dict``), read back unchanged."""
from __future__ import annotations

from typing import Any

from .._core.validation import LatentSiftError
from .trajectory import Trajectory
from ._common import Where
from ._registry import register_importer
from ._sources import Source


def looks_like(record: Any) -> bool:
    return isinstance(record, dict) and "traj_id" in record and "steps" in record


@register_importer("canonical", detect=looks_like, missing=("traj_id", "is missing (not a canonical trajectory)"),
                   describe="a canonical", priority=0)
def read(record: dict, where: Where, src: Source) -> Trajectory:
    """A canonical record as written (agent and scaffold as recorded)."""
    try:
        return Trajectory.from_dict(record, where=f"{where.source}:{where.line}")
    except LatentSiftError as e:
        raise where.error(None, str(e).split(": ", 1)[-1]) from None
