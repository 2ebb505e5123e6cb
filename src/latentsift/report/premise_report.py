"""The premise test in Markdown: a run's ``premise`` section (summary.json, ``protocol.premise``) and the
report of ``latentsift premise`` (own states, proxy states, own minus proxy). Pure: summary in, lines out."""
from __future__ import annotations

from typing import Mapping

from .decision_report import _diff, _pct_ci, auc_table
from ..sift.rules import PAPER, labels
from .figures import filter_name


def _calls(c: Mapping | None) -> str:
    if not c or c.get("mean") is None:
        return "n/a"
    return f"{c['mean']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}]"


def premise_markdown(data: Mapping, pre: Mapping | None = None, *, title: str | None = "## The premise: own "
                     "states against length", level: str = "###", whose: str = "Own") -> list[str]:
    """A run's premise section: the rules, the AUC table (Bonferroni level), retention@K and verifier calls.
    ``whose``: whose states the run read ("Own"; "Proxy" for the proxy encoder's run)."""
    pre = pre if pre is not None else data.get("premise")
    if not pre:
        return []
    m = pre["multiplicity"]
    lines = ([title, ""] if title else []) + ["Rules (stated before the numbers):", ""]
    lines += [f"- {k}: {v}." for k, v in pre["rules"].items()]
    lines += ["", f"{whose} states beat length: **{pre['own_states_beat_length']}** (the paper's method by the rule above; "
                  "per score: " + ", ".join(f"{filter_name(data, n)} {v}" for n, v in pre["beats_length"].items())
              + ")."]
    for v, what in (("beats_pure_length", "pure length (shortest code, fewest generated tokens)"),
                    ("beats_examples", "the docstring examples' pass share")):
        by = (pre.get("verdicts") or {}).get(v)
        if by:
            lines.append(f"{whose} states beat {what}: **{by.get(PAPER, 'undetermined')}** (the paper's method; "
                         "per score: " + ", ".join(f"{filter_name(data, n)} {x}" for n, x in by.items()) + ").")
    lines.append("")
    for n, why in pre.get("missing_scores", {}).items():
        lines += [f"Missing score: {filter_name(data, n)} ({why}).", ""]
    lines += [f"{level} Within-pool AUC", "", f"{pre['auc']['n_mixed_instances']} pools with both outcomes, "
              f"{pre['auc']['n_pairs']} pairs; {m['n_auc_intervals']} intervals, Bonferroni level "
              f"{m['bonferroni_level']:.4f} ('adj.').", ""]
    lines += auc_table(data, pre["auc"], adjusted=True)
    ks = pre.get("ks") or []
    if ks:
        lines += [f"{level} Retention@K", "", "A resolved candidate survives Stage 1 among seeded draws of K that hold "
                  "one (%, 95% interval over instances).", "",
                  "| filter | " + " | ".join(f"K={k}" for k in ks) + " |", "| :-- |" + " --: |" * len(ks)]
        lines += [f"| {filter_name(data, f)} | " + " | ".join(_pct_ci(r.get(k)) for k in ks) + " |"
                  for f, r in pre["retention"].items()]
        lines.append("")
    if ks and pre.get("best_at_k"):
        stage3 = (f"the candidates' tests[{pre['stage3']!r}] (highest score kept; where no candidate of a pool has "
                  "one, skipped)" if pre.get("stage3") else "none (no generated-test scores given)")
        lines += [f"{level} Best@K through the cascade", "", f"Stage 2 (regression tests): the pools' p2p counts where "
                  f"present, else skipped. Stage 3 (generated tests): {stage3}. Final verifier: "
                  f"{pre.get('final_verifier')}. Best@K (%, 95% interval over instances).", "",
                  "| filter | " + " | ".join(f"K={k}" for k in ks) + " |", "| :-- |" + " --: |" * len(ks)]
        lines += [f"| {filter_name(data, f)} | " + " | ".join(_pct_ci(r.get(k)) for k in ks) + " |"
                  for f, r in pre["best_at_k"].items()]
        lines.append("")
    rs = pre.get("target_recalls") or []
    if pre.get("verifier_calls"):
        lines += [f"{level} Verifier calls at a target recall", "", "Candidates kept per pool by the recall-targeted "
                  "rule (operating points; calibrated on the other folds; a fold whose calibration set is too small "
                  "for R keeps every candidate: 'keep-all folds') and the realized pool recall (%).", "",
                  "| filter | " + " | ".join(f"calls R={r} | recall R={r} | keep-all folds R={r}" for r in rs) + " |",
                  "| :-- |" + " --: | --: | --: |" * len(rs)]
        for f, by in pre["verifier_calls"].items():
            lines.append(f"| {filter_name(data, f)} | " + " | ".join(
                f"{_calls((by.get(r) or {}).get('verifier_calls'))} | "
                f"{_pct_ci((by.get(r) or {}).get('realized_recall'))} | "
                f"{(by.get(r) or {}).get('n_folds_keep_all', 'n/a')}" for r in rs) + " |")
        lines.append("")
    return lines


