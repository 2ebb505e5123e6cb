"""What the explorer shows, as plain dicts (pure: trajectories and Stage-1 results in, page data out).

Inputs are the files the other stages write: the canonical pools JSONL, a filter output
(``latentsift filter`` / ``FilterRun.to_dict()``: per candidate s, s_dist, s_lin, channel ranks
and evidence), optional retained sets of further filters (``retained.json`` of ``save_stage1``)
and optional ``summary.json``. Long texts are cut here (``cut``), with the count of characters left
out, so the templates can show a visible mark and the site stays small.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ...metrics.evaluate import RANDOM_PICK
from ..colors import filter_colors
from ..decision_report import headline
from ...trajectories.trajectory import Trajectory

RETAINED_FORMAT = "latentsift-retained"


@dataclass(frozen=True)
class Limits:
    """Text budgets (characters). ``span``: one cot/fn/obs span; ``traj``: all spans of one
    trajectory (past it, every further span keeps ``tail_span``; evidence steps keep ``span``);
    ``bank``: the text of a nearest bank step shown beside an evidence step; ``prompt``: task prompt."""

    span: int = 1500
    traj: int = 20_000
    tail_span: int = 200
    bank: int = 600
    prompt: int = 1500


def cut(text: str | None, n: int) -> dict:
    """``{"text": head, "cut": number of characters left out}`` (the page marks cut > 0)."""
    text = text or ""
    return {"text": text[:n], "cut": max(0, len(text) - n)}


def slug(s: str) -> str:
    """A file-name-safe form of an id (instance ids hold '/' and '__')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)[:120]


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def trajectory_steps(t: Trajectory, limits: Limits, evidence_steps: set[int]) -> list[dict]:
    """The steps of a trajectory with each span cut to the budget (see ``Limits``)."""
    used, out = 0, []
    for i, st in enumerate(t.steps):
        row = {"i": i, "evidence": i in evidence_steps}
        for ch in ("cot", "fn", "obs"):
            text = getattr(st, ch)
            n = limits.span if (used < limits.traj or i in evidence_steps) else limits.tail_span
            row[ch] = cut(text, n)
            used += len(row[ch]["text"])
        out.append(row)
    return out


def bank_step_text(trajs: Mapping[str, Trajectory], traj_id: str, step: int, channel: str, n: int) -> dict:
    t = trajs.get(traj_id)
    if t is None or not 0 <= step < len(t.steps):
        return {"text": "", "cut": 0, "missing": True}
    return cut(getattr(t.steps[step], channel), n) | {"missing": False}


def pool_pages(trajs: Sequence[Trajectory], detail: Mapping[str, Any] | None,
               kept: Mapping[str, Mapping[str, Sequence[str]]], bank_trajs: Mapping[str, Trajectory],
               limits: Limits = Limits()) -> list[dict]:
    """One dict per instance (sorted by id): candidates with scores, kept-by-filter and trajectories.

    ``detail``: a filter output dict (its per-candidate scores and evidence are shown);
    ``kept``: filter name -> instance -> retained traj_ids (whole pool).
    """
    by: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by.setdefault(t.instance_id, []).append(t)
    scores: dict[str, dict] = {}
    if detail:
        for p in detail.get("pools", []):
            for c in p["candidates"]:
                scores[c["traj_id"]] = c
    filters = list(kept)
    pages = []
    for inst in sorted(by):
        cands = sorted(by[inst], key=lambda t: t.traj_id)
        rows = []
        for t in cands:
            sc = scores.get(t.traj_id, {})
            ev = []
            for e in sc.get("evidence", []) or []:
                ev.append(e | {"pos_text": bank_step_text(bank_trajs, e["pos_traj"], e["pos_step"], e["channel"],
                                                          limits.bank),
                               "neg_text": bank_step_text(bank_trajs, e["neg_traj"], e["neg_step"], e["channel"],
                                                          limits.bank)})
            ev_steps = {e["step"] for e in ev}
            rows.append({
                "traj_id": t.traj_id, "agent": t.agent, "run": t.run, "label": t.label,
                "n_chars": t.n_chars, "n_steps": t.n_steps,
                "s": _num(sc.get("s")), "s_dist": _num(sc.get("s_dist")), "s_lin": _num(sc.get("s_lin")),
                "r": {k: _num(v) for k, v in (sc.get("r") or {}).items()},
                "q": {k: _num(v) for k, v in (sc.get("q") or {}).items()},
                "kept": {f: t.traj_id in set(kept[f].get(inst, ())) for f in filters if inst in kept[f]},
                "evidence": ev,
                "evidence_by_step": {s: [e for e in ev if e["step"] == s] for s in sorted(ev_steps)},
                "prompt": cut(t.task_prompt, limits.prompt),
                "patch": cut(t.patch, limits.span),
                "steps": trajectory_steps(t, limits, ev_steps),
            })
        rows.sort(key=lambda r: (-(r["s"] if r["s"] is not None else -math.inf), r["traj_id"]))
        resolved = {r["traj_id"] for r in rows if r["label"] == 1}
        kept_resolved = {f: bool(resolved & set(kept[f].get(inst, ()))) for f in filters if inst in kept[f]}
        pages.append({
            "instance_id": inst, "slug": slug(inst), "repo": cands[0].repo, "k": len(cands),
            "n_resolved": len(resolved), "agents": sorted({t.agent for t in cands}),
            "kept_resolved": kept_resolved, "candidates": rows,
            "channels": sorted({ch for r in rows for ch in r["r"]}, key=("cot", "obs", "fn").index),
        })
    return pages


