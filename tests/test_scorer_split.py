"""The learned branch's early-stopping split by group: no task on both sides."""
from __future__ import annotations

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift.sift.scorer import LinearScorer
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID

L, D = 2, 6


def _pool_ids(n_tasks, k, rng):
    ids, groups = [], {}
    for i in range(n_tasks):
        for j in range(int(rng.integers(1, k + 1))):
            t = f"HumanEval/{i}/s{j:02d}"
            ids.append(t)
            groups[t] = f"HumanEval/{i}"
    return ids, groups


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_group_on_both_sides_and_about_a_fifth_held_out(seed):
    rng = np.random.default_rng(seed)
    ids, groups = _pool_ids(40, 16, rng)
    sc = LinearScorer(seed=seed)
    train, val = sc.split(ids, groups)
    assert sorted(train + val) == sorted(ids) and val
    assert not {groups[t] for t in train} & {groups[t] for t in val}
    biggest = max(sum(1 for t in ids if groups[t] == g) for g in set(groups.values()))
    assert 0.2 * len(ids) <= len(val) < 0.2 * len(ids) + biggest
    assert sc.split(ids, groups) == (train, val)  # seeded
    # by trajectory (no groups), the paper's split puts candidates of one task on both sides here
    t_tr, t_va = sc.split(ids)
    assert len(t_va) == round(0.2 * len(ids)) and {groups[t] for t in t_tr} & {groups[t] for t in t_va}


def test_edge_cases_of_the_grouped_split():
    ids = [f"a/{i}" for i in range(5)]
    one = {t: "a" for t in ids}
    assert LinearScorer().split(ids, one) == (sorted(ids), [])  # one group: nothing to hold out
    assert LinearScorer(val_frac=0.0).split(ids, {t: t for t in ids}) == (sorted(ids), [])
    train, val = LinearScorer(val_frac=0.9).split(ids, {t: t for t in ids})
    assert len(train) == 1 and len(val) == 4  # at least one group trains


def _states(tid, rng, y):
    z = 0.3 * rng.standard_normal((4, L, D)).astype(np.float32) + (1.0 if y else -1.0)
    return TrajectoryStates(tid, z, np.array([0, 0, 1, 1], np.int32),
                            np.array([CHANNEL_ID["cot"], CHANNEL_ID["fn"]] * 2, np.int8), n_tokens=40)


def test_fit_keeps_groups_whole_and_refuses_missing_groups():
    rng = np.random.default_rng(4)
    ids, groups = _pool_ids(12, 6, rng)
    labels = {t: int(rng.random() < 0.5) for t in ids}
    st = [_states(t, rng, labels[t]) for t in ids]
    sc = LinearScorer(lr=1e-2, max_epochs=2).fit(st, labels, groups=groups)
    assert not {groups[t] for t in sc.train_ids_} & {groups[t] for t in sc.val_ids_}
    assert (sc.train_ids_, sc.val_ids_) == LinearScorer().split(ids, groups)
    again = LinearScorer(lr=1e-2, max_epochs=2).fit(st[::-1], labels, groups=[groups[s.traj_id] for s in st[::-1]])
    assert np.array_equal(sc.W_, again.W_)  # a list aligned with the states is the same split
    with pytest.raises(LatentSiftError, match="'groups' parameter of LinearScorer.fit has no group"):
        LinearScorer(max_epochs=1).fit(st, labels, groups={ids[0]: "x"})


def test_fit_outside_the_folds_splits_by_repository_or_by_task_in_one_repository():
    """What is tested: ``fit``'s early-stopping groups are the repositories where the bank holds several, and
    the tasks where it holds one (one group would leave no validation side); a protocol fold passes its own
    group the same way."""
    from types import SimpleNamespace as T
    from latentsift.sift.scorer import early_stopping_groups
    many = [T(traj_id=f"{r}/{i}/{j}", repo=r, instance_id=f"{r}/{i}", agent="a")
            for r in ("x", "y") for i in range(2) for j in range(2)]
    assert early_stopping_groups(many) == {t.traj_id: t.repo for t in many}
    one = [t for t in many if t.repo == "x"]
    assert early_stopping_groups(one) == {t.traj_id: t.instance_id for t in one}
    assert early_stopping_groups(many, lambda t: t.agent) == {t.traj_id: t.instance_id for t in many}
