import numpy as np
import pytest

from latentsift._core.validation import LatentSiftError

from latentsift.sift.sift import Prepared
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import Pool, Trajectory
from latentsift.sift.variants import (LogisticProbe, StackedFilter, center_by_group, fit_stack, merge_prepared,
                                      pool_rank_features, split_pools_by_group)


def _st(tid, rng, shift=0.0, n=4, L=3, d=5):
    layers = rng.standard_normal((n, L, d)).astype(np.float32) + shift
    return TrajectoryStates(tid, layers, np.arange(n, dtype=np.int32), np.array([0, 1, 2, 0][:n], dtype=np.int8), 10)


def test_center_by_group_removes_the_bank_mean_of_each_scaffold_and_channel():
    rng = np.random.default_rng(0)
    states = {"a1": _st("a1", rng, 5.0), "a2": _st("a2", rng, 5.0), "b1": _st("b1", rng, -3.0),
              "cand": _st("cand", rng, 5.0)}
    groups = {"a1": "acr", "a2": "acr", "b1": "swe", "cand": "acr"}
    out = center_by_group(states, groups, ["a1", "a2", "b1"])
    for c in range(3):
        rows = np.concatenate([out[t].layers[out[t].channel == c] for t in ("a1", "a2")])
        np.testing.assert_allclose(rows.mean(axis=0), 0.0, atol=1e-5)
    # the candidate is shifted by the bank mean of its own scaffold, not by its own mean
    m = np.concatenate([states[t].layers[states[t].channel == 1] for t in ("a1", "a2")]).mean(0)
    np.testing.assert_allclose(out["cand"].layers[1], states["cand"].layers[1] - m, atol=1e-5)
    assert out["cand"].layers.dtype == np.float32 and states["a1"].layers.mean() > 4  # input untouched


def test_fit_stack_learns_the_sign_from_the_bank():
    rng = np.random.default_rng(1)
    inst = np.repeat(np.arange(60), 4).astype(str)
    y = np.tile([1, 0, 0, 0], 60)
    good = y + rng.normal(0, 0.3, y.size)       # higher for resolved
    bad = -y + rng.normal(0, 0.3, y.size)       # lower for resolved (e.g. "longer is better" data)
    noise = rng.normal(size=y.size)
    w = fit_stack({"good": good, "bad": bad, "noise": noise}, inst, y)
    assert w["good"] > 0.5 and w["bad"] < -0.5 and abs(w["noise"]) < abs(w["good"])
    with pytest.raises(ValueError, match="mixed pools"):
        fit_stack({"x": noise[:8]}, inst[:8], np.zeros(8, int))


def test_stacked_filter_ranks_within_the_subset():
    raw = {"a": {"t1": 1.0, "t2": 2.0, "t3": 3.0}, "b": {"t1": 30.0, "t2": 20.0, "t3": 10.0}}
    f = StackedFilter(raw, {"a": 1.0, "b": 0.5})
    pool = Pool("i", [Trajectory(t, "i", "r", "", []) for t in ("t3", "t1", "t2")])
    prep = f.prepare_many([pool])["i"]
    s = f.rank_subset(prep, ["t1", "t2", "t3"])
    assert s == pytest.approx({"t1": 0.5, "t2": 0.75, "t3": 1.0})
    assert f.rank_subset(prep, ["t1", "t3"]) == pytest.approx({"t1": 0.5, "t3": 1.0})
    np.testing.assert_allclose(pool_rank_features({"a": np.array([3.0, 1, 2])}, np.array(["x"] * 3))[:, 0],
                               [1.0, 0.0, 0.5])


def test_split_and_merge_by_scaffold_keeps_every_candidate_once():
    cands = [Trajectory(f"r{k}/i", "i", "r", "", [], agent=a) for k, a in enumerate("abab")]
    parts = split_pools_by_group([Pool("i", cands)], lambda c: c.agent)
    assert sorted(parts) == ["a", "b"] and [len(p[0].candidates) for p in parts.values()] == [2, 2]
    preps = [Prepared("i", sorted(c.traj_id for c in p[0].candidates), ("cot",),
                      q=np.array([[float(c.traj_id[1])] for c in sorted(p[0].candidates, key=lambda c: c.traj_id)]))
             for p in parts.values()]
    m = merge_prepared(preps)
    assert m.traj_ids == ["r0/i", "r1/i", "r2/i", "r3/i"]
    np.testing.assert_allclose(m.q[:, 0], [0, 1, 2, 3])


