"""The verdict (summary.json ``verdict``): at most 12 lines that open report.md and the explorer's summary page.

What was compared on how many pools, the rule, which filter wins by it with its paired interval (on
the mixed and the single-agent pools), whether the paper's method carries signal beyond length,
tokens saved, and the guard's state. The words follow the data (``composition``): one agent's pools,
the agents of the guard's bank, the guard's reference kind that matches the folds; a reference that
could not be fitted is named as missing. Every number is read from summary.json (``decide``,
``single_agent``, ``shift_guard``, ``tokens``); nothing is computed here.
"""
from __future__ import annotations

from typing import Mapping

from ..sift.rules import REFERENCE
from ..deploy.shift import REFERENCE_KINDS
from .decide import PAPER, REF_LENGTH_RULE

MAX_LINES = 12
KIND = REFERENCE_KINDS[0]   # the guard's rates quoted by default: the repository-held-out reference, distance check
NUMBER = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def _count(n: int) -> str:
    return NUMBER.get(n, str(n))


def _pools_words(comp: Mapping) -> str:
    """What the evaluated pools are: 'pools of mixed agents', or one agent's pools (named)."""
    agents = comp.get("agents") or []
    if len(agents) == 1:
        return f"pools of one agent ({agents[0]})"
    return "pools of mixed agents"


def guard_kind(data: Mapping) -> str:
    """The shift guard's reference kind the verdict quotes: the one that matches the folds (instance-held-out
    when folds are by instance) and that was actually used (one repository: no repository-held-out reference)."""
    comp = data.get("composition") or {}
    g = data.get("shift_guard") or {}
    used = {(f.get("reference_kind_used") or {}).get(KIND) for f in (g.get("false_alarms") or {}).get("per_fold", [])}
    if comp.get("group_by") == "instance" or comp.get("n_repositories") == 1 or used == {"instance"}:
        return "instance"
    return KIND


def _d(d: Mapping | None, digits: int = 3) -> str:
    """A paired difference as '+0.045 [-0.010, +0.101] (outcome)'."""
    if not d or d.get("estimate") is None:
        return "n/a"
    lo, hi = d.get("lo"), d.get("hi")
    iv = f" [{lo:+.{digits}f}, {hi:+.{digits}f}]" if lo is not None and hi is not None else ""
    return f"{d['estimate']:+.{digits}f}{iv} ({d.get('outcome', 'n/a')})"


def _pct(r: Mapping | None, key: str = "rate") -> str:
    if not r or r.get(key) is None:
        return "n/a"
    return f"{100 * r[key]:.1f}% [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}]"


def _auc_line(label: str, auc: Mapping, f: str, name) -> str:
    row = auc["scores"].get(f)
    if row is None:
        return f"- {label}: {name(f)} not evaluated."
    vs = "; ".join(f"vs {name(r)} {_d(v)}" for r, v in row["vs"].items())
    return (f"- {label} ({auc['n_mixed_instances']} with both outcomes, {auc['n_pairs']} pairs): {name(f)} AUC "
            f"{row['auc']['auc']:.3f}; {vs}.")


def _weakest(row: Mapping) -> tuple[str, Mapping] | None:
    """The reference whose paired difference has the lowest lower bound (the comparison that limits a claim)."""
    vs = [(r, v) for r, v in row["vs"].items() if v.get("lo") is not None]
    return min(vs, key=lambda rv: rv[1]["lo"]) if vs else None


def _winner_line(auc: Mapping, w: str | None, name) -> str:
    """The winner by the rule with its weakest paired comparison; with none, the best AUC and why it does not win.
    A missing reference is named: the winner was not compared with it."""
    line = _winner_text(auc, w, name)
    missing = auc.get("missing_references") or {}
    if w is not None and missing:
        line = line[:-1] + f" (not compared with the missing {', '.join(name(r) for r in missing)})."
    return line


