"""report.md's opening sentence, its verdict and its sections on the comparisons that decide and the
single-agent pools.

Pure: summary.json in, markdown lines out (``report.render_markdown`` places them; the explorer's
summary page opens with the same sentence). The numbers come from summary.json's ``verdict``,
``decision``, ``operating_points`` and ``single_agent`` (``protocol.decide``, ``protocol.operating``,
``protocol.single_agent``, ``protocol.verdict``).
"""
from __future__ import annotations

from typing import Mapping

from .figures import filter_name
from ..sift.keep import PAPER_KEEP
from ..sift.rules import PAPER, RANDOM, REFERENCE
from ..sift.variants import RECOMMENDED


def _f(x, digits: int = 3, sign: bool = False) -> str:
    return "n/a" if x is None else (f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}")


def _diff(d: Mapping | None, adjusted: bool = False) -> str:
    if not d or d.get("estimate") is None:
        return "n/a"
    txt = f"{_f(d['estimate'], sign=True)} [{_f(d.get('lo'), sign=True)}, {_f(d.get('hi'), sign=True)}]"
    a = d.get("adjusted")
    if adjusted and a:
        txt += f" (adj. [{_f(a['lo'], sign=True)}, {_f(a['hi'], sign=True)}])"
    return txt


def _auc(a: Mapping | None) -> str:
    if not a or a.get("auc") is None:
        return "n/a"
    ci = a.get("ci") or [None, None]
    return f"{a['auc']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci[0] is not None else "")


def _best(auc: Mapping, names: list[str]) -> str:
    """The highest-AUC score among ``names`` (a score without an AUC counts as lowest)."""
    def value(n):
        a = auc["scores"][n]["auc"]["auc"]
        return -1.0 if a is None else a
    return max(names, key=value)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ranking_clause(data: Mapping) -> tuple[str, str | None]:
    """(the clause on whether a state score beats the length rules, the score the savings clause is about).

    The clause reads the declared scores only: the recommendation (``RECOMMENDED``, what ``fit --method auto``
    gives, chosen per fold on the bank) and the paper's method (else every score not chosen after the folds were
    seen); a post-hoc score (the best of many, picked after the folds were seen) never opens the report. A declared
    score beats the length rules when its paired interval of within-pool AUC lies above 0 against every length
    reference (every reference but random) at the family's Bonferroni level (the ``adjusted`` interval; the 95%
    one where the summary gives none); a win at 95% only is said as not shown. No state score beats them when
    each declared score lies below 0 against at least one of them (95%); otherwise, or with a length reference
    missing, undetermined."""
    auc = data["decision"]["auc"]
    scores = auc["scores"]
    refs = [r for r in auc["references"] if r != RANDOM]
    ref_words = _and([filter_name(data, r) for r in refs])
    missing = [r for r in (auc.get("missing_references") or {}) if r != RANDOM]
    declared = [n for n in (RECOMMENDED, PAPER) if n in scores] or [n for n in scores if not scores[n]["post_hoc"]]
    if not declared:
        return "Here no state score declared before the folds were seen was evaluated against the length rules", None

    def outcomes(n, family: bool = False):
        out = []
        for r in refs:
            d = scores[n]["vs"].get(r) or {}
            a = (d.get("adjusted") or d) if family else d
            out.append(None if a.get("lo") is None else
                       "higher" if a["lo"] > 0 else "lower" if a["hi"] < 0 else "undetermined")
        return out
    level = (data["decision"].get("multiplicity") or {}).get("bonferroni_level")
    at = "at the family's Bonferroni level" + (f" ({level:.4f})" if level else "")
    above = [n for n in declared if not missing and all(o == "higher" for o in outcomes(n, family=True))]
    if above:
        f = above[0]
        what = " (the recommendation of fit --method auto, chosen per fold on the bank alone)" \
            if f == RECOMMENDED else ""
        return (f"Here a state score beats the length rules: {filter_name(data, f)}{what} ranks a pool's resolved "
                f"candidates above its unresolved ones better than {ref_words}, every paired interval {at} "
                "above 0"), f
    f = _best(auc, declared)
    if all("lower" in outcomes(n) for n in declared):
        return (f"Here no state score beats the length rules: each ranks a pool's candidates below "
                f"{'at least one of ' if len(refs) > 1 else ''}{ref_words}, with a paired 95% interval below 0"), f
    if not missing and all(o == "higher" for o in outcomes(f)):
        return (f"Here no state score is shown to beat the length rules: {filter_name(data, f)} "
                f"(AUC {_f(scores[f]['auc']['auc'])}) is above {ref_words} at 95% but not {at}"), f
    weak = min(((r, scores[f]["vs"][r]) for r in refs if (scores[f]["vs"].get(r) or {}).get("lo") is not None),
               key=lambda rv: rv[1]["lo"], default=None)
    why = (f"the missing {_and([filter_name(data, r) for r in missing])} could not be compared" if missing else
           f"its paired 95% interval against {filter_name(data, weak[0])} is "
           f"[{weak[1]['lo']:+.3f}, {weak[1]['hi']:+.3f}]" if weak else "no interval was available")
    return (f"Here no state score is shown to beat the length rules: the best, {filter_name(data, f)} "
            f"(AUC {_f(scores[f]['auc']['auc'])}), is undetermined against them ({why})"), f