def summary_charts(summary: Mapping[str, Any]) -> dict:
    """The figures' data from summary.json: Best@K vs tokens, retention vs K, paired differences."""
    s = summary["settings"]
    ks = [str(k) for k in s["ks"]]
    names = s.get("names", {})
    head = list(s.get("headline") or s.get("filters") or [])
    best = summary["best_at_k"]["filters"]
    tok = summary.get("tokens", {}).get("workflows", {})
    ret = summary.get("retention", {})
    colors = filter_colors(summary)  # one colour per filter, as in the report's figures
    out: dict[str, Any] = {"ks": ks, "best_vs_tokens": [], "retention": [], "differences": []}
    for f in head:
        if f in best:
            pts = [{"x": tok.get(f, {}).get(k, {}).get("total", {}).get("mean"), "y": best[f][k]["mean"],
                    "lo": best[f][k].get("lo"), "hi": best[f][k].get("hi"), "k": k} for k in ks if k in best[f]]
            out["best_vs_tokens"].append({"label": names.get(f, f), "color": colors.get(f), "data": pts})
        if f in ret:
            out["retention"].append({"label": names.get(f, f), "color": colors.get(f), "data": [
                {"x": k, "y": ret[f][k]["mean"], "lo": ret[f][k].get("lo"), "hi": ret[f][k].get("hi")}
                for k in ks if k in ret[f]]})
    sel = summary.get("selection") or {}
    diffs = sel.get("retention_difference", {})
    if diffs:
        out["reference"] = names.get(sel.get("reference"), sel.get("reference"))
        for f, by_k in diffs.items():  # the headline filters (every ablation would crowd the figure)
            if f == sel.get("reference") or (head and f not in head):
                continue
            out["differences"].append({"label": names.get(f, f), "color": colors.get(f), "data": [
                {"x": k, "y": by_k[k]["estimate"], "lo": by_k[k]["lo"], "hi": by_k[k]["hi"]}
                for k in ks if k in by_k]})
    return out


def summary_verdict(summary: Mapping[str, Any]) -> dict | None:
    """What report.md opens with: its plain sentence (``headline``) and summary.json's verdict, as
    {"sentence": the sentence or None, "head": the verdict's first line, "items": its bullets}."""
    lines = list(summary.get("verdict") or [])
    if not lines:
        return None
    return {"sentence": headline(summary), "head": lines[0].replace("**", ""),
            "items": [l[2:] if l.startswith("- ") else l for l in lines[1:]]}


def summary_tables(summary: Mapping[str, Any]) -> list[dict]:
    """The main tables of summary.json with their intervals: title, columns, rows of cells."""
    s = summary["settings"]
    ks = [str(k) for k in s["ks"]]
    names = s.get("names", {})
    head = list(s.get("headline") or s.get("filters") or [])

    def ci(c):
        return None if not c or c.get("mean") is None else {"v": c["mean"], "lo": c.get("lo"), "hi": c.get("hi")}

    best = summary["best_at_k"]
    tables = [{"title": "Hybrid Best@K (%)", "kind": "pct", "columns": [f"K={k}" for k in ks],
               "rows": [[names.get(f, f)] + [ci(best["filters"][f].get(k)) for k in ks]
                        for f in head if f in best["filters"]]
               + [["Oracle Pass@K"] + [ci(best["oracle_pass"].get(k)) for k in ks],
                  ["Random selection"] + [ci(best[RANDOM_PICK].get(k)) for k in ks]]}]
    ret = summary.get("retention", {})
    order = head + sorted(f for f in ret if f not in head)
    tables.append({"title": "Oracle retention after Stage 1 (%)", "kind": "pct",
                   "columns": [f"K={k}" for k in ks],
                   "rows": [[names.get(f, f)] + [ci(ret[f].get(k)) for k in ks] for f in order if f in ret]})
    tok = summary.get("tokens", {}).get("workflows", {})
    tables.append({"title": "Verification tokens per instance (total)", "kind": "num",
                   "columns": [f"K={k}" for k in ks],
                   "rows": [[names.get(f, f)] + [ci(tok[f].get(k, {}).get("total")) for k in ks]
                            for f in head if f in tok]})
    sel = summary.get("selection") or {}
    diffs = sel.get("retention_difference", {})
    if diffs:
        tables.append({"title": f"Retention minus {names.get(sel['reference'], sel['reference'])} "
                                "(percentage points, paired bootstrap)", "kind": "pct",
                       "columns": [f"K={k}" for k in ks],
                       "rows": [[names.get(f, f)] + [
                           None if k not in diffs[f] or diffs[f][k]["estimate"] is None else
                           {"v": diffs[f][k]["estimate"], "lo": diffs[f][k]["lo"], "hi": diffs[f][k]["hi"]}
                           for k in ks] for f in order if f in diffs]})
    return tables