def test_logistic_probe_separates_a_real_signal():
    rng = np.random.default_rng(2)
    sts, ys = [], []
    for i in range(80):
        y = i % 2
        st = _st(f"t{i}", rng, n=4, L=16, d=6)
        st.layers[:, :, 0] += 2.0 * y
        sts.append(st)
        ys.append(y)
    probe = LogisticProbe(layers=(-1,)).fit(sts[:60], ys[:60], [f"task/{i // 4}" for i in range(60)])
    score = probe.decision_function(sts[60:])
    y_te = np.array(ys[60:])
    assert score[y_te == 1].mean() > score[y_te == 0].mean()


def test_logistic_probe_chooses_its_regularisation_by_task():
    """The inner split that chooses C holds no task on both sides (asserted on the splits the fit used),
    and still has both classes on every validation side; a split by candidate (the former
    StratifiedKFold) puts most tasks on both sides of these pools."""
    from sklearn.model_selection import StratifiedKFold
    rng = np.random.default_rng(4)
    sts, ys, task = [], [], []
    for i in range(96):  # 24 tasks of 4 candidates, a task's pass rate its own
        t = i // 4
        y = int(rng.random() < (0.2 + 0.6 * (t % 3) / 2))
        st = _st(f"t{i}", rng, n=3, L=8, d=6)
        st.layers[:, :, 0] += 1.5 * y
        sts.append(st), ys.append(y), task.append(f"task/{t}")
    groups = {st.traj_id: g for st, g in zip(sts, task)}
    probe = LogisticProbe(seed=3).fit(sts, ys, groups)
    task, ys = np.array(task), np.array(ys)
    assert len(probe.splits_) == probe.cv == 4
    held = np.concatenate([val for _, val in probe.splits_])
    assert sorted(held.tolist()) == list(range(96))  # every candidate validated once
    for train, val in probe.splits_:
        assert not set(task[train]) & set(task[val])
        assert set(ys[val].tolist()) == {0, 1}
    # the groups as a list aligned with the states: the same splits, the same probe
    again = LogisticProbe(seed=3).fit(sts, ys, list(task))
    assert [(a.tolist(), b.tolist()) for a, b in again.splits_] == [(a.tolist(), b.tolist()) for a, b in probe.splits_]
    np.testing.assert_array_equal(again.decision_function(sts), probe.decision_function(sts))
    by_candidate = StratifiedKFold(4, shuffle=True, random_state=3).split(np.zeros(96), ys)
    assert max(len(set(task[tr]) & set(task[va])) for tr, va in by_candidate) > 12
    with pytest.raises(LatentSiftError, match="groups"):
        LogisticProbe().fit(sts, ys, ["one"] * 96)  # one group: no split by group
    with pytest.raises(LatentSiftError, match="LogisticProbe.fit"):
        LogisticProbe().fit(sts, ys, ["a"] * 95)


def test_trajectory_signals_read_length_and_patch():
    from latentsift.trajectories.trajectory import Step
    from latentsift.sift.variants import patch_lines, trajectory_signals
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a = 1\n+a = 2\n b = 3\n"
    assert patch_lines(diff) == 2 and patch_lines("") == 0
    t = Trajectory("r/i", "i", "r", "", [Step(cot="ab", fn="c", obs="de"), Step(cot="f")], patch=diff)
    assert trajectory_signals(t) == {"neg_chars": -6.0, "neg_steps": -2.0, "patch_lines": 2.0, "no_patch": 0.0}
    t.patch = "  \n"
    assert trajectory_signals(t)["no_patch"] == 1.0


def test_bank_subsample_keeps_whole_instances_in_nested_subsets():
    from latentsift.sift.variants import bank_subsample
    trajs = [Trajectory(f"r{k}/i{i}", f"i{i}", "r", "", []) for i in range(40) for k in range(3)]
    quarter, half, full = (bank_subsample(trajs, f, seed=0) for f in (0.25, 0.5, 1.0))
    assert len(quarter) == 30 and len(half) == 60 and len(full) == 120
    assert {t.traj_id for t in quarter} <= {t.traj_id for t in half}
    assert all(sum(t.instance_id == u.instance_id for u in half) == 3 for t in half)
    assert {t.instance_id for t in bank_subsample(trajs, 0.25, seed=1)} != {t.instance_id for t in quarter}
    with pytest.raises(ValueError, match="'fraction' parameter"):
        bank_subsample(trajs, 0.0)
