import csv
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from latentsift.metrics.diagnostics import (auc_difference_ci, paired_bootstrap, per_agent_auc, retention_difference_ci,
                                            same_agent_auc, spearman_with, within_pool_auc)
from latentsift.metrics.score_table import diagnostics_table
from latentsift.sift.rank import grouped_normalized_ranks

# The 6 runs without test feedback in the trajectories (README: the acr-val-* runs leak the label).
RUNS = ["acr-run-1", "acr-run-2", "acr-run-3", "cost_2_1", "cost_2_2", "cost_2_3"]

# Hand-computed pool set: a (ties), b (NaN = lowest), c (single candidate), d (no resolved), e (NaN vs NaN).
INST = np.array(list("aaabbbcddee"))
LAB = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0])
SCORE = np.array([3, 1, 3, 2, np.nan, 4, 5, 9, 0, np.nan, np.nan])
AGENT = np.array(["x", "y", "x", "x", "x", "y", "x", "x", "y", "y", "y"])
# pairs: a: 3>1 -> 1, 3=3 -> 1/2; b: 2>NaN -> 1, 2<4 -> 0; e: NaN=NaN -> 1/2  => 3 / 5
# per instance: a 3/4, b 1/2, e 1/2 => mean 7/12


def brute_auc(inst, lab, score, keep_pair=lambda i, j: True, weighting="pairs"):
    s = np.where(np.isnan(score), -np.inf, score)
    per = {}
    for i in range(len(inst)):
        for j in range(len(inst)):
            if inst[i] == inst[j] and lab[i] == 1 and lab[j] == 0 and keep_pair(i, j):
                per.setdefault(inst[i], []).append(1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0)
    if not per:
        return np.nan, 0
    allw = [w for v in per.values() for w in v]
    value = np.mean(allw) if weighting == "pairs" else np.mean([np.mean(v) for v in per.values()])
    return value, len(allw)


@pytest.fixture(scope="module")
def real(data_dir):
    """The shared data's candidates.csv (runs RUNS) as a diagnostics_table candidate table."""
    with (data_dir / "candidates.csv").open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["run"] in RUNS]
    return {"instance_id": np.array([r["instance_id"] for r in rows]),
            "traj_id": np.array([f"{r['run']}/{r['instance_id']}" for r in rows]),
            "agent": np.array([r["agent"] for r in rows]),
            "label": np.array([int(r["resolved"]) for r in rows], dtype=np.int8),
            "n_chars": np.array([int(r["trajectory_chars"]) for r in rows], dtype=np.int64),
            "n_steps": np.array([int(r["n_steps"]) for r in rows], dtype=np.int64)}


# ----------------------------------------------------------------------------- AUC

def test_hand_computed_auc_with_ties_nan_and_single_pools():
    r = within_pool_auc(INST, LAB, SCORE)
    assert r.auc == pytest.approx(3 / 5) and r.n_pairs == 5 and r.n_instances == 3
    r = within_pool_auc(INST, LAB, SCORE, weighting="instances")
    assert r.auc == pytest.approx(7 / 12) and r.n_pairs == 5 and r.n_instances == 3


def test_same_agent_and_per_agent_auc_hand_computed():
    # same-agent pairs: a (0,2) x-x tie 1/2; b (3,4) x-x 2 > NaN -> 1; e (9,10) y-y NaN = NaN -> 1/2
    r = same_agent_auc(INST, LAB, SCORE, AGENT)
    assert r.auc == pytest.approx(2 / 3) and r.n_pairs == 3 and r.n_instances == 3
    per = per_agent_auc(INST, LAB, SCORE, AGENT)
    assert per["x"].auc == pytest.approx(3 / 4) and per["x"].n_pairs == 2
    assert per["y"].auc == pytest.approx(1 / 2) and per["y"].n_pairs == 1


def test_no_mixed_pool_gives_nan_and_zero_pairs():
    r = within_pool_auc(["a", "a", "b"], [1, 1, 0], [1.0, 2.0, 3.0])
    assert np.isnan(r.auc) and r.n_pairs == 0 and r.n_instances == 0


def test_auc_ignores_cross_instance_pairs():
    # a globally perfect score that is inverted inside every pool has within-pool AUC 0
    inst = ["a", "a", "b", "b"]
    assert within_pool_auc(inst, [1, 0, 1, 0], [10.0, 11.0, 0.0, 1.0]).auc == 0.0


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1), st.integers(0, 1),
                          st.one_of(st.integers(-2, 2).map(float), st.just(np.nan))), min_size=1, max_size=25),
       st.sampled_from(["pairs", "instances"]), st.randoms(use_true_random=False))
