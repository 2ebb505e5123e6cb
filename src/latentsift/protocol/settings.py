"""The protocol's settings, shared by ``reproduce`` and ``crossval``, and the cache-key digests.

``ProtocolSettings`` holds every field the two commands share (folds, K values, draws, bootstrap,
seed, scorer epochs, variants, curves, agent transfer, the shift guard's rate), with one default
each and one validation; ``ReproduceSettings`` and ``CrossvalSettings`` inherit it and add their
inputs. The CLIs read their defaults from these dataclasses.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Sequence

from .._core.validation import LatentSiftError, check_choice, check_positive_int
from ..sift.keep import check_target_recall
from ..deploy.operating import TARGET_RECALLS
from ..deploy.shift import FALSE_ALARM, check_false_alarm
from ..trajectories.trajectory import Trajectory

#: What the folds are disjoint by (``--group-by``): repository, agent or instance.
GROUP_BY = ("repo", "agent", "instance")


def digest(obj: Any) -> str:
    """16 hex characters of the sha256 of ``obj``'s canonical JSON: the key of a cached stage."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def hash_key(seed: int, name: str) -> int:
    """A seeded order of names that is independent of any score (instance sampling, subsets)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


@dataclass(kw_only=True)
class ProtocolSettings:
    """Settings of the evaluation protocol (recorded in the manifest and in summary.json).

    ``group_by``: disjoint folds by "repo" (the paper), "agent" or "instance"; ``n_folds`` folds;
    ``ks``: pool sizes K of the seeded draws (``n_draws`` per instance and K); ``n_boot``: bootstrap
    resamples of instances for the intervals; ``scorer_epochs``: epochs of the gated scorer per
    fold; ``variants``: also the beyond-paper variants and the inner-CV default; ``curve_fractions``:
    bank fractions of the training-set size curves (learned branch); ``agent_transfer``: the
    agent-transfer table (banks and scorers from one agent's trajectories); ``guard_false_alarm``:
    the shift guard's stated false-alarm rate (``shift.FALSE_ALARM``); ``target_recalls``: the pool
    recalls of the operating-points evaluation (``protocol.operating``; the selection stays the paper's);
    ``gen_test_key``: the trajectories' ``tests`` key of each candidate's generated-test score, the
    cascade's Stage 3 (rollouts: ``examples_passed``, the docstring's examples; None: no Stage 3 scores);
    ``testgen_tokens``: the tokens charged per pool when Stage 3 is reached (0 for docstring examples).
    """

    group_by: str = "repo"
    n_folds: int = 4
    ks: tuple[int, ...] = (4, 5, 6)
    n_draws: int = 200
    n_boot: int = 1000
    seed: int = 0
    scorer_epochs: int = 40
    variants: bool = True
    curve_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    agent_transfer: bool = True
    guard_false_alarm: float = FALSE_ALARM
    target_recalls: tuple[float, ...] = TARGET_RECALLS
    gen_test_key: str | None = None
    testgen_tokens: float = 0.0

    owner: ClassVar[str] = "the protocol"     # names the command in error messages
    key_order: ClassVar[tuple[str, ...]] = ()  # to_dict's key order (default: the field order)

    def __post_init__(self):
        check_choice(self.group_by, "group_by", self.owner, GROUP_BY)
        for name in ("n_folds", "n_draws", "n_boot", "scorer_epochs"):
            check_positive_int(getattr(self, name), name, self.owner)
        self.ks = tuple(check_positive_int(k, "ks", self.owner) for k in self.ks)
        if not self.ks:
            raise LatentSiftError(f"The 'ks' parameter of {self.owner} must name at least one K. Got [] instead.")
        self.curve_fractions = tuple(self.curve_fractions)
        if not all(isinstance(f, (int, float)) and 0.0 < f <= 1.0 for f in self.curve_fractions):
            raise LatentSiftError(f"The 'curve_fractions' parameter of {self.owner} must hold fractions in (0, 1]. "
                                  f"Got {list(self.curve_fractions)} instead.")
        check_false_alarm(self.guard_false_alarm, "--guard-false-alarm", self.owner)
        if not (isinstance(self.testgen_tokens, (int, float)) and self.testgen_tokens >= 0):
            raise LatentSiftError(f"The 'testgen_tokens' parameter of {self.owner} must be a number >= 0. "
                                  f"Got {self.testgen_tokens!r} instead.")
        self.target_recalls = tuple(check_target_recall(r, self.owner) for r in self.target_recalls)
        if not self.target_recalls:
            raise LatentSiftError(f"The 'target_recalls' parameter of {self.owner} must name at least one target. "
                                  "Got [] instead.")

    def inputs(self) -> tuple[Path, Path]:
        """(pools file, state store folder) of the run."""
        raise NotImplementedError

    def select(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        """The run's instances among the trajectories of its pools file (all by default)."""
        return list(trajs)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """field -> default (the CLIs' option defaults)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    def to_dict(self) -> dict:
        """The settings as JSON-able values (tuples as lists), in ``key_order``."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        order = self.key_order or tuple(d)
        if set(order) != set(d):
            raise LatentSiftError(f"{type(self).__name__}.key_order does not list its fields exactly.")
        return {k: d[k] for k in order}