def _savings_clause(data: Mapping, f: str | None) -> str:
    """What score ``f`` (else the paper's method) saves against the reference rule at each stated target recall
    (verifier calls per pool, decided at the family's Bonferroni level), or in verifier tokens without one."""
    op = data.get("operating_points") or {}
    ops = op.get("filters") or {}
    f = f if f in ops or not ops else PAPER if PAPER in ops else f
    if f is None:
        return "."
    name = filter_name(data, f)
    if f in ops and op.get("reference") and f != op["reference"]:
        ref, found = filter_name(data, op["reference"]), []
        for r, row in ops[f]["targets"].items():
            d = row.get("difference_vs_reference") or {}
            c = d.get("verifier_calls_adjusted") or d.get("verifier_calls")
            if not c or c.get("mean") is None:
                continue
            rec = (d.get("realized_recall") or {}).get("mean")
            how = "as many" if round(c["mean"], 2) == 0 else \
                f"{abs(c['mean']):.2f} {'fewer' if c['mean'] < 0 else 'more'}"
            low = " at a lower realized recall" if c["mean"] < 0 and rec is not None and rec < 0 else ""
            decided = "decided" if c["hi"] < 0 or c["lo"] > 0 else "not decided"
            if found and found[-1][1:] == (how, low, decided):
                found[-1][0].append(r)   # targets with the same outcome are said once
            else:
                found.append(([r], how, low, decided))
        parts = [f"at a target pool recall of {_and(rs)} {name} needs {how} verifier calls per pool "
                 f"{'as' if how == 'as many' else 'than'} {ref}{low} ({decided})" if i == 0 else
                 f"at {_and(rs)} {how}{low} ({decided})" for i, (rs, how, low, decided) in enumerate(found)]
        if parts:
            return "; " + ", ".join(parts) + "."
    tok = (data["decision"].get(f"token_savings_vs_{REFERENCE}") or {}).get(f)
    if tok:
        k = max(tok, key=int)
        d = tok[k]
        if d.get("estimate") is not None:
            x = 100 * d["estimate"]
            how = "as many" if round(x, 1) == 0 else f"{abs(x):.1f} points {'more' if x > 0 else 'fewer'}"
            decided = "decided" if d.get("outcome") in ("higher", "lower") else "not decided"
            return (f"; no target recall was set, and at K = {k} {name} saves {how} of the verifier's tokens "
                    f"{'as' if how == 'as many' else 'than'} {filter_name(data, REFERENCE)} ({decided}).")
    return "; no target recall was set, so no saving at a stated recall was measured."


def headline(data: Mapping) -> str | None:
    """One plain sentence that opens report.md and the explorer's summary page: does a state score beat the
    length rules on these pools, and what does it save at the stated target recall. Read from summary.json's
    ``decision`` and ``operating_points``; None for a summary without the comparisons that decide."""
    if not data.get("decision"):
        return None
    clause, f = _ranking_clause(data)
    return clause + _savings_clause(data, f)


def verdict_markdown(data: Mapping) -> list[str]:
    """The verdict lines (at most 12) and a blank line; nothing when the summary has no verdict."""
    v = data.get("verdict")
    return [*v, ""] if v else []


def auc_table(data: Mapping, auc: Mapping, *, adjusted: bool = False) -> list[str]:
    """One row per state score: AUC, paired differences to each reference, length-removed AUC - 1/2."""
    refs = auc["references"]
    head = ["score", "AUC [95%]"] + [f"minus {filter_name(data, r)}" for r in refs] + \
           ["length-removed AUC", "minus 1/2", "post hoc"]
    rows = ["| " + " | ".join(head) + " |", "| " + " | ".join([":--"] + ["--:"] * (len(head) - 1)) + " |"]
    for n, row in auc["scores"].items():
        lr = row["length_removed"]
        cells = [filter_name(data, n), _auc(row["auc"])] + [_diff(row["vs"].get(r), adjusted) for r in refs] + \
                [_auc(lr["auc"]), _diff(lr["minus_half"], adjusted), "yes" if row["post_hoc"] else ""]
        rows.append("| " + " | ".join(cells) + " |")
    ref_row = ", ".join(f"{filter_name(data, r)} {_auc(a)}" for r, a in auc.get("reference_aucs", {}).items())
    gone = [f"Missing reference: {filter_name(data, r)} ({why}); no comparison with it is made."
            for r, why in (auc.get("missing_references") or {}).items()]
    return rows + ["", f"References: {ref_row}.", *(["", *gone] if gone else []), ""]