def test_auc_matches_brute_force_and_is_order_invariant(rows, weighting, rnd):
    inst = np.array([f"i{r[0]}" for r in rows])
    agent = np.array(["p", "q"])[[r[1] for r in rows]]
    lab = np.array([r[2] for r in rows])
    score = np.array([r[3] for r in rows])
    want, n_pairs = brute_auc(inst, lab, score, weighting=weighting)
    got = within_pool_auc(inst, lab, score, weighting=weighting)
    assert got.n_pairs == n_pairs
    np.testing.assert_allclose(got.auc, want)
    want_sa, _ = brute_auc(inst, lab, score, lambda i, j: agent[i] == agent[j], weighting)
    np.testing.assert_allclose(same_agent_auc(inst, lab, score, agent, weighting=weighting).auc, want_sa)
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    np.testing.assert_allclose(within_pool_auc(inst[perm], lab[perm], score[perm], weighting=weighting).auc, want)


# ----------------------------------------------------------------------------- Spearman

def test_length_score_gives_spearman_plus_minus_one_pooled_and_within():
    chars = np.array([100, 50, 50, 300, 10, 20, 20, 7])
    inst = ["a", "a", "a", "b", "b", "c", "c", "d"]
    for sign in (-1.0, 1.0):
        score = sign * (2.0 * chars + 1)
        assert spearman_with(score, chars).rho == pytest.approx(sign)
        w = spearman_with(score, chars, inst)
        # c is constant in chars (and so in the score) and d has one candidate: both left out
        assert w.rho == pytest.approx(sign) and w.n_instances == 2 and w.n == 5


def test_within_spearman_removes_between_instance_signal():
    # inside each pool the score is anti-correlated with length; pooled over pools it is correlated
    chars = np.array([1, 2, 3, 101, 102, 103])
    score = np.array([3.0, 2.0, 1.0, 103.0, 102.0, 101.0])
    inst = ["a"] * 3 + ["b"] * 3
    assert spearman_with(score, chars).rho > 0.5
    assert spearman_with(score, chars, inst).rho == pytest.approx(-1.0)


def test_spearman_agent_strings_are_coded_zero_one():
    score = np.array([0.1, 0.9, 0.3, 0.8, np.nan])
    agent = np.array(["acr", "sweagent", "acr", "sweagent", "acr"])
    coded = (agent == "sweagent").astype(float)
    assert spearman_with(score, agent).rho == pytest.approx(spearman_with(score, coded).rho)
    assert spearman_with(score, agent).rho > 0.8
    with pytest.raises(ValueError, match="two levels"):
        spearman_with(score, ["a", "b", "c", "a", "b"])


def test_vectorised_grouped_ranks_match_rank_module():
    from latentsift.metrics.diagnostics import _grouped_ranks
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        code = rng.integers(0, 6, n)
        v = rng.integers(0, 4, n).astype(float)
        v[rng.random(n) < 0.2] = np.nan
        code = np.unique(code, return_inverse=True)[1]
        np.testing.assert_allclose(_grouped_ranks(v, code), grouped_normalized_ranks(v, code))


# ----------------------------------------------------------------------------- bootstrap

def synthetic(n_inst, seed, n_per=6):
    rng = np.random.default_rng(seed)
    inst = np.repeat([f"i{k}" for k in range(n_inst)], n_per)
    lab = (rng.random(inst.size) < 0.3).astype(int)
    good = lab + rng.normal(0, 1.0, inst.size)            # informative score
    noise = rng.normal(0, 1.0, inst.size)                  # uninformative score
    return {"instance_id": inst, "label": lab}, good, noise


def test_bootstrap_contains_estimate_and_narrows_with_more_instances():
    widths = []
    for n_inst in (40, 640):
        table, good, noise = synthetic(n_inst, seed=n_inst)
        d = auc_difference_ci(table, good, noise, n_boot=500, seed=1)
        assert d.lo <= d.estimate <= d.hi and d.n_valid == 500 and d.n_instances == n_inst
        widths.append(d.hi - d.lo)
    assert widths[1] < 0.5 * widths[0]                      # ~1/sqrt(16) = 1/4 expected


