"""Operating points of every Stage-1 filter on the outer folds (the ``operating_points`` section of summary.json).

Per filter and outer fold k: the calibration pools are the other folds' pools, scored so that fold
k's labels play no part: a filter fitted on labels scores them with the model of the pair of folds
(``protocol.nested``: fitted without their fold group and without fold k); a rule filter or the EF
verifier, which no label trained, with its own scores. The calibration map
(``latentsift.metrics.calibrate``, isotonic) and the keep rule for each target pool recall R
(``latentsift.sift.keep.RecallKeep``, conformal risk control) are fitted on them and applied to fold k's
pools, scored as new pools by the fold's own model. The paper's fixed ``max(3, floor(K/2))`` stays
the selection of the rest of the report; this section only adds the recall-targeted rule beside it,
on full pools.

Per filter and target: realized pool recall per outer fold and pooled, verifier calls (candidates
kept) and EF tokens (the EF verifier's tokens of the kept candidates) per pool, each a mean with a
bootstrap interval over pools, and the paired per-pool differences against ``REFERENCE_RULE`` (the
same rule applied to its scores, same pools, same resamples). Per filter: the ECE of its
calibrated probabilities on the held-out folds with a bootstrap interval over pools and the
reliability bins. A fold whose calibration set is too small for the bound at R, or that has no
clean calibration set (a trained filter without nested scores), keeps every candidate of its pools
(the safe choice) and is counted in ``n_folds_keep_all`` with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._core.validation import LatentSiftError
from ..metrics.calibrate import ece_ci, fit_calibration, reliability
from ..metrics.bootstrap import CI_LEVEL, bootstrap_indices, mean_ci
from ..deploy.operating import PROMISE
from ..sift.keep import GUARANTEE, PAPER_KEEP, CalibrationPools, RecallKeep
from ..sift.keep_adaptive import GapRecallKeep
from ..sift.keep_confident import ConfidentRecallKeep
from ..sift.retain import TARGET_MIN_KEEP
from ..sift.rules import REFERENCE, rule_keys
from ..trajectories.trajectory import Pool, group_pools
from .decide import is_post_hoc
from .folds import group_noun
from .nested import LABEL_FREE
from .settings import hash_key

REFERENCE_RULE = REFERENCE   # paired differences are taken against the registry's reference rule
CURVE_TARGETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99, 1.0)


def filter_table(filt: Any, pools) -> dict[str, dict[str, float]]:
    """instance -> traj_id -> score of one protocol filter on full pools (a draw scorer, or an EF table)."""
    out = {}
    for p in pools:
        ids = sorted(c.traj_id for c in p.candidates)
        if callable(filt):
            out[p.instance_id] = filt(p.instance_id, ids)
        else:
            out[p.instance_id] = {t: (np.nan if filt[t].score is None else float(filt[t].score)) for t in ids}
    return out


def filter_values(filt: Any, pools) -> dict[str, dict[str, float]] | None:
    """instance -> traj_id -> the filter's *value* on full pools: its score before the within-pool ranking (a
    rule's raw score, else the learned logit q_lin), comparable across pools; None when the filter has none
    (an EF table's scores are values already, and a distance-only filter ranks per channel)."""
    table = getattr(filt, "table", None)
    if table is None:
        return None
    out = {}
    for p in pools:
        ids = sorted(c.traj_id for c in p.candidates)
        _, prep = table[p.instance_id]
        v = prep.raw if prep.raw is not None else prep.q_lin
        if v is None:
            return None
        out[p.instance_id] = dict(zip(ids, np.asarray(v, dtype=np.float64)[prep.positions(ids)].tolist()))
    return out


def _cal_pools(pools, table, labels) -> CalibrationPools:
    ids = [sorted(c.traj_id for c in p.candidates) for p in pools]
    return CalibrationPools([p.instance_id for p in pools], ids,
                            [np.array([table[p.instance_id][t] for t in i], dtype=np.float64) for p, i in zip(pools, ids)],
                            [np.array([labels[t] for t in i], dtype=np.int64) for i in ids])


class CleanCalibration:
    """Fold k's calibration pools for each filter, scored without fold k's labels (module docstring)."""

    def __init__(self, fold_pools, filters: Mapping[str, Any], labels: Mapping[str, int], nested: Mapping | None):
        self.fold_pools, self.filters, self.labels = dict(fold_pools), filters, labels
        self.nested = (nested or {}).get("scorers", {})
        self.label_free = set(rule_keys()) | {LABEL_FREE}

    def pools(self, name: str, k: int, pick: Callable | None = None,
              values: bool = False) -> tuple[CalibrationPools | None, str]:
        """The other folds' pools (``pick(pools)``: a part of each, e.g. one agent's candidates) scored
        for fold k, and how (None: no clean calibration, or ``values`` and the filter has none).
        ``values``: the filter's values across pools (``filter_values``) instead of its within-pool ranks."""
        parts = []
        if name in self.label_free:
            how = "label-free scores (no training): the other folds' pools"
            for j, ps in self.fold_pools.items():
                if j != k:
                    ps = list(ps if pick is None else pick(ps))
                    table = (filter_values if values else filter_table)(self.filters[name], ps)
                    if table is None:
                        return None, "no value across pools"
                    parts.append(_cal_pools(ps, table, self.labels))
            return _merge(parts), how
        by_inst = self.nested.get(k, {}).get(name)
        if not by_inst:
            return None, ("no clean calibration: a trained filter without nested scores (2 folds, or a pair "
                          "bank with one class): keep all")
        for j, ps in self.fold_pools.items():
            if j != k:
                ps = [p for p in (ps if pick is None else pick(ps)) if p.instance_id in by_inst]
                if values:
                    table = {}
                    for p in ps:
                        v = filter_values(by_inst[p.instance_id], [p])
                        if v is None:
                            return None, "no value across pools"
                        table |= v
                else:
                    table = {p.instance_id: by_inst[p.instance_id](p.instance_id, sorted(c.traj_id for c in p.candidates))
                             for p in ps}
                parts.append(_cal_pools(ps, table, self.labels))
        return _merge(parts), "nested: the other folds' pools, each scored by the filter fitted without its fold " \
                              "and fold k"


@dataclass(frozen=True)
class KeepRecords:
    """What the recall-targeted keep rule did on every pool of the outer folds, per filter (``keep_records``).

    ``fold_pools``: (fold, its pools) in the folds' order; ``order``: every pool's instance id in that order;
    ``targets``: the asked target recalls, ``all_targets`` those and ``CURVE_TARGETS``; ``per_filter[name]``:
    the calibrated probabilities (``p``, ``y``, ``g``), the paper's fixed rule per pool (``fixed_calls``,
    ``fixed_hit``) and, per target of ``all_targets``, ``by_target[r]``: per pool in ``order`` the candidates
    kept (``calls``), their EF tokens, whether a resolved one was kept (``hit``) and whether the pool has one
    (``pos``), and per fold its status (``folds``)."""

    fold_pools: list
    targets: tuple[float, ...]
    all_targets: tuple[float, ...]
    per_filter: dict[str, dict]
    labels: dict[str, int]                 # trajectory id -> label
    tokens: dict[str, float] | None        # trajectory id -> the EF verifier's tokens (None: no EF table)
    clean: "CleanCalibration"              # the calibration the records were fitted on

    @property
    def order(self) -> list[str]:
        return [p.instance_id for _, ps in self.fold_pools for p in ps]


def keep_records(run, trajs, folds, filters: Mapping[str, Any], ef: Mapping | None = None, *,
                 nested: Mapping | None = None, targets: Sequence[float] | None = None) -> KeepRecords:
    """The recall-targeted keep rule of every filter on every outer fold's pools, calibrated on the other
    folds without the fold's labels (module docstring), pool by pool (``KeepRecords``). ``targets``: the
    target recalls (default: the run's ``target_recalls``); ``CURVE_TARGETS`` are run as well."""
    s = run.settings
    targets = tuple(targets if targets is not None else s.target_recalls)
    labels = {t.traj_id: int(t.label) for t in trajs}
    tokens = {t: float(r.n_in + r.n_out) for t, r in ef.items()} if ef is not None else None
    fold_pools = [(f.k, f.eval_pools) for f in run.iter_folds(trajs, folds, pools=group_pools(trajs))]
    if len(fold_pools) < 2:
        raise LatentSiftError("operating points need two outer folds or more.")
    all_targets = tuple(sorted(set(targets) | set(CURVE_TARGETS)))
    tables = {name: {k: filter_table(filt, ps) for k, ps in fold_pools} for name, filt in filters.items()}
    clean = CleanCalibration(fold_pools, filters, labels, nested)
    per_filter: dict[str, dict] = {}
    for name in filters:
        res = {"p": [], "y": [], "g": [], "fixed_calls": [], "fixed_hit": [],
               "by_target": {r: {"calls": [], "tokens": [], "hit": [], "pos": [], "folds": []} for r in all_targets}}
        for k, ps in fold_pools:
            cal, how = clean.pools(name, k)
            test = _cal_pools(ps, tables[name][k], labels)
            for t_ids, sc, y in zip(test.traj_ids, test.scores, test.labels):  # the paper's fixed rule, same scores
                m = PAPER_KEEP.keep(sc, t_ids)
                res["fixed_calls"].append(float(m.sum()))
                if y.any():
                    res["fixed_hit"].append(float((m & (y == 1)).any()))
            cmap = fit_calibration(*cal.flat()) if cal is not None and cal.scores else None
            if cmap is not None:
                for iid, sc, y in zip(test.instance_ids, test.scores, test.labels):
                    res["p"].append(cmap.predict(sc))
                    res["y"].append(y)
                    res["g"] += [iid] * len(y)
            for r in all_targets:
                acc = res["by_target"][r]
                op, status = None, how
                if cmap is not None:
                    try:
                        op = RecallKeep(r, min_keep=TARGET_MIN_KEEP, seed=s.seed).fit(cal)
                        status = "ok"
                    except LatentSiftError:
                        status = f"calibration too small for R={r:g} ({cal.n_positive()} pools with a " \
                                 f"resolved candidate): keep all"
                hits, n0 = [], len(acc["calls"])
                for t_ids, sc, y in zip(test.traj_ids, test.scores, test.labels):
                    m = np.ones(len(t_ids), dtype=bool) if op is None else op.keep(sc, t_ids)
                    acc["calls"].append(float(m.sum()))
                    acc["tokens"].append(float(sum(tokens[t] for t, kk in zip(t_ids, m) if kk)) if tokens else np.nan)
                    acc["pos"].append(bool(y.any()))
                    acc["hit"].append(bool((m & (y == 1)).any()))
                    if y.any():
                        hits.append(acc["hit"][-1])
                acc["folds"].append({"fold": k, "status": status, "calibration": how.split(":")[0],
                                     "n_pools": len(test.scores), "n_pools_with_resolved": len(hits),
                                     "realized_recall": float(np.mean(hits)) if hits else None,
                                     "verifier_calls": float(np.mean(acc["calls"][n0:])) if test.scores else None,
                                     "n_candidates": float(np.mean([len(t) for t in test.traj_ids]))
                                     if test.scores else None,
                                     **({} if op is None else {k2: v for k2, v in op.to_dict().items()
                                                               if k2 in ("threshold", "p_threshold",
                                                                         "n_calibration_pools", "n_lost_allowed")})})
        per_filter[name] = res
    return KeepRecords(fold_pools, targets, all_targets, per_filter, labels, tokens, clean)


def operating_points(run, trajs, folds, filters: Mapping[str, Any], ef: Mapping | None = None, *,
                     nested: Mapping | None = None, targets: Sequence[float] | None = None,
                     reference: str = REFERENCE_RULE, records: KeepRecords | None = None) -> dict:
    """The ``operating_points`` section (module docstring). ``filters``: name -> draw scorer or EF table;
    ``nested``: ``protocol.nested.nested_calibration`` (the trained filters' clean calibration scores);
    ``records``: ``keep_records`` of the same arguments, when the caller keeps them (else computed here)."""
    s = run.settings
    records = records if records is not None else keep_records(run, trajs, folds, filters, ef, nested=nested,
                                                               targets=targets)
    targets, all_targets, per_filter, fold_pools = (records.targets, records.all_targets, records.per_filter,
                                                    records.fold_pools)
    labels, tokens, clean = records.labels, records.tokens, records.clean
    n_pools = len(records.order)
    boot = bootstrap_indices(n_pools, s.n_boot, np.random.default_rng(s.seed))
    fixed_calls = np.array([PAPER_KEEP.count(len(p.candidates)) for _, ps in fold_pools for p in ps], dtype=np.float64)
    out: dict[str, Any] = {
        "targets": list(targets), "curve_targets": list(all_targets), "reference": reference if reference in filters else None,
        "rule": "per pool: the best candidate and every candidate whose score reaches the fold's threshold; threshold by "
                "conformal risk control on the other folds' pools holding a resolved candidate, scored without the "
                f"fold's labels (a trained filter's calibration pool scored by a bank without its "
                f"{group_noun(s.group_by, 1)} and without the fold's; a rule or the EF verifier by its own scores); "
                "a fold whose calibration set is too small, or that has none, keeps all",
        "guarantee": GUARANTEE, "promise": PROMISE,
        "approximation": "nested calibration scores come from banks of K - 2 folds, the held-out fold's scores from "
                         "a bank of K - 1: exchangeable only up to that difference in bank size",
        "calibration": "isotonic regression on the other folds' candidates, scored without the held-out fold's labels: "
                       "nested (a trained filter refitted on the groups of neither fold) or label-free (rules, the EF "
                       "verifier)",
        "nested": [dict(p) for p in (nested or {}).get("pairs", [])],
        "intervals": f"95% bootstrap over pools ({s.n_boot} resamples, paired across filters)",
        "fixed_rule_calls": mean_ci(fixed_calls, boot), "filters": {}}
    ref = per_filter.get(reference)
    # one multiplicity rule for the family: every calls difference against the reference and every
    # cheapest-against-the-next comparison, at the Bonferroni level 1 - 0.05 / m
    n_family = (len(per_filter) - (ref is not None)) * len(targets) + len(targets)
    adj = 1.0 - (1.0 - CI_LEVEL) / max(n_family, 1)
    out["multiplicity"] = {"m": n_family, "level": adj,
                           "rule": "Bonferroni over the family: every calls difference against the reference at "
                                   "each target, and each target's cheapest filter against the next cheapest"}
    fixed_rb = None
    for name, res in per_filter.items():
        p = np.concatenate(res["p"]) if res["p"] else np.zeros(0)
        y = np.concatenate(res["y"]) if res["y"] else np.zeros(0)
        if fixed_rb is None and res["fixed_hit"]:
            fixed_rb = bootstrap_indices(len(res["fixed_hit"]), s.n_boot, np.random.default_rng(s.seed + 1))
        entry: dict[str, Any] = {"post_hoc": is_post_hoc(name),
                                 "ece": ece_ci(p, y, res["g"], n_boot=s.n_boot, seed=s.seed),
                                 "reliability": reliability(p, y), "targets": {}, "curve": [],
                                 "fixed_rule": {"verifier_calls": mean_ci(np.array(res["fixed_calls"]), boot),
                                                "realized_recall": mean_ci(np.array(res["fixed_hit"]), fixed_rb)
                                                if res["fixed_hit"] else {"mean": None}}}
        for r in all_targets:
            acc = res["by_target"][r]
            row = _target_row(acc, boot, ref["by_target"][r] if ref is not None and name != reference else None,
                              tokens is not None, s, adj if r in targets else None)
            entry["curve"].append({"target": r, "recall": row["realized_recall"]["pooled"]["mean"],
                                   "verifier_calls": row["verifier_calls"]["mean"]})
            if r in targets:
                entry["targets"][f"{r:g}"] = row
        out["filters"][name] = entry
    out["cheapest"] = {f"{r:g}": _cheapest(per_filter, r, boot, adj) for r in targets}
    out["adaptive"] = adaptive_points(fold_pools, filters, clean, labels, per_filter, boot, targets, s)
    out["new_agent"] = new_agent_curves(run, trajs, fold_pools, filters, clean, targets=targets)
    return out


def _merge(parts: Sequence[CalibrationPools]) -> CalibrationPools:
    return CalibrationPools([i for c in parts for i in c.instance_ids], [t for c in parts for t in c.traj_ids],
                            [x for c in parts for x in c.scores], [x for c in parts for x in c.labels])


def _cheapest(per_filter: Mapping[str, dict], r: float, boot: np.ndarray, level: float) -> dict:
    """Among the filters whose pooled realized recall reaches ``r``: the one with the fewest calls, the next,
    their paired calls difference at the family's Bonferroni ``level`` and whether it is decided (the
    interval lies below 0), in one sentence."""
    reach = []
    for name, res in per_filter.items():
        acc = res["by_target"][r]
        hit = [h for h, p in zip(acc["hit"], acc["pos"]) if p]
        if hit and np.mean(hit) >= r:
            reach.append((float(np.mean(acc["calls"])), name, float(np.mean(hit))))
    reach.sort()
    if not reach:
        return {"filter": None, "sentence": f"At R = {r:g} no filter reaches the target pooled over the folds."}
    (c0, f0, r0), rest = reach[0], reach[1:]
    out: dict[str, Any] = {"filter": f0, "post_hoc": is_post_hoc(f0), "verifier_calls": c0, "realized_recall": r0,
                           "n_reaching": len(reach)}
    tag = " (chosen after the folds were seen)" if out["post_hoc"] else ""
    if not rest:
        out |= {"decided": False, "sentence": f"At R = {r:g} only `{f0}`{tag} reaches the target ({c0:.2f} calls, "
                                              f"realized recall {r0:.3f}); nothing to compare it with."}
        return out
    c1, f1, r1 = rest[0]
    d = mean_ci(np.array(per_filter[f0]["by_target"][r]["calls"]) - np.array(per_filter[f1]["by_target"][r]["calls"]),
                boot, level)
    decided = d["hi"] < 0
    out |= {"next": f1, "next_calls": c1, "next_realized_recall": r1, "difference": d, "decided": bool(decided),
            "sentence": f"At R = {r:g} the cheapest filter reaching the target is `{f0}`{tag}: {c0:.2f} calls per pool "
                        f"at realized recall {r0:.3f}, against `{f1}` {c1:.2f} at {r1:.3f}; difference "
                        f"{d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}] at the family's Bonferroni level "
                        f"{100 * level:.2f}%: " + ("decided." if decided else "not decided (the interval "
                                                                                "reaches 0).")}
    return out


def _target_row(acc: dict, boot: np.ndarray, ref: dict | None, with_tokens: bool, s,
                adjusted: float | None = None) -> dict:
    calls, hit, pos = np.array(acc["calls"]), np.array(acc["hit"], float), np.array(acc["pos"])
    pos_idx = np.flatnonzero(pos)
    rb = bootstrap_indices(pos_idx.size, s.n_boot, np.random.default_rng(s.seed + 1)) if pos_idx.size else None
    row: dict[str, Any] = {
        "realized_recall": {"per_fold": acc["folds"],
                            "pooled": mean_ci(hit[pos_idx], rb) if rb is not None else {"mean": None}},
        "verifier_calls": mean_ci(calls, boot),
        "ef_tokens": mean_ci(np.array(acc["tokens"]), boot) if with_tokens else None,
        "n_folds_keep_all": sum(f["status"] != "ok" for f in acc["folds"])}
    if ref is not None:
        d = {"verifier_calls": mean_ci(calls - np.array(ref["calls"]), boot)}
        if adjusted is not None:
            d["verifier_calls_adjusted"] = mean_ci(calls - np.array(ref["calls"]), boot, adjusted) | {"level": adjusted}
        if with_tokens:
            d["ef_tokens"] = mean_ci(np.array(acc["tokens"]) - np.array(ref["tokens"]), boot)
        if rb is not None:
            d["realized_recall"] = mean_ci(hit[pos_idx] - np.array(ref["hit"], float)[pos_idx], rb)
        row["difference_vs_reference"] = d
    return row


# ---------------------------------------------------------------------- adaptive scores: the value across pools
ADAPTIVE_MAPS = {"value": RecallKeep, "gap": GapRecallKeep}   # score map -> keep rule on the filter's values


def adaptive_points(fold_pools, filters: Mapping[str, Any], clean: CleanCalibration, labels: Mapping[str, int],
                    per_filter: Mapping[str, dict], boot: np.ndarray, targets: Sequence[float], s) -> dict:
    """The recall-targeted rule on each filter's value across pools (``filter_values``) instead of its
    within-pool rank, beside the rank map of the same filter: per score map of ``ADAPTIVE_MAPS`` ("value":
    keep the values reaching the threshold; "gap": keep those within the threshold of the pool's best,
    ``sift.keep_adaptive``) and target, the realized recall and verifier calls, and the paired per-pool
    differences against the rank map (same pools, same resamples; the calls difference also at the Bonferroni
    level of this section's family). The calibration is clean as for the rank map (``CleanCalibration``). A
    filter without a value (the EF verifier's scores are values already; a distance-only filter) is left out."""
    have = {name: {k: filter_values(filt, ps) for k, ps in fold_pools} for name, filt in filters.items()}
    have = {name: t for name, t in have.items() if all(v is not None for v in t.values())}
    m_family = max(1, len(have) * len(ADAPTIVE_MAPS) * len(targets))
    level = 1.0 - (1.0 - CI_LEVEL) / m_family
    out: dict[str, Any] = {"maps": {m: cls.name for m, cls in ADAPTIVE_MAPS.items()}, "filters": {},
                           "multiplicity": {"m": m_family, "level": level,
                                            "rule": "Bonferroni over this section's family: every calls difference "
                                                    "against the rank map, per filter, map and target"}}
    for name, tests in have.items():
        cals = {k: clean.pools(name, k, values=True)[0] for k, _ in fold_pools}
        entry = {}
        for mp, cls in ADAPTIVE_MAPS.items():
            rows = {}
            for r in targets:
                calls, hit, pos, keep_all = [], [], [], 0
                for k, ps in fold_pools:
                    op = None
                    if cals[k] is not None and cals[k].scores:
                        try:
                            op = cls(r, min_keep=TARGET_MIN_KEEP, seed=s.seed).fit(cals[k])
                        except LatentSiftError:
                            op = None
                    keep_all += op is None
                    test = _cal_pools(ps, tests[k], labels)
                    for t_ids, sc, y in zip(test.traj_ids, test.scores, test.labels):
                        m = np.ones(len(t_ids), dtype=bool) if op is None else op.keep(sc, t_ids)
                        calls.append(float(m.sum()))
                        pos.append(bool(y.any()))
                        hit.append(bool((m & (y == 1)).any()))
                rank = per_filter[name]["by_target"][r]
                calls, hit, pos = np.array(calls), np.array(hit, float), np.array(pos)
                idx = np.flatnonzero(pos)
                rb = bootstrap_indices(idx.size, s.n_boot, np.random.default_rng(s.seed + 1)) if idx.size else None
                rows[f"{r:g}"] = {
                    "realized_recall": mean_ci(hit[idx], rb) if rb is not None else {"mean": None},
                    "verifier_calls": mean_ci(calls, boot), "n_folds_keep_all": keep_all,
                    "difference_vs_rank": {
                        "verifier_calls": mean_ci(calls - np.array(rank["calls"]), boot),
                        "verifier_calls_adjusted": mean_ci(calls - np.array(rank["calls"]), boot, level),
                        "realized_recall": mean_ci(hit[idx] - np.array(rank["hit"], float)[idx], rb)
                        if rb is not None else {"mean": None}}}
            entry[mp] = rows
        out["filters"][name] = entry
    return out


# ---------------------------------------------------------------------- a way back for a new agent
NEW_AGENT_POOLS = (0, 5, 10, 20, 40, 80)
NEW_AGENT_CONFIDENCE = 0.9   # the high-probability mode's confidence on the way back (alone)


def _subset(pools, agent: str):
    return [Pool(p.instance_id, [c for c in p.candidates if c.agent == agent]) for p in pools
            if any(c.agent == agent for c in p.candidates)]


def new_agent_curves(run, trajs, fold_pools, filters: Mapping[str, Any], clean: CleanCalibration, *,
                     targets: Sequence[float], sizes: Sequence[int] = NEW_AGENT_POOLS) -> dict:
    """Agent transfer (bank and scorer of agent A, ``transfer:A``) on the pools of another agent B alone:
    realized recall and verifier calls of the recall-targeted rule against m, the number of labelled
    pools of B (from the other folds, in a seeded hash order) in the calibration set.

    "added": A's pools of the other folds plus m pools of B; "alone": the m pools of B only (exchangeable
    with B's new pools: the guarantee holds once m >= 1/(1-R) - 1; below that the fold keeps all), and
    "alone" in the high-probability mode (``NEW_AGENT_CONFIDENCE``; ``confidence`` per row). Both
    scored without the held-out fold's labels (``clean``: nested); a fold without nested scores keeps all.
    ``m_restored``: per promise and target, the smallest m at which every fold's rule runs (the bound
    exists on the m pools of B alone), None if no m of ``sizes`` does.
    """
    s = run.settings
    labels = {t.traj_id: int(t.label) for t in trajs}
    agents = sorted({t.agent for t in trajs})
    out: dict[str, Any] = {"sizes": list(sizes), "targets": list(targets), "pairs": {},
                           "rule": "calibration = the bank agent's pools of the other folds plus m labelled pools of "
                                   "the new agent (added), or those m pools alone (alone); test = the new agent's "
                                   "candidates of the held-out fold's pools, scored by the bank agent's bank and scorer"}
    for name, filt in filters.items():
        if not name.startswith("transfer:"):
            continue
        a = name.split(":", 1)[1]
        for b in (x for x in agents if x != a):
            sub_b = {k: _subset(ps, b) for k, ps in fold_pools}
            cal_b = {k: _cal_pools(pb, filter_table(filt, pb), labels) for k, pb in sub_b.items()}  # the tests
            clean_a = {k: clean.pools(name, k, lambda ps: _subset(ps, a))[0] for k, _ in fold_pools}
            clean_b = {k: clean.pools(name, k, lambda ps: _subset(ps, b))[0] for k, _ in fold_pools}
            rows = []
            for mode, conf in (("added", None), ("alone", None), ("alone", NEW_AGENT_CONFIDENCE)):
                for m in sizes:
                    for r in targets:
                        calls, hits, keep_all, used = [], [], 0, []
                        for k, _ in fold_pools:
                            others_b = clean_b[k] or CalibrationPools([], [], [], [])
                            pick = sorted(range(len(others_b.instance_ids)),
                                          key=lambda i: hash_key(s.seed, others_b.instance_ids[i]))[:m]
                            extra = CalibrationPools([others_b.instance_ids[i] for i in pick],
                                                     [others_b.traj_ids[i] for i in pick],
                                                     [others_b.scores[i] for i in pick], [others_b.labels[i] for i in pick])
                            parts = ([clean_a[k]] if mode == "added" and clean_a[k] is not None else []) + [extra]
                            cal = _merge(parts)
                            used.append(len(pick))
                            op = None
                            if cal.scores and clean_b[k] is not None:
                                try:
                                    op = (RecallKeep(r, seed=s.seed) if conf is None else
                                          ConfidentRecallKeep(r, conf, seed=s.seed)).fit(cal)
                                except LatentSiftError:
                                    op = None
                            keep_all += op is None
                            test = cal_b[k]
                            for t_ids, sc, y in zip(test.traj_ids, test.scores, test.labels):
                                msk = np.ones(len(t_ids), dtype=bool) if op is None else op.keep(sc, t_ids)
                                calls.append(float(msk.sum()))
                                if y.any():
                                    hits.append(bool((msk & (y == 1)).any()))
                        rows.append({"mode": mode, "confidence": conf, "m": m, "m_used_min": min(used), "target": r,
                                     "n_test_pools": len(calls),
                                     "realized_recall": float(np.mean(hits)) if hits else None,
                                     "verifier_calls": float(np.mean(calls)) if calls else None,
                                     "n_folds_keep_all": keep_all})
            restored = {}
            for mode, conf in (("alone", None), ("alone", NEW_AGENT_CONFIDENCE)):
                for r in targets:
                    ok = [x["m"] for x in rows if x["mode"] == mode and x["confidence"] == conf and x["target"] == r
                          and x["n_folds_keep_all"] == 0]
                    restored[f"{'expected' if conf is None else f'confidence {conf:g}'} R={r:g}"] = min(ok) if ok else None
            out["pairs"][f"{a} -> {b}"] = {"filter": name, "bank_agent": a, "new_agent": b,
                                           "n_new_agent_pools": sum(len(c.scores) for c in cal_b.values()),
                                           "m_restored": restored, "rows": rows}
    return out
