"""LatentSift: pick the best of K agent candidates from the policy's own hidden states.

The estimators a user composes: ``import_paths`` (trajectories of any supported scaffold), then
``load_policy`` and a ``StateStore`` (the policy's states), a ``Bank`` and a ``LinearScorer`` fitted
on labelled trajectories, ``LatentSift(bank, scorer)`` to score candidate pools, or a ``Sifter``
(bank, scorer and shift guard fitted and saved as one), and ``crossval`` to evaluate it all on your
own labelled pools.

Every name is imported on first use (PEP 562 ``__getattr__``) from the subpackage that exports it:
``import latentsift`` imports nothing else, so the command line starts fast (``latentsift --help`` needs
no numpy), and no stage module imports the package's top level.

The subpackages, bottom up (each imports only from those below it; tests/test_imports.py):
``_core`` (errors, validation, files) -> ``trajectories`` -> ``states`` (policy, rendering, replay,
store, extraction) -> ``rollout`` (the own-policy wing: tasks, sandbox, agent loop,
rollout folder) -> ``bank`` -> ``scale`` -> ``sift`` (Stage-1 filters, the equations) ->
``cascade`` (and the EF verifier) -> ``metrics`` -> ``deploy`` -> ``report`` -> ``protocol`` ->
``_jobs`` -> ``_cli`` and ``cli``.
"""
import importlib

__version__ = "0.1.0"

#: The names imported on first access -> the module or subpackage that exports them.
_LAZY = {"LatentSiftError": "_core.errors", "NotFittedError": "_core.errors", "FingerprintMismatch": "_core.errors",
         **dict.fromkeys(["CHANNELS", "Pool", "Step", "Trajectory", "group_pools", "load_jsonl", "load_pools",
                          "save_jsonl"], "trajectories.trajectory"),
         "import_paths": "trajectories", "load_policy": "states", "StateStore": "states", "Bank": "bank",
         "LinearScorer": "sift", "LatentSift": "sift", "Sifter": "deploy", "crossval": "protocol",
         "RuleFilter": "sift", "register_filter": "sift",
         # the paper's equations
         "nearest_distances": "bank", "normalized_ranks": "sift", "grouped_normalized_ranks": "sift",
         "min_channel_rank": "sift", "null_min_rank": "sift", "step_margins": "sift", "fuse": "sift.fuse",
         "retain_count": "sift", "select_retained": "sift", "order_by_score": "sift"}
_EQUATIONS = ["nearest_distances", "normalized_ranks", "grouped_normalized_ranks", "min_channel_rank", "null_min_rank",
              "step_margins", "fuse", "retain_count", "select_retained", "order_by_score"]

__all__ = ["LatentSiftError", "NotFittedError", "FingerprintMismatch",
           # the estimators
           "import_paths", "load_policy", "StateStore", "Bank", "LinearScorer", "LatentSift", "Sifter", "crossval",
           "RuleFilter", "register_filter",
           # the canonical trajectory model
           "CHANNELS", "Step", "Trajectory", "Pool", "load_jsonl", "save_jsonl", "group_pools", "load_pools",
           # the paper's equations
           *_EQUATIONS]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later accesses skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
