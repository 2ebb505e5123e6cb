"""LatentSift: pick the best of K agent candidates from the policy's own hidden states.

The estimators a user composes: ``import_paths`` (trajectories of any supported scaffold), then
``load_policy`` and a ``StateStore`` (the policy's states), a ``Bank`` and a ``LinearScorer`` fitted
on labelled trajectories, ``LatentSift(bank, scorer)`` to score candidate pools, or a ``Sifter``
(bank, scorer and shift guard fitted and saved as one), and ``crossval`` to evaluate it all on your
own labelled pools.

The estimators are imported on first use (PEP 562 ``__getattr__``): ``import latentsift`` stays as
light as the trajectory model, so the command line starts fast, and no stage module imports the
package's top level.
"""
import importlib

from ._validation import FingerprintMismatch, LatentSiftError, NotFittedError
from .fuse import fuse
from .knn import nearest_distances
from .margin import step_margins
from .rank import grouped_normalized_ranks, min_channel_rank, normalized_ranks
from .retain import order_by_score, retain_count, select_retained
from .trajectory import CHANNELS, Pool, Step, Trajectory, group_pools, load_jsonl, load_pools, save_jsonl

__version__ = "0.1.0"

#: The estimators a user composes -> the module that defines them (imported on first access).
_LAZY = {"import_paths": "importers", "load_policy": "model", "StateStore": "store", "Bank": "bank",
         "LinearScorer": "scorer", "LatentSift": "sift", "Sifter": "sifter", "crossval": "protocol",
         "RuleFilter": "rules", "register_filter": "rules"}

__all__ = ["LatentSiftError", "NotFittedError", "FingerprintMismatch",
           *_LAZY,
           # the canonical trajectory model
           "CHANNELS", "Step", "Trajectory", "Pool", "load_jsonl", "save_jsonl", "group_pools", "load_pools",
           # the paper's equations
           "nearest_distances", "normalized_ranks", "grouped_normalized_ranks", "min_channel_rank", "step_margins",
           "fuse", "retain_count", "select_retained", "order_by_score"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later accesses skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
