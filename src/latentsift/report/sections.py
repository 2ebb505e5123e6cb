"""The report's sections beyond the cascade's tables, each from its part of summary.json: the run's
settings and folds, the selection diagnostics and training size, agent transfer, the shift guard's
error rates, early pruning and the operating points. Each returns Markdown lines."""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..cascade.verifier import EF
from ..sift.keep import PAPER_KEEP
from ..sift.retain import retain_rule_text
from ..sift.variants import DEFAULT, RECOMMENDED
from ..sift.rules import PAPER, REFERENCE, filter_entry, find_filter, rule_keys
from ._format import _ci_num, _ci_pct, _diff_pct, _ks, _name, _num, _pct, _rate, _table


# ----------------------------------------------------------------------------- the run's settings

#: Keys of ``settings.meta`` that hold the settings of the command that made the run.
COMMANDS = ("reproduce", "crossval")


def _flat(v: Any) -> bool:
    """A scalar, or a list of scalars: one table cell."""
    scalar = (str, int, float, bool, type(None))
    return isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar) for x in v))


def _cell(v: Any) -> str:
    """A setting's value as table cell text: lists comma-separated, flat mappings as 'name: value; ...'."""
    if isinstance(v, dict):
        text = "; ".join(f"{k}: {_cell(x)}" for k, x in v.items())
    elif isinstance(v, list):
        text = ", ".join(_cell(x) for x in v) if v else "none"
    elif isinstance(v, bool):
        text = "yes" if v else "no"
    else:
        text = "none" if v is None else str(v)
    return text.replace("|", "\\|").replace("\n", " ")


def _run_markdown(meta: Mapping) -> list[str]:
    """The run's settings as a name | value table, and the fold details in a folded section.

    ``meta`` is the summary's ``settings.meta``: the command's settings (``reproduce`` or
    ``crossval``: one row per setting), flat mappings (one row each), sentences (notes under the
    table), the folds (tables inside ``<details>``) and any other nested entry (its JSON, inside the
    same section). Every value is also in summary.json.
    """
    rows, notes, nested = [], [], {}
    for key, value in meta.items():
        if key in COMMANDS and isinstance(value, dict):
            rows.append(["command", f"`latentsift {key}`"])
            rows += [[f"`{k}`", _cell(v)] if _flat(v) else [f"`{k}`", "see below"] for k, v in value.items()]
            nested |= {f"{key}.{k}": v for k, v in value.items() if not _flat(v)}
        elif isinstance(value, str) and " " in value:  # a sentence: a note under the table
            notes.append(f"- {key.replace('_', ' ')}: {value}")
        elif _flat(value) or (isinstance(value, dict) and all(_flat(v) for v in value.values())):
            rows.append([key.replace("_", " "), _cell(value)])
        else:
            nested[key] = value
    lines = ["## Run", "", _table(["name", "value"], rows, ["l", "l"]), ""]
    if notes:
        lines += notes + [""]
    if not nested:
        return lines
    folds = nested.pop("folds", None)
    lines += ["<details><summary>Folds and further run details (also in summary.json, "
              "<code>settings.meta</code>)</summary>", ""]
    if isinstance(folds, list) and folds and all(isinstance(f, dict) for f in folds):
        lines += _folds_markdown(folds)
    elif folds is not None:
        nested = {"folds": folds, **nested}
    for key, value in nested.items():
        lines += [f"`{key}`:", "", "```json", json.dumps(value, indent=1, ensure_ascii=False), "```", ""]
    lines += ["</details>", ""]
    return lines