def decision_markdown(data: Mapping) -> list[str]:
    """'The comparisons that decide': the rules, then the paired AUC and token comparisons."""
    dec = data.get("decision")
    if not dec:
        return []
    lines = ["## The comparisons that decide", "", "Decision rules (stated before the numbers):", ""]
    lines += [f"- {k}: {v}." for k, v in dec["rules"].items()]
    m = dec["multiplicity"]
    lines += ["", f"Multiplicity: {m['note']}. Intervals are 95% paired bootstrap intervals over instances; "
                  "'adj.' gives the Bonferroni-level interval.", "",
              f"Within-pool AUC on the mixed pools ({dec['auc']['n_mixed_instances']} mixed pools, "
              f"{dec['auc']['n_pairs']} pairs); winner by the rule: "
              f"{filter_name(data, dec['winner']) if dec.get('winner') else 'none'}.", ""]
    lines += auc_table(data, dec["auc"], adjusted=True)
    tok = dec.get(f"token_savings_vs_{REFERENCE}") or {}
    if tok:
        ks = sorted({k for v in tok.values() for k in v}, key=int)
        lines += [f"Token saving minus the saving of {filter_name(data, dec['references']['length_rule'])} "
                  f"(fractions of {filter_name(data, dec['reference_workflow'])}'s tokens, paired per pool):", "",
                  "| filter | " + " | ".join(f"K={k}" for k in ks) + " |", "| :-- |" + " --: |" * len(ks)]
        lines += [f"| {filter_name(data, f)} | " + " | ".join(_diff(v.get(k)) for k in ks) + " |"
                  for f, v in tok.items()]
        lines.append("")
    return lines + single_agent_markdown(data)


def single_agent_markdown(data: Mapping) -> list[str]:
    """'Single-agent pools': the cascade and the AUC comparisons on each pool split by agent."""
    sa = data.get("single_agent")
    if not sa:
        return []
    lines = ["## Single-agent pools", ""]
    if sa.get("note"):
        return lines + [sa["note"] + ".", ""]
    p = sa["pools"]
    lines += [f"{sa['rule']}. {p['n_instances']} sub-pools ({', '.join(f'{c} of {n}' for n, c in p['pool_sizes'].items())}), "
              f"{p['n_mixed']} mixed.", ""]
    if sa.get("stage1_keeps_all"):
        lines += [f"At K = {', '.join(map(str, sa['stage1_keeps_all']))} Stage 1 keeps every candidate ({PAPER_KEEP.describe()} >= K): "
                  "retention and Best@K cannot differ between Stage-1 filters there; the AUC can.", ""]
    ks = [str(k) for k in sa["ks"]]
    head = ["filter"] + [f"Best@{k}" for k in ks] + [f"retention K={k}" for k in ks] + \
           [f"Best@{k} minus {filter_name(data, r)}" for r in sa["best_difference"] for k in ks[-1:]]
    lines += ["| " + " | ".join(head) + " |", "| :-- |" + " --: |" * (len(head) - 1)]
    for f, best in sa["best_at_k"]["filters"].items():
        cells = [filter_name(data, f)] + [_pct_ci(best.get(k)) for k in ks] + \
                [_pct_ci(sa["retention"][f].get(k)) for k in ks] + \
                [_diff((sa["best_difference"][r].get(f) or {}).get(ks[-1])) for r in sa["best_difference"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Within-pool AUC on the single-agent pools ({sa['auc']['n_mixed_instances']} mixed, "
                  f"{sa['auc']['n_pairs']} pairs):", ""]
    lines += auc_table(data, sa["auc"])
    for a, auc in sa.get("per_agent", {}).items():
        lines += [f"Pools of {a} only ({auc['n_mixed_instances']} mixed, {auc['n_pairs']} pairs):", ""]
        lines += auc_table(data, auc)
    g = sa.get("shift_guard")
    if g:
        lines += ["Shift guard on single-agent banks (share of held-out pools flagged, distance check / name check, "
                  f"95% interval over pools): {g['rule']}.", "",
                  "| bank | pools | reference | distance check | name check |", "| :-- | :-- | :-- | --: | --: |"]
        for a, b in g["banks"].items():
            for kind, r in b["false_alarms"].items():
                lines.append(f"| {a} | {a} (false alarms) | {kind} | {_rate(r['distance'])} | {_rate(r['name'])} |")
            for o, d in b["detection"].items():
                for kind in b["false_alarms"]:
                    lines.append(f"| {a} | {o} (detection) | {kind} | {_rate(d[kind]['distance'])} | "
                                 f"{_rate(d[kind]['name'])} |")
        lines += [""] + [f"No single-agent bank of {a}: {why}." for a, why in g.get("unavailable", {}).items()] + [""]
    return lines


def _pct_ci(c: Mapping | None) -> str:
    if not c or c.get("mean") is None:
        return "n/a"
    return f"{100 * c['mean']:.1f} [{100 * c['lo']:.1f}, {100 * c['hi']:.1f}]"


def _rate(r: Mapping | None) -> str:
    if not r or r.get("rate") is None:
        return "n/a"
    return f"{100 * r['rate']:.1f}% [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}] (n={r['n_pools']})"