def test_self_difference_is_exactly_zero():
    table, good, _ = synthetic(50, seed=0)
    d = auc_difference_ci(table, good, good.copy(), n_boot=200, seed=5)
    assert (d.estimate, d.lo, d.hi) == (0.0, 0.0, 0.0) and d.a == d.b
    r = retention_difference_ci([0.5, 1.0, np.nan], [0.5, 1.0, 0.0], n_boot=100)
    assert (r.estimate, r.lo, r.hi) == (0.0, 0.0, 0.0)


def test_auc_bootstrap_equals_explicit_resampling():
    # multiplicity weighting must equal building each resampled table and recomputing the AUC
    table, good, noise = synthetic(12, seed=7, n_per=4)
    n_boot, seed = 30, 11
    d = auc_difference_ci(table, good, noise, n_boot=n_boot, seed=seed)
    ids = np.unique(table["instance_id"])
    draws = np.random.default_rng(seed).integers(0, ids.size, size=(n_boot, ids.size))
    diffs = []
    for row in draws:
        idx = np.concatenate([np.flatnonzero(table["instance_id"] == ids[k]) for k in row])
        new_inst = np.concatenate([[f"{r}-{k}"] * int((table["instance_id"] == ids[k]).sum())
                                   for r, k in enumerate(row)])   # duplicates are distinct pools
        lab = table["label"][idx]
        diffs.append(within_pool_auc(new_inst, lab, good[idx]).auc - within_pool_auc(new_inst, lab, noise[idx]).auc)
    diffs = np.array(diffs)
    ok = diffs[np.isfinite(diffs)]
    assert d.n_valid == ok.size
    np.testing.assert_allclose([d.lo, d.hi], np.percentile(ok, [2.5, 97.5]))


def test_paired_bootstrap_is_deterministic_and_generic():
    vals = np.random.default_rng(0).random((2, 30))

    def metric(w):
        return w @ vals[0] / w.sum(1), w @ vals[1] / w.sum(1)
    ids = [f"i{k}" for k in range(30)]
    one, two = paired_bootstrap(metric, ids, seed=3), paired_bootstrap(metric, ids, seed=3)
    assert one == two and one.estimate == pytest.approx(vals[0].mean() - vals[1].mean())
    assert paired_bootstrap(metric, ids, seed=4) != one
    with pytest.raises(ValueError, match="distinct"):
        paired_bootstrap(metric, ["a", "a"])
    with pytest.raises(ValueError, match="one value per weight row"):
        paired_bootstrap(lambda w: (np.zeros(3), np.zeros(3)), ids, n_boot=10)


def test_retention_difference_drops_undefined_instances_in_both_arms():
    a = [1.0, 0.5, np.nan, 1.0]
    b = [0.5, np.nan, 1.0, 1.0]
    d = retention_difference_ci(a, b, n_boot=200)
    assert d.n_instances == 2 and d.a == 1.0 and d.b == 0.75 and d.estimate == 0.25
    m = retention_difference_ci(dict(zip("wxyz", a)), dict(zip("zyxw", b[::-1])), n_boot=200)
    assert m == d
    with pytest.raises(ValueError, match="same instances"):
        retention_difference_ci({"w": 1.0}, {"v": 1.0})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        retention_difference_ci([1.5], [1.0])
    with pytest.raises(ValueError, match="no instance"):
        retention_difference_ci([np.nan, 1.0], [1.0, np.nan])


# ----------------------------------------------------------------------------- validation