def _folds_markdown(folds: list[dict]) -> list[str]:
    """Per fold: the bank's and the scored groups, bank size, and the inner-CV evidence of the default."""
    rows = []
    for f in folds:
        v = f.get("variants", {})
        rows.append([str(f.get("fold", "")), _cell(f.get("bank_repos")), _cell(f.get("eval_repos")),
                     f"{f.get('n_bank_trajectories', 'n/a')} ({f.get('n_bank_positive', 'n/a')})",
                     str(f.get("n_eval_instances", "n/a")),
                     f"`{v['chosen_default']}`" if "chosen_default" in v else "n/a"])
    lines = ["Folds (bank and scored groups are disjoint):", "",
             _table(["fold", "bank groups", "scored groups", "bank trajectories (resolved)", "scored instances",
                     "default (inner CV)"], rows, ["r", "l", "l", "r", "r", "l"]), ""]
    configs = list(dict.fromkeys(c for f in folds for c in f.get("variants", {}).get("inner_cv_within_pool_auc") or {}))
    if configs:
        rows = [[str(f.get("fold", ""))] + [_num((f.get("variants", {}).get("inner_cv_within_pool_auc") or {}).get(c))
                                            for c in configs] for f in folds]
        lines += ["Inner cross-validation inside each fold's bank: cross-fitted within-pool AUC per "
                  "configuration (the default is the best; the stack weights are in summary.json, "
                  "<code>settings.meta.folds[].variants.stack_weights</code>):", "",
                  _table(["fold"] + [f"`{c}`" for c in configs], rows, ["r"] * (len(configs) + 1)), ""]
    extra = sorted({k for f in folds for k in f} - {"fold", "bank_repos", "eval_repos", "n_bank_trajectories",
                                                    "n_bank_positive", "n_eval_instances", "variants"})
    if extra:
        lines += [f"Further per-fold fields ({', '.join(extra)}) are in summary.json.", ""]
    return lines


def _group_word(data: Mapping) -> str:
    """The fold group of the run as a word ('repository', 'agent', 'instance'): the inner folds split by it too."""
    g = (data.get("composition") or {}).get("group_by", "repo")
    return {"repo": "repository"}.get(g, g)


def _selection_markdown(data: dict) -> list[str]:
    """'Selection quality beyond length': retention and AUC against the length rules, per agent."""
    sel, ks, ret = data["selection"], _ks(data), data["retention"]
    ref = sel["reference"]
    diag = sel["diagnostics"]["scores"]
    order = [f for f in (PAPER, DEFAULT) if f in ret]
    kind = {f: getattr(find_filter(f), "kind", None) for f in ret}  # the registry's: "variant", "sweep", ...
    order += sorted(f for f in ret if kind[f] == "variant") + sorted(f for f in ret if kind[f] == "sweep")
    order += [f for f in (*rule_keys(), EF) if f in ret]  # the registry's rules, in the tables' order
    lines = ["## Selection quality beyond length", "",
             f"Every score against the rule 'keep the shortest trajectories in characters' (`{ref}`). Retention "
             "as above; the difference is paired (same draws, same bootstrap resamples of instances).", ""]
    rows = []
    for f in order:
        rd = sel["retention_difference"].get(f, {})
        rows.append([_name(data, f)] + [_ci_pct(ret[f].get(k)) for k in ks] + [_diff_pct(rd.get(k)) for k in ks])
    lines += [_table(["Stage-1 filter"] + [f"Ret.@{k}" for k in ks] + [f"vs {ref} @{k}" for k in ks], rows), ""]
    lines += ["Within-pool AUC (resolved vs unresolved candidates of the same instance, mixed pools; ties count "
              "1/2), over same-agent pairs only, per agent, the paired AUC difference to the reference, and "
              "Spearman correlations of the score with length in characters, step count and agent identity "
              "(within-instance ranks).", ""]
    rows = []
    for f in order:
        d = diag.get(f)
        if not d:
            continue
        pa = d.get("per_agent_auc", {})
        sp = d.get("spearman", {})
        rows.append([_name(data, f), f"{_num(d['auc']['auc'])} [{_num(d['auc']['ci'][0])}, {_num(d['auc']['ci'][1])}]",
                     _num(d["same_agent_auc"]["auc"])] +
                    [_num(pa.get(a, {}).get("auc")) for a in sorted(pa)] +
                    [f"{_num(d['vs_reference']['estimate'])} [{_num(d['vs_reference']['lo'])}, "
                     f"{_num(d['vs_reference']['hi'])}]" if d.get("vs_reference") else "n/a"] +
                    [_num(((sp.get(c) or {}).get("within") or {}).get("rho"), 2) for c in ("n_chars", "n_steps", "agent")])
    agents = sorted({a for f in order for a in diag.get(f, {}).get("per_agent_auc", {})})
    lines += [_table(["score", "AUC [95%]", "same-agent AUC"] + [f"AUC {a}" for a in agents] +
                     [f"AUC - {ref} [95%]", "rho chars", "rho steps", "rho agent"], rows), ""]
    pa = sel.get("per_agent_retention", {})
    if pa:
        kmax = ks[-1]
        groups = sorted({g for f in order for g in pa.get(f, {})})
        lines += [f"Retention@{kmax} by which agent resolved the instance (instances counted):", ""]
        rows = [[_name(data, f)] + [f"{_pct(pa[f][g][kmax]['retention'])} ({pa[f][g][kmax]['n_instances']})"
                                    if g in pa.get(f, {}) and kmax in pa[f][g] else "n/a" for g in groups]
                for f in order if f in pa]
        lines += [_table(["Stage-1 filter"] + groups, rows), ""]
    lines += _training_size_markdown(sel, diag)
    for title, choice in [("", sel.get("default_choice", []))] + [
            (f" (sweep: `{n}`)", v.get("default_choice", [])) for n, v in sorted(sel.get("sweep", {}).items())]:
        if not choice:
            continue
        lines += [f"Default configuration{title} chosen per fold by cross-validation inside the bank only (inner "
                  f"{_group_word(data)} folds; cross-fitted within-pool AUC on bank pools):", ""]
        for c in choice:
            ev = c.get("inner_cv_within_pool_auc")
            evs = ", ".join(f"{k} {_num(v)}" for k, v in ev.items()) if ev else c.get("reason", "")
            lines += [f"- fold {c['fold']}: `{c.get('chosen_default', 'n/a')}` ({evs})"]
        lines += [""]
    rec = sel.get("recommended_choice", [])
    if rec:
        lines += [f"The recommendation (row `{RECOMMENDED}`: `fit --method auto`'s rule, chosen per fold on the bank "
                  "alone by inner-CV within-pool AUC, ties to the cheaper):", ""]
        lines += [f"- fold {c['fold']}: `{c['chosen']}` ({c['reason']})" for c in rec] + [""]
    return lines