def _winner_text(auc: Mapping, w: str | None, name) -> str:
    scores = auc["scores"]
    if not scores:
        return "- Winner by the rule: none (no state score evaluated)."
    best = w or max(scores, key=lambda n: -1.0 if scores[n]["auc"]["auc"] is None else scores[n]["auc"]["auc"])
    row = scores[best]
    post = " (chosen after the folds were seen)" if row["post_hoc"] else ""
    weak = _weakest(row)
    cmp_ = f"; vs {name(weak[0])} {_d(weak[1])}" if weak else ""
    auc_txt = "n/a" if row["auc"]["auc"] is None else f"{row['auc']['auc']:.3f}"
    if w is not None:
        return f"- Winner by the rule: {name(w)}{post}, AUC {auc_txt}{cmp_}."
    return (f"- Winner by the rule: none. Highest AUC: {name(best)}{post}, {auc_txt}{cmp_}; it does not beat "
            "every reference.")


def verdict_lines(data: Mapping) -> list[str]:
    """The verdict of a finished evaluation (``data`` = summary.json with ``decision``)."""
    dec = data["decision"]
    names = data["settings"].get("names", {})

    def name(f):
        return names.get(f, f)
    pools, auc = data["pools"], dec["auc"]
    comp = data.get("composition") or {}
    single = data.get("single_agent") or {}
    n_single = (single.get("pools") or {}).get("n_instances")
    what = _pools_words(comp)
    missing = auc.get("missing_references") or {}
    gone = "".join(f" Missing reference: {name(r)} ({why})." for r, why in missing.items())
    lines = [f"**Verdict.** {len(auc['scores'])} state scores against {len(auc['references'])} references "
             f"({', '.join(name(r) for r in auc['references'])}) on {pools['n_instances']} {what}"
             + (f" and {n_single} single-agent pools" if n_single else "") + ". Rule: " + dec["rules"]["beats"]
             + f"; {dec['multiplicity']['n_auc_intervals']} such intervals (Bonferroni level in summary.json)."
             + gone,
             _auc_line(what[0].upper() + what[1:], auc, PAPER, name)]
    if single.get("auc"):
        lines.append(_auc_line("Single-agent pools", single["auc"], PAPER, name))
    lines.append(_winner_line(auc, dec.get("winner"), name))
    lr = auc["scores"].get(PAPER, {}).get("length_removed")
    if lr:
        lines.append(f"- Beyond length (within-pool residual on log chars): {name(PAPER)} AUC "
                     f"{lr['auc']['auc']:.3f}, minus 1/2 {_d(lr['minus_half'])}.")
    tok = dec.get(f"token_savings_vs_{REFERENCE}", {}).get(PAPER)
    sav = data["tokens"].get("savings", {}).get(PAPER)
    if tok and sav:
        k = max(tok, key=int)
        s = sav.get(k) or sav.get(int(k))
        lines.append(f"- Tokens at K = {k}: {name(PAPER)} saves {_pct(s['total'], 'mean')} of "
                     f"{name(dec['reference_workflow'])}'s; minus {name(REF_LENGTH_RULE)}'s saving "
                     f"{_d(tok[k])}.")
    else:
        lines.append("- Tokens: no verifier results, so no token savings were measured.")
    g = data.get("shift_guard") or {}
    kind = guard_kind(data)
    fa = ((g.get("false_alarms") or {}).get("pooled") or {}).get(kind, {}).get("distance")
    agents = comp.get("agents")
    bank = ("two-agent" if agents is None else  # summaries written before ``composition`` existed
            f"one-agent ({agents[0]})" if len(agents) == 1 else f"{_count(len(agents))}-agent")
    part = [f"{bank} bank false alarms {_pct(fa)}"] if fa else []
    for a, b in ((single.get("shift_guard") or {}).get("banks") or {}).items():
        own = (b["false_alarms"].get(kind) or {}).get("distance")
        det = "; ".join(f"on {o} {_pct((v.get(kind) or {}).get('distance'))}" for o, v in b["detection"].items())
        part.append(f"{a}-only bank: own-agent false alarms {_pct(own)}, detection {det or 'n/a'}")
    lines.append(f"- Shift guard (distance check, {kind}-held-out reference): "
                 + ("; ".join(part) if part else "not measured") + ".")
    return lines[:MAX_LINES]
