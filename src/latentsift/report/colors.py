"""One colour per filter, the same in every chart: report figures (``figures``) and the explorer's
summary page (``explore``) both call :func:`filter_colors`.

Colours come from one fixed palette (matplotlib's tab10, then the lighter tab20 tones), assigned to
the run's headline filters first, in headline order, then to its other filters in ``settings.filters``
order: a filter keeps its colour whichever subset a chart shows.
"""
from __future__ import annotations

from typing import Mapping

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5")


def filter_colors(data: Mapping) -> dict[str, str]:
    """filter key -> hex colour for the summary ``data`` (summary.json): headline filters first."""
    s = data["settings"]
    order = list(dict.fromkeys(list(s.get("headline") or []) + list(s.get("filters") or [])))
    return {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(order)}