def _agent_transfer_markdown(data: dict) -> list[str]:
    """'Agent transfer': the paper's method trained on one agent's trajectories, mixed pools."""
    tr = (data.get("selection") or {}).get("agent_transfer") or {}
    if not tr.get("filters") and not tr.get("unavailable"):
        return []
    ks, ret = _ks(data), data["retention"]
    diff = data["selection"].get("retention_difference", {})
    ref = data["selection"].get("reference", REFERENCE)
    pa = data["selection"].get("per_agent_retention", {})
    kmax = ks[-1]
    n_agents = len(tr.get("agents") or [None, None])
    every = "both agents" if n_agents == 2 else f"all {n_agents} agents"
    rows_f = [(f"{every} ({_name(data, tr.get('reference', PAPER))})", tr.get("reference", PAPER))]
    rows_f += [(f"{a} only", f) for a, f in sorted(tr.get("filters", {}).items())]
    rows_f += [(_name(data, f), f) for f in rule_keys() if f in ret and not filter_entry(f).tokenizer]
    groups = sorted({g for _, f in rows_f for g in pa.get(f, {})})
    lines = ["## Agent transfer", "",
             "Oracle retention (%, [95% interval]) of the paper's method with the banks and the scorer trained on "
             "one agent's trajectories only (same folds; the evaluation pools stay mixed), next to the main "
             f"table's rows; the paired difference to `{ref}` and retention@{kmax} by which agent resolved the "
             "instance show how much of the selection is agent preference. Baselines need no training: their "
             "rows apply to every training set.", ""]
    rows = []
    for label, f in rows_f:
        if f not in ret:
            continue
        rows.append([label] + [_ci_pct(ret[f].get(k)) for k in ks] + [_diff_pct(diff.get(f, {}).get(k)) for k in ks]
                    + [f"{_pct(pa[f][g][kmax]['retention'])} ({pa[f][g][kmax]['n_instances']})"
                       if g in pa.get(f, {}) and kmax in pa[f][g] else "n/a" for g in groups])
    lines += [_table(["trained on"] + [f"Ret.@{k}" for k in ks] + [f"vs {ref} @{k}" for k in ks]
                     + [f"@{kmax} solved by {g}" for g in groups], rows), ""]
    for a, why in sorted(tr.get("unavailable", {}).items()):
        lines += [f"- no row for {a} only: {why}"]
    return lines + ([""] if tr.get("unavailable") else [])


