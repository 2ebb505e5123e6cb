"""The transfer matrix's report (``latentsift transfer``): its summary as Markdown."""
from __future__ import annotations

from .._core.words import VERDICT_BANK
from ..sift.rules import REFERENCE, filter_entry

__all__ = ["transfer_markdown"]


def _fmt_ci(a: dict | None) -> str:
    if not a or a.get("auc") is None:
        return "-"
    lo, hi = a.get("ci") or (None, None)
    return f"{a['auc']:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{a['auc']:.2f}"


def _rate(r: dict) -> str:
    return f"{100 * r['rate']:.1f}% [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}] (n={r['n_pools']})"


def transfer_markdown(summary: dict, group: str = "repository") -> str:
    """report.md of ``latentsift transfer``: the agents, per evaluated set the AUC and retention tables and the
    shift guard's flags, the bank verdict. ``group``: the fold group as a word ('repository', 'instance')."""
    s = summary["settings"]
    noun = group
    lines = ["# Transfer matrix: banks from other agents", "",
             f"Pools: {', '.join(s['pools'])}; states: {', '.join(s['states'])}. Banks leave out every agent with "
             f"candidates in the evaluated pools and are {noun}-disjoint from them ({s['n_folds']} {noun} "
             f"folds, seed {s['seed']}); scorer epochs {s['scorer_epochs']}; {s['n_boot']} bootstrap resamples "
             "of instances (95% intervals).", "", "| agent | trajectories | resolved | repositories |",
             "| --- | ---: | ---: | ---: |"]
    lines += [f"| {a} | {v['n_trajectories']} | {v['n_resolved']} | {v['repos']} |" for a, v in summary["agents"].items()]
    for r in summary["sets"]:
        d = r["set"]
        lines += ["", f"## {d['name']}", "",
                  f"{d['n_pools']} pools (K = {d['k']}), {d['n_mixed_pools']} mixed; banks from {r['bank_agents']}. "
                  f"Nearest sub-bank chosen: {r['nearest']['n_chosen']}.", "",
                  f"| bank / rule | within-pool AUC [95% CI] | minus {filter_entry(REFERENCE).name} [95% CI] |",
                  "| --- | ---: | ---: |"]
        for name, v in r["auc"].items():
            diff = v.get(f"vs_{REFERENCE}") or {}
            dtxt = "-" if diff.get("estimate") is None or diff.get("lo") is None else \
                f"{diff['estimate']:+.2f} [{diff['lo']:+.2f}, {diff['hi']:+.2f}]"
            lines.append(f"| {name} | {_fmt_ci(v['auc'])} | {dtxt} |")
        g = r.get("shift_guard")
        if g and g["distance"].get("rate") is not None:
            lines += ["", f"Shift guard on the `all` bank ({g['reference_kind']}-held-out reference, kind used "
                      f"{', '.join(g['kind_used'])}; stated false-alarm rate {g['false_alarm_setting']:.0%}): "
                      f"{_rate(g['distance'])} of these pools flagged by the distance check, {_rate(g['name'])} by "
                      "the name check (an agent absent from the bank)."]
        for k, row in r["retention"].items():
            lines += ["", f"Retention at K = {k} (a resolved candidate survives Stage 1):", "",
                      "| bank / rule | retention [95% CI] | instances |", "| --- | ---: | ---: |"]
            for name, v in row.items():
                lines.append(f"| {name} | " + ("-" if v is None else
                                                f"{v['mean']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}] | {v['n_instances']}")
                             + (" | - |" if v is None else " |"))
    v = summary["verdict"]
    lines += ["", "## Which bank", "", f"Nearest sub-bank vs the all-agent bank (AUC): nearest higher on "
              f"{v['nearest_higher']} of {len(v['sets'])} held-out sets, lower on {v['all_higher']}. "
              f"Default: `{v[VERDICT_BANK]}` ({v['rule']})."]
    if v.get("paired"):
        lines += ["", f"Paired (rule: {v['paired_rule']}): **{v['paired_verdict']}**.", "",
                  "| held-out set | branch | nearest | all | nearest - all [95% CI] |", "| --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {p['set']} | {p['branch']} | {p['a']:.3f} | {p['b']:.3f} | {p['estimate']:+.3f} "
                  f"[{p['lo']:+.3f}, {p['hi']:+.3f}] ({p['outcome']}) |" for p in v["paired"]
                  if p.get("estimate") is not None and p.get("lo") is not None]
    return "\n".join(lines) + "\n"
