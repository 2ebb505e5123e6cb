"""Number and table formatting shared by the report's sections (Markdown text only)."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .figures import k_labels as _ks

__all__ = ["_ci_num", "_ci_pct", "_diff_pct", "_ks", "_ktok", "_name", "_num", "_pct", "_rate", "_table"]


def _pct(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}"


def _ci_pct(c: Mapping | None) -> str:
    if not c or c.get("mean") is None:
        return "n/a"
    return f"{_pct(c['mean'])} [{_pct(c.get('lo'))}, {_pct(c.get('hi'))}]"


def _ktok(x: Any) -> str:
    return "n/a" if x is None else f"{x / 1000:.2f}"


def _table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _num(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _diff_pct(d: Mapping | None) -> str:
    if not d or d.get("estimate") is None:
        return "n/a"
    return f"{100 * d['estimate']:+.2f} [{100 * d['lo']:+.2f}, {100 * d['hi']:+.2f}]"


def _rate(r: Mapping | None) -> str:
    if not r or r.get("rate") is None:
        return "-"
    return f"{100 * r['rate']:.1f} [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}] (n={r['n_pools']})"


def _name(data: dict, f: str) -> str:
    return data["settings"].get("names", {}).get(f, f)


def _ci_num(c: Mapping | None, digits: int = 2) -> str:
    if not c or c.get("mean") is None:
        return "-"
    return f"{c['mean']:.{digits}f} [{c['lo']:.{digits}f}, {c['hi']:.{digits}f}]"