def own_vs_proxy_markdown(cmp: Mapping, names: Mapping[str, str] | None = None) -> list[str]:
    """AUC(own) - AUC(proxy) per filter, with its 95% and Bonferroni intervals."""
    names = names or {}
    lines = ["## Own states against the proxy encoder", "", f"Rule: {cmp['rule']}: "
             f"{cmp['bonferroni_level']:.4f}. {cmp['n_candidates']} candidates of {cmp['n_instances']} tasks.", "",
             "| filter | AUC own | AUC proxy | own - proxy [95%] | outcome | adj. interval | adj. outcome |",
             "| :-- | --: | --: | --: | :-- | --: | :-- |"]
    for n, d in cmp["filters"].items():
        a = d["adjusted"]
        lines.append(f"| {names.get(n, n)} | {d['a']:.3f} | {d['b']:.3f} | {_diff(d)} | {d['outcome']} | "
                     f"{_diff({'estimate': d['estimate'], 'lo': a['lo'], 'hi': a['hi']})} | {a['outcome']} |")
    if cmp.get("not_compared"):
        lines += ["", f"Not compared (absent from a run): {', '.join(cmp['not_compared'])}."]
    return lines + [""]


def _missing(missing: Mapping[str, str], names: Mapping[str, str]) -> str:
    return "; missing: " + "; ".join(f"{names.get(n, n)} ({why})" for n, why in missing.items()) if missing else ""


def claims_markdown(claims: Mapping, names: Mapping[str, str] | None = None) -> list[str]:
    """The confirmation's claims (``protocol.claims``): one line per claim ((d): per score and target) with its
    intervals at the family's Bonferroni level and its outcome."""
    names = names or {}
    fam = claims["family"]
    lines = ["## The confirmation's claims", "", f"By the rules of {claims['rules']}: m = {fam['m']} intervals, each "
             f"at the Bonferroni level {100 * fam['level']:.3f}% ({fam['n_boot']} resamples, seed {fam['seed']}).", ""]
    for c in ("a", "b"):
        row = claims[c]
        vs = ", ".join(f"minus {names.get(r, r)} {_diff(d)}" for r, d in row["intervals"].items()) or "no interval"
        lines.append(f"- ({c}) {claims['claims'][c]}: {names.get(row['score'], row['score'])} {vs}"
                     f"{_missing(row['missing'], names)}: **{row['outcome']}**.")
    row = claims["c"]
    lines.append(f"- (c) {claims['claims']['c']}: {_diff(row['interval'])}{_missing(row['missing'], names)}: "
                 f"**{row['outcome']}**.")
    for r, t in claims["d"]["targets"].items():
        ref = t["cheapest"]
        base = "n/a" if ref is None else (f"{names.get(ref['rule'], ref['rule'])}, {ref['verifier_calls']:.2f} calls "
                                          f"at recall {ref['realized_recall']:.3f}")
        for s, row in t["scores"].items():
            d = row.get("difference")
            got = "no record" if d is None else (
                f"{row['verifier_calls']:.2f} calls at recall "
                + ("n/a" if row["realized_recall"] is None else f"{row['realized_recall']:.3f}")
                + f", minus the rule {_diff({'estimate': d['mean'], 'lo': d['lo'], 'hi': d['hi']})}")
            lines.append(f"- (d) R = {r}, {names.get(s, s)} against the cheapest length rule ({base}): {got}"
                         f"{_missing(row.get('missing') or {}, names)}: **{row['outcome']}**.")
    return lines + ["", f"The earlier finding (the learned branch beats length) is **{claims['earlier_finding']}** "
                        "(confirmed when (a) is).", ""]


def premise_report_markdown(summary: Mapping) -> str:
    """report.md of ``latentsift premise``: each run's premise section, then own against proxy."""
    lines = ["# The premise on the policy's own states", ""]
    inp = summary["inputs"]
    lines += [f"Pools: `{inp['pools']}`; " + "; ".join(f"{k.removesuffix('_states')} states: `{v}`"
                                                       for k, v in inp.items() if k.endswith("_states")) + ".", ""]
    runs = summary["runs"]
    for name, r in runs.items():
        comp = r.get("composition") or {}
        fp = r.get("fingerprint") or {}
        repos = "repository" if comp.get("n_repositories") == 1 else "repositories"
        who = ", ".join(comp.get("agents") or []) or "n/a"
        lines += [f"## {name.capitalize()} states", "",
                  f"Encoder: {fp.get('architecture', 'n/a')} ({fp.get('n_layers', '?')} layers, "
                  f"d = {fp.get('d_model', '?')}); "
                  f"agents: {who}; {comp.get('n_instances', '?')} tasks, {comp.get('n_repositories', '?')} "
                  f"{repos}; folds by {comp.get('group_by', '?')}. Full run: `{name}/report/report.md`.", ""]
        lines += premise_markdown({"settings": {"names": labels()}}, r["premise"], title=None, whose=name.capitalize())
    if summary.get("own_vs_proxy"):
        lines += own_vs_proxy_markdown(summary["own_vs_proxy"], labels())
    if summary.get("claims"):
        lines += claims_markdown(summary["claims"], labels())
    return "\n".join(lines) + "\n"
