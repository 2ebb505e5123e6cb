"""One colour per filter, the same in every chart, from one table: the report's figures (``figures``)
and the explorer's summary page (``explore``) both read :data:`FILTER_COLORS` through
:func:`filter_colors`; nothing else in the package names a colour for a series.

The paper's method, the default, the EF verifier and the built-in rule filters have a fixed colour
(:data:`FILTER_COLORS`), whatever a run holds and in whichever order. A registered filter states its
colour where it is registered (``register_filter(..., color=...)``; ``latentsift.sift.rules``: the
paper's method blue, random grey, each built-in rule its own; ``latentsift.sift.variants``: the default;
``latentsift.cascade.verifier``: the EF verifier); the table reads them from the registry. A filter the table does not
name (a variant such as ``channels:cot``, an agent-transfer filter) takes the next free palette colour
in the summary's order (headline, then ``settings.filters``, then the operating-point filters), so it
keeps its colour in every chart of that run. Early-pruning policies take the colour of the filter they
apply (:data:`POLICY_OF`); other series (agent pairs, learners) take the free colours in their order.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .._core.registry import registry_entries
from ..cascade import verifier as _registers_the_ef_verifier  # noqa: F401 (its colour is in the table)
from ..sift.rules import filters
from ..sift.sift import LatentSift

#: filter key -> colour: the one table. The paper's method is blue, the EF verifier green (as the
#: explorer always drew them), random grey (a floor, drawn dashed where it is a baseline); a registered
#: filter's colour is the one it was registered with (the package's own here; a plugin's is added by
#: :func:`filter_table` when it is drawn).
FILTER_COLORS = {e.info["key"]: e.info["color"] for e in registry_entries("filter", plugins=False)
                 if e.info.get("color")}

#: Early-pruning policy -> the filter whose score (or length rule) it applies to prefixes.
POLICY_OF = {LatentSift.name: LatentSift.name} | {e.info["prune_policy"]: e.info["key"]
                                                 for e in registry_entries("filter", plugins=False)
                                                 if e.info.get("prune_policy")}


def filter_table() -> dict[str, str]:
    """:data:`FILTER_COLORS` with the colours of the plugins' registered filters."""
    return {e.key: e.color for e in filters() if e.color} | FILTER_COLORS

#: The candidates' classes (score distributions) and the reference lines of the figures.
CLASS_COLORS = {"resolved": "#1a9641", "unresolved": "#d7191c"}
ORACLE_COLOR = "#000000"
GUIDE_COLOR = "#808080"  # threshold and chance lines

#: Colours for series the table does not name, in order (matplotlib's tab10 and tab20 tones that no
#: table entry uses).
FREE = ("#d62728", "#e377c2", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
        "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def series_colors(keys: Iterable[str], fixed: Mapping[str, str] = FILTER_COLORS) -> dict[str, str]:
    """key -> colour: ``fixed``'s colour where it names the key, else the next :data:`FREE` colour."""
    out, free = {}, 0
    for k in dict.fromkeys(keys):
        if k in fixed:
            out[k] = fixed[k]
        else:
            out[k] = FREE[free % len(FREE)]
            free += 1
    return out


def filter_colors(data: Mapping) -> dict[str, str]:
    """filter key -> hex colour for the summary ``data`` (summary.json): every filter it names."""
    s = data["settings"]
    op = (data.get("operating_points") or {}).get("filters") or {}
    return series_colors([*(s.get("headline") or []), *(s.get("filters") or []), *op], filter_table())


def policy_colors(policies: Iterable[str]) -> dict[str, str]:
    """Early-pruning policy -> the colour of the filter it applies (:data:`POLICY_OF`), else a free one."""
    return series_colors(policies, {p: FILTER_COLORS[f] for p, f in POLICY_OF.items()})
