"""The paper's ablations of its method, each a registered filter (kind "ablation"): the ``LatentSift``
filter with one of its settings changed, fitted on the same banks and scorer (paper section
"Ablations"). The protocol builds every registered ablation in each fold and reports it in the
ablation table named by the entry's ``group``; the early-pruning policies apply the branch ablations
to prefixes (``latentsift.sift.prune``).

An ablation's name is spelled here only: other modules read it from the registry (``filters("ablation")``)
or from this module's constants.
"""
from __future__ import annotations

from typing import Any

from .rules import register_filter
from .sift import LatentSift


def _ablation(name: str, group: str, label: str | None = None, **params: Any) -> str:
    """Register the ablation ``name``: ``LatentSift(bank, scorer, **params, **settings)``, shown in the ablation
    table ``group`` ("channels": channel subsets; "distance": distance construction; "naive": step weighting
    and the branches, beside the naive rules); returns ``name``."""
    def make(bank, scorer=None, **settings) -> LatentSift:
        return LatentSift(bank, scorer, **params, **settings)

    make.__qualname__ = make.__name__ = f"ablation[{name}]"
    register_filter(name, kind="ablation", label=label, params=params, group=group)(make)
    return name


for _sub in (("cot",), ("obs",), ("fn",), ("cot", "obs"), ("cot", "fn"), ("obs", "fn")):
    _ablation("channels:" + "+".join(_sub), "channels", channels=_sub)
_ablation("distance:pos", "distance", "-d_pos only", distance="pos")
_ablation("distance:neg", "distance", "d_neg only", distance="neg")
_ablation("weighting:uniform", "naive", "uniform step mean", weighting="uniform")
#: The branch ablations: the distance branch alone, the learned branch alone.
BRANCH_DISTANCE = _ablation("branch:distance", "naive", "distance branch only", branches="distance")
BRANCH_LEARNED = _ablation("branch:learned", "naive", "learned branch only", branches="learned")