def _training_size_markdown(sel: dict, diag: dict) -> list[str]:
    """Training-set size curves of the learned branch: within-pool AUC by bank fraction."""
    ts = sel.get("training_size")
    if not ts or not ts.get("fractions"):
        return []
    learners = sorted({n.split(":", 1)[1].split("@")[0] for n in diag if n.startswith("curve:")})
    if not learners:
        return []
    rows = []
    for frac in ts["fractions"]:
        sizes = ts.get("bank_trajectories", {}).get(frac, {})
        row = [frac, str(round(sum(sizes.values()) / len(sizes))) if sizes else "n/a"]
        for ln in learners:
            d = diag.get(f"curve:{ln}@{frac}")
            row.append(f"{_num(d['auc']['auc'])} [{_num(d['auc']['ci'][0])}, {_num(d['auc']['ci'][1])}]"
                       if d else "n/a")
        rows.append(row)
    return [f"Training-set size ({ts.get('rule', '')}): within-pool AUC of the learned branch on the evaluation "
            "folds by the fraction of each fold's bank used for training.", "",
            _table(["bank fraction", "bank trajectories (mean over folds)"] + [f"AUC {ln} [95%]" for ln in learners],
                   rows), ""]


# ----------------------------------------------------------------------------- the shift guard's error rates

def _shift_guard_markdown(data: dict) -> list[str]:
    """'Shift guard': false alarms on held-out pools of the bank's agents, detection of another agent."""
    g = data.get("shift_guard") or {}
    if not g:
        return []
    kinds = g.get("reference_kinds", [])
    lines = ["## Shift guard: false alarms and detection", "",
             f"Share of pools flagged (%, 95% interval over pools). Threshold: the "
             f"{1 - g['false_alarm_setting']:.0%} quantile of the bank's own pools scored against the rest of the "
             "bank, leaving out their repository or their instance (reference kind). Distance check and name "
             "check (an agent or scaffold absent from the bank) separately.", ""]
    rows = []
    fa = g["false_alarms"]["pooled"]
    same = "same agent" if (data.get("composition") or {}).get("n_agents") == 1 else "same agents"
    for kind in kinds:
        rows.append([f"false alarm: held-out folds, {same}", kind, _rate(fa[kind]["distance"]),
                     _rate(fa[kind]["name"])])
    for pair, d in sorted(g.get("detection", {}).items()):
        for kind in kinds:
            rows.append([f"detection: bank of {d['bank_agent']}, pools of {d['pool_agent']} only", kind,
                         _rate(d[kind]["distance"]), _rate(d[kind]["name"])])
    lines += [_table(["pools", "reference", "distance check", "name check"], rows), ""]
    if (data.get("composition") or {}).get("n_repositories") == 1:
        lines += ["One repository: there is no other repository to leave out, so the 'repository' rows leave out "
                  "the instance instead (the per-fold table's 'kind used').", ""]
    per = g["false_alarms"].get("per_fold", [])
    if per:
        rows = [[str(f["fold"]), kind, _num(f["threshold"][kind]), f["reference_kind_used"][kind],
                 _rate(f["false_alarm"][kind]["distance"])] for f in per for kind in kinds]
        lines += ["Per outer fold (distance check):", "",
                  _table(["fold", "reference", "threshold", "kind used", "false alarms"], rows), ""]
    for pair, why in sorted(g.get("detection_unavailable", {}).items()):
        lines += [f"No detection row for {pair}: {why}.", ""]
    if g.get("detection_note"):
        lines += [f"Detection: {g['detection_note']}.", ""]
    return lines


# ----------------------------------------------------------------------------- early pruning

def _pruning_rows(rows: list) -> list[list[str]]:
    out = []
    for r in rows:
        th = r["threshold"]
        out.append([r["policy"], r["schedule"], "-" if th is None else (th if isinstance(th, str) else f"{th:g}"),
                    _ci_pct(r["gen_saved"]), _ci_pct(r["obs_saved"]), _ci_pct(r["retention"]),
                    _ci_pct(r.get("best_at_k")), f"{r['stopped_per_pool']:.2f}"])
    return out