def test_inputs_are_validated_at_the_boundary():
    with pytest.raises(ValueError, match="one entry per candidate"):
        within_pool_auc(["a", "a"], [1, 0, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="0/1 labels"):
        within_pool_auc(["a", "a"], [1, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-empty"):
        within_pool_auc([], [], [])
    with pytest.raises(ValueError, match="non-finite"):
        within_pool_auc(["a", "a"], [1, 0], [np.inf, 2.0])
    with pytest.raises(ValueError, match="weighting"):
        within_pool_auc(["a", "a"], [1, 0], [1.0, 2.0], weighting="mean")
    with pytest.raises(ValueError, match="level"):
        auc_difference_ci({"instance_id": ["a", "a"], "label": [1, 0]}, [1, 2], [2, 1], level=95)


def table_of(n=4):
    return {"instance_id": ["a", "a", "b", "b"][:n], "traj_id": ["1", "2", "3", "4"][:n],
            "agent": ["x", "y", "x", "y"][:n], "label": [1, 0, 0, 1][:n], "n_chars": [5, 9, 3, 1][:n],
            "n_steps": [2, 3, 1, 1][:n]}


def test_diagnostics_table_validation_and_keyed_scores():
    t = table_of()
    with pytest.raises(ValueError, match="traj_id"):
        diagnostics_table({**t, "traj_id": ["1", "1", "3", "4"]}, {"s": [1, 2, 3, 4]})
    with pytest.raises(ValueError, match="lacks the columns"):
        diagnostics_table({k: v for k, v in t.items() if k != "n_steps"}, {"s": [1, 2, 3, 4]})
    with pytest.raises(ValueError, match="reference"):
        diagnostics_table(t, {"s": [1, 2, 3, 4]}, reference="nope")
    with pytest.raises(ValueError, match="one entry per candidate"):
        diagnostics_table(t, {"s": [1, 2, 3]})
    with pytest.raises(ValueError, match="traj_id of the table"):
        diagnostics_table(t, {"s": {"1": 1.0, "2": 2.0}})
    by_pos = diagnostics_table(t, {"s": [4.0, 3.0, 2.0, 1.0]}, n_boot=50)
    by_id = diagnostics_table(t, {"s": {"4": 1.0, "3": 2.0, "2": 3.0, "1": 4.0}}, n_boot=50)
    assert by_pos == by_id
    assert by_pos["scores"]["s"]["auc"]["auc"] == 0.5    # a: 4 > 3 -> 1; b: 1 < 2 -> 0


# ----------------------------------------------------------------------------- real data

def test_real_data_counts_match_readme(real):
    assert real["label"].size == 1726                      # 900 ACR + 826 SWE-agent
    assert np.unique(real["instance_id"]).size == 300
    assert within_pool_auc(real["instance_id"], real["label"], np.zeros(1726)).n_instances == 72  # README: 72 mixed


def test_real_data_shortest_is_informative_and_random_is_not(real):
    inst, lab = real["instance_id"], real["label"]
    neg_chars = -real["n_chars"].astype(float)
    random = np.random.default_rng(0).random(lab.size)
    auc_len, auc_rand = within_pool_auc(inst, lab, neg_chars), within_pool_auc(inst, lab, random)
    # Measured: -chars 0.702 over 486 pairs / 72 mixed pools. Null: 2,000 seeded random scores gave
    # AUC mean 0.500, sd 0.035, max |AUC - 0.5| 0.119, so 0.62 is ~3.4 null sd above chance and
    # 0.12 bounds the random score's distance from 0.5.
    assert auc_len.n_pairs == 486 and auc_len.auc > 0.62
    assert abs(auc_rand.auc - 0.5) < 0.12
    d = auc_difference_ci(real, neg_chars, random, seed=0)
    assert d.lo > 0                                        # length beats random, paired over instances


def test_real_data_diagnostics_table_is_json_and_fast(real):
    rng = np.random.default_rng(1)
    scores = {f"random_{k}": rng.random(real["label"].size) for k in range(18)}
    scores["neg_steps"] = -real["n_steps"].astype(float)
    scores["with_missing"] = np.where(rng.random(real["label"].size) < 0.1, np.nan, -real["n_chars"].astype(float))
    t0 = time.perf_counter()
    out = diagnostics_table(real, scores, n_boot=1000, seed=0)
    assert time.perf_counter() - t0 < 5.0                  # 1,726 candidates x 21 scores x 1,000 resamples
    json.dumps(out, allow_nan=False)
    ref = out["scores"]["shortest_chars"]                  # built-in reference added to the output
    assert ref["vs_reference"]["estimate"] == ref["vs_reference"]["lo"] == ref["vs_reference"]["hi"] == 0.0
    assert ref["spearman"]["n_chars"]["pooled"]["rho"] == pytest.approx(-1.0)
    assert ref["spearman"]["n_chars"]["within"]["rho"] == pytest.approx(-1.0)
    assert out["table"]["agent_coding"] == {"acr": 0, "sweagent": 1}
    assert out["scores"]["with_missing"]["n_missing"] > 0
    steps = out["scores"]["neg_steps"]
    assert steps["vs_reference"]["lo"] < steps["vs_reference"]["estimate"] < steps["vs_reference"]["hi"]
    assert out == diagnostics_table(real, scores, n_boot=1000, seed=0)   # deterministic
