"""A sensitivity control: plant each candidate's outcome into its text, where the span settings read.

A null result ("no better than the length rule") means something only if the pipeline can see a
signal that is there. ``plant_outcome`` copies a trajectory and writes a short sentence stating the
hidden tests' result at the head of the observation span of its steps: ``render`` keeps the first
``max_span_tokens`` tokens of every span, so the sentence is read under any span setting of a few
tokens or more (the default keeps 16; the sentences here are about 8 tokens). Both sentences have
the same form, so only the outcome word differs. A control, never a result: the planted pools are
written to a new file, the inputs are never modified.
"""
from __future__ import annotations

import copy
from typing import Iterable, Mapping

from .._core.validation import LatentSiftError, check_choice
from ..trajectories.trajectory import Trajectory

PLANTED = {1: "Hidden tests: all PASSED. ", 0: "Hidden tests: some FAILED. "}
PLANT_STEPS = ("all", "last")


def _grow_first_obs_part(step, n: int) -> None:
    """Extend the layout's first ``obs`` part by ``n`` characters (the planted prefix)."""
    for msg in step.layout:
        for part in msg.get("parts", []):
            if part[0] == "obs":
                part[1] += n
                return
    raise LatentSiftError("plant_outcome: a step with observation text has a layout without an 'obs' part.")


def plant_outcome(traj: Trajectory, *, steps: str = "all", sentences: Mapping[int, str] = PLANTED) -> Trajectory:
    """A copy of ``traj`` whose observation spans start with the sentence of its label.

    ``steps``: "all" (every step with observation text) or "last" (the last such step only).
    The copy keeps the traj_id (extract it into a store of its own) and records
    ``meta["planted"]``. Needs a labelled trajectory.
    """
    check_choice(steps, "steps", "plant_outcome", PLANT_STEPS)
    if traj.label is None:
        raise LatentSiftError(f"plant_outcome: {traj.traj_id!r} has no label; the control plants the test outcome.")
    out = copy.deepcopy(traj)
    text = sentences[int(traj.label)]
    idx = [i for i, s in enumerate(out.steps) if s.obs]
    for i in idx if steps == "all" else idx[-1:]:
        s = out.steps[i]
        if s.layout:
            _grow_first_obs_part(s, len(text))
        s.obs = text + s.obs
    out.meta = {**out.meta, "planted": {"sentence": text, "steps": steps, "n_steps": len(idx if steps == "all"
                                                                                          else idx[-1:])}}
    return out


def plant_pools(trajs: Iterable[Trajectory], *, steps: str = "all") -> list[Trajectory]:
    """``plant_outcome`` on every trajectory (new objects; the inputs are unchanged)."""
    return [plant_outcome(t, steps=steps) for t in trajs]