def _pruning_markdown(pr: dict) -> list[str]:
    """Early pruning: tokens saved against candidates lost, state policies next to the length rules."""
    head = ["policy", "schedule", "threshold", "model-written tokens saved %", "observation tokens saved %",
            "retention %", "Best@K after the cascade %", "stopped / pool"]
    cps = {r["schedule"]: r["checkpoints"] for r in pr["rows"] if r["checkpoints"]}
    lines = ["## Early pruning during generation", "",
             f"Candidates are stopped at checkpoints ({'; '.join(f'{k}: {v}' for k, v in cps.items())}; "
             "'tokens' = fractions of each candidate's model-written tokens) when their prefix score ranks "
             "below the threshold among the alive candidates of their pool, never leaving fewer than "
             f"{pr['min_alive_rule']}. Offline, by truncating the stored per-step states of "
             f"{pr['n_instances']} pools (K = {', '.join(map(str, pr['k']))}; {pr['n_solvable']} with a resolved "
             "candidate). Tokens saved: what the stopped candidates would still have written (model-written) or "
             "read (observations), as a share of all the pools' tokens; retention: a resolved candidate "
             "survives (instances with one); Best@K: the cascade run on the survivors. 95% bootstrap "
             f"intervals over instances ({pr['n_boot']} resamples). Thresholds 'in-bank': chosen per fold on "
             f"the bank alone (inner {pr.get('inner_split', 'repository')} split; most tokens saved with retention >= "
             f"{pr['target_retention']:.0%}).", "",
             pr["verdict"]["sentence"], ""]
    if pr.get("prefix_bank_fallbacks"):
        lines += [f"The prefix bank could not be built at {pr['prefix_bank_fallbacks']} fold checkpoint(s) (a class "
                  "without states there); those used the whole-trajectory bank.", ""]
    main = [r for r in pr["rows"] if r["threshold"] in ("in-bank", None)]
    lines += [_table(head, _pruning_rows(main), ["l", "l", "l"] + ["r"] * 5), ""]
    rest = [r for r in pr["rows"] if r["threshold"] not in ("in-bank", None)]
    if rest:
        lines += ["<details><summary>Every threshold</summary>", "",
                  _table(head, _pruning_rows(rest), ["l", "l", "l"] + ["r"] * 5), "", "</details>", ""]
    return lines


# ----------------------------------------------------------------------------- operating points

