"""Adaptive keep rules (``latentsift.sift.keep_adaptive``): the recall-targeted rule on the score's value
across pools, and its measurement beside the rank map (``operating_points``' ``adaptive`` section)."""
from __future__ import annotations

import numpy as np
import pytest

from latentsift.report.sections import _operating_markdown
from latentsift.protocol.operating import ADAPTIVE_MAPS, CleanCalibration, filter_values, operating_points
from latentsift.sift.keep import CalibrationPools, RecallKeep, crc_threshold, keep_rule, keep_rules, pool_miss_score
from latentsift.sift.keep_adaptive import GapRecallKeep, gap_scores
from latentsift.sift.rank import normalized_ranks


def _pools(rng, n, k=6):
    """Pools whose values differ in spread: a confident pool has one candidate far above the rest."""
    s = rng.standard_normal((n, k)) * rng.uniform(0.2, 3.0, (n, 1))
    y = (rng.random((n, k)) < 1 / (1 + np.exp(-2 * s))).astype(int)
    ids = [[f"p{i}/c{j}" for j in range(k)] for i in range(n)]
    return CalibrationPools([f"p{i}" for i in range(n)], ids, list(s), list(y))


def test_the_gap_rule_is_conformal_risk_control_on_the_distance_to_the_pools_best():
    rng = np.random.default_rng(3)
    cal = _pools(rng, 60)
    rule = GapRecallKeep(0.9).fit(cal)
    gaps = [gap_scores(s) for s in cal.scores]
    u = np.array([pool_miss_score(g, y, t) for g, y, t in zip(gaps, cal.labels, cal.traj_ids)])
    assert rule.threshold_ == crc_threshold(u[~np.isnan(u)], 0.1) and rule.threshold_ <= 0
    lost = [not (rule.keep(s, t) & (y == 1)).any() for s, y, t in zip(cal.scores, cal.labels, cal.traj_ids) if y.any()]
    assert sum(lost) <= rule.n_lost_allowed_
    # per pool: the best, and every candidate within -threshold of it; shifting a pool's values changes nothing
    s, t = cal.scores[0], cal.traj_ids[0]
    want = (s >= s.max() + rule.threshold_) | (s == s.max())
    assert rule.keep(s, t).tolist() == want.tolist() == rule.keep(s + 100.0, t).tolist()
    assert np.isnan(gap_scores([np.nan, 1.0, 3.0])[0]) and gap_scores([np.nan, 1.0, 3.0])[1:].tolist() == [-2.0, 0.0]
    assert "gap-recall" in keep_rules() and isinstance(keep_rule("gap-recall", target_recall=0.9), GapRecallKeep)


def test_on_within_pool_ranks_the_gap_rule_is_the_rank_rule():
    """Ranks have the same maximum (1) in every pool, so keeping those within tau of the best is a threshold
    on the rank: the same masks as ``RecallKeep``."""
    rng = np.random.default_rng(4)
    raw = _pools(rng, 80)
    ranked = CalibrationPools(raw.instance_ids, raw.traj_ids, [normalized_ranks(s) for s in raw.scores], raw.labels)
    a, b = RecallKeep(0.9).fit(ranked), GapRecallKeep(0.9).fit(ranked)
    assert all((a.keep(s, t) == b.keep(s, t)).all() for s, t in zip(ranked.scores, ranked.traj_ids))


def test_on_the_shared_pools_a_confident_pool_keeps_fewer_than_an_uncertain_one(shared_pools):
    """What is tested: on real pools (shortest-in-characters, fold 0 held out, calibrated on the other folds'
    pools at R = 0.95), the rank rule keeps the same number of candidates in every 6-candidate pool of the
    fold (its score is the within-pool rank), while the value and gap rules keep from 1 to 6 depending on the
    pool; and the operating points carry every label-free filter's adaptive rows beside its rank rows, each
    fold running the rule, with the paired differences against the rank map."""
    run, trajs, folds, filters = shared_pools
    labels = {t.traj_id: int(t.label) for t in trajs}
    fold_pools = [(f.k, f.eval_pools) for f in run.iter_folds(trajs, folds)]
    clean = CleanCalibration(fold_pools, filters, labels, None)
    held = [p for p in fold_pools[0][1] if len(p.candidates) == 6]
    rank_cal, _ = clean.pools("shortest_chars", 0)
    val_cal, _ = clean.pools("shortest_chars", 0, values=True)
    vals = filter_values(filters["shortest_chars"], held)
    counts = {}
    for mp, rule, cal in (("rank", RecallKeep(0.95), rank_cal), ("value", RecallKeep(0.95), val_cal),
                          ("gap", GapRecallKeep(0.95), val_cal)):
        rule.fit(cal)
        counts[mp] = []
        for p in held:
            ids = sorted(c.traj_id for c in p.candidates)
            sc = (filters["shortest_chars"](p.instance_id, ids) if mp == "rank" else vals[p.instance_id])
            counts[mp].append(int(rule.keep(np.array([sc[t] for t in ids]), ids).sum()))
    assert len(held) >= 30 and len(set(counts["rank"])) == 1, counts["rank"]
    for mp in ("value", "gap"):
        assert len(set(counts[mp])) >= 3 and min(counts[mp]) < counts["rank"][0] < max(counts[mp]), (mp, counts[mp])
    op = operating_points(run, trajs, folds, filters, None, targets=(0.9, 0.95))
    ad = op["adaptive"]
    assert ad["maps"] == {"value": "target-recall", "gap": "gap-recall"} and set(ADAPTIVE_MAPS) == {"value", "gap"}
    assert set(ad["filters"]) == set(filters)
    assert ad["multiplicity"]["m"] == len(filters) * 2 * 2 and ad["multiplicity"]["level"] == pytest.approx(
        1 - 0.05 / ad["multiplicity"]["m"])
    for name, entry in ad["filters"].items():
        for mp in ("value", "gap"):
            for r in ("0.9", "0.95"):
                row, rank = entry[mp][r], op["filters"][name]["targets"][r]
                assert row["n_folds_keep_all"] == 0
                d = row["difference_vs_rank"]["verifier_calls"]
                assert d["mean"] == pytest.approx(row["verifier_calls"]["mean"] - rank["verifier_calls"]["mean"])
                a = row["difference_vs_rank"]["verifier_calls_adjusted"]
                assert a["lo"] <= d["lo"] <= d["mean"] <= d["hi"] <= a["hi"]
    md = "\n".join(_operating_markdown({"operating_points": op, "settings": {"headline": list(filters)}}))
    assert "Adaptive scores" in md and "| gap vs rank: calls; recall |" in md
    row = ad["filters"]["shortest_chars"]["gap"]["0.95"]
    assert f"{row['realized_recall']['mean']:.3f} / {row['verifier_calls']['mean']:.2f}" in md