def _operating_markdown(data: dict) -> list[str]:
    """'Operating points': per filter and target recall, realized recall, verifier calls, EF tokens, the
    paired differences against the reference rule, and the calibration error."""
    op = data["operating_points"]
    ref = op.get("reference")
    head = data["settings"].get("headline") or []
    names = [f for f in op["filters"] if f in head or f.startswith("transfer:")]
    fx = op.get("fixed_rule_calls", {})
    lines = ["## Operating points: retention for a stated pool recall", "",
             f"Rule: {op['rule']}. Guarantee: {op['guarantee']}. Calibration: {op['calibration']}. "
             f"Intervals: {op['intervals']}. For comparison, the paper's fixed {PAPER_KEEP.describe()} keeps "
             f"{_num(fx.get('mean'), 2)} candidates per pool. Differences are against `{ref}` "
             "(the same rule on its scores); negative calls/tokens = cheaper.", ""]
    mult = op.get("multiplicity") or {}
    if mult:
        lines += [f"Multiplicity: {mult['rule']} (m = {mult['m']}, level {100 * mult['level']:.2f}%). Rows marked "
                  "(post hoc) were chosen after the folds were seen. The recall difference is printed beside every "
                  "calls difference: a filter that keeps fewer candidates at a lower realized recall has not "
                  "saved at equal recall.", ""]
    rows = []
    for f in names:
        e = op["filters"][f]
        fx_rule = e.get("fixed_rule") or {}
        fixed = ("-" if not fx_rule or fx_rule["realized_recall"].get("mean") is None else
                 f"{100 * fx_rule['realized_recall']['mean']:.1f} / {fx_rule['verifier_calls']['mean']:.2f}")
        for r, row in e["targets"].items():
            rec = row["realized_recall"]
            per = ", ".join("-" if x["realized_recall"] is None else f"{100 * x['realized_recall']:.0f}"
                            for x in rec["per_fold"])
            d = row.get("difference_vs_reference") or {}
            tok = row.get("ef_tokens")
            rows.append([_name(data, f) + (" (post hoc)" if e.get("post_hoc") else ""), r,
                         _ci_pct(rec["pooled"]) if rec["pooled"].get("mean") is not None else "-",
                         per, _ci_num(row["verifier_calls"]), _ci_num(d.get("verifier_calls")),
                         _ci_num(d.get("verifier_calls_adjusted")), _ci_pct(d["realized_recall"])
                         if d.get("realized_recall") else "-",
                         _ci_num(tok, 0) if tok else "-", _ci_num(d.get("ef_tokens"), 0),
                         str(row["n_folds_keep_all"]), fixed, _ci_num(e["ece"], 3)])
    lines += [_table(["filter", "target R", "realized recall % (pooled)", "per fold %", "verifier calls / pool",
                      f"calls vs {ref}", f"calls vs {ref}, Bonferroni", f"recall vs {ref} (points)",
                      "EF tokens / pool", f"tokens vs {ref}", "folds keep-all",
                      f"fixed {retain_rule_text()}: recall % / calls", "ECE"], rows), ""]
    for r, c in (op.get("cheapest") or {}).items():
        lines += [f"- {c['sentence']}"]
    if op.get("cheapest"):
        lines += [""]
    ad = (op.get("adaptive") or {}).get("filters") or {}
    if any(f in ad for f in names):
        lines += ["Adaptive scores: the same rule on each filter's value across pools (value: keep what reaches the "
                  "threshold; gap: keep what lies within it of the pool's best) beside the within-pool rank, the "
                  "default. Realized recall / calls per pool; calls against the rank map at the Bonferroni level of "
                  f"this comparison's family (m = {op['adaptive']['multiplicity']['m']}, "
                  f"{100 * op['adaptive']['multiplicity']['level']:.2f}%) and recall against it (points, 95%), "
                  "intervals over pools.", ""]
        rows = []
        for f in (f for f in names if f in ad):
            for r, row in op["filters"][f]["targets"].items():
                rank = row["realized_recall"]["pooled"].get("mean")
                cells = [_name(data, f), r, "-" if rank is None else f"{rank:.3f} / {row['verifier_calls']['mean']:.2f}"]
                for mp in ("value", "gap"):
                    x = ad[f].get(mp, {}).get(r)
                    cells += (["-", "-"] if not x or x["realized_recall"].get("mean") is None else
                              [f"{x['realized_recall']['mean']:.3f} / {x['verifier_calls']['mean']:.2f}",
                               f"{_ci_num(x['difference_vs_rank']['verifier_calls_adjusted'])}; "
                               f"{_ci_pct(x['difference_vs_rank']['realized_recall'])}"])
                rows.append(cells)
        lines += [_table(["filter", "target R", "rank: recall / calls", "value: recall / calls",
                          "value vs rank: calls; recall", "gap: recall / calls", "gap vs rank: calls; recall"], rows), ""]
    na = op.get("new_agent") or {}
    if na.get("pairs"):
        r0 = na["targets"][0]
        lines += [f"A way back for a new agent (target {r0:g}): realized recall % / verifier calls per pool of the "
                  f"new agent's pools against m, its labelled pools in the calibration set. Rule: {na['rule']}.", ""]
        rows = []
        for pair, d in sorted(na["pairs"].items()):
            for mode, conf in (("added", None), ("alone", None), ("alone", 0.9)):
                cells = {x["m"]: x for x in d["rows"] if x["mode"] == mode and x["target"] == r0
                         and x.get("confidence") == conf}
                if not cells:
                    continue
                rows.append([pair, mode + ("" if conf is None else f", confidence {conf:g}")] +
                            ["-" if cells[m]["realized_recall"] is None else
                             f"{100 * cells[m]['realized_recall']:.0f} / {cells[m]['verifier_calls']:.2f}"
                             for m in na["sizes"]])
        lines += [_table(["bank -> new agent", "calibration"] + [f"m={m}" for m in na["sizes"]], rows), ""]
        for pair, d in sorted(na["pairs"].items()):
            got = {k: v for k, v in (d.get("m_restored") or {}).items() if k.endswith(f"R={r0:g}")}
            if got:
                lines += [f"- {pair}: the rule runs in every fold on the new agent's pools alone from m = "
                          + ", ".join(f"{'none of ' + str(na['sizes']) if v is None else v} ({k.rsplit(' R=', 1)[0]})"
                                      for k, v in got.items()) + "."]
        lines += [""]
    return lines
