"""The fitted-fusion variant: Eq. 3's weight chosen on the bank by inner cross-validation by group, never on
the scored fold."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift.bank.bank import Bank
from latentsift.metrics.diagnostics import within_pool_auc
from latentsift.sift.rules import filter_entry, filters
from latentsift.sift.scorer import LinearScorer
from latentsift.sift.sift import LatentSift
from latentsift.sift.variants import FITTED_FUSION, FUSION_GRID, fit_fusion_weight, fitted_fusion
from latentsift.trajectories.trajectory import Pool, Step, Trajectory, group_pools
from synthetic import FP, make_states

AUC = lambda inst, y, s: within_pool_auc(inst, y, s).auc  # noqa: E731  (the protocol's criterion)


def test_the_weight_follows_the_better_branch_and_ties_go_to_the_papers():
    rng = np.random.default_rng(0)
    inst = np.repeat([f"t{i}" for i in range(30)], 4)
    y = np.tile([1, 1, 0, 0], 30)
    good, noise = y + 0.1 * rng.random(120), rng.random(120)
    for s_dist, s_lin, side in ((good, noise, 1), (noise, good, -1)):
        w, by = fit_fusion_weight(s_dist, s_lin, inst, y, AUC)
        assert set(by) == {f"{g:g}" for g in FUSION_GRID} and by[f"{w:g}"] == max(by.values()) == 1.0
        assert side * (w - 0.5) > 0  # toward the better branch ...
        assert all(by[f"{v:g}"] < 1.0 for v in FUSION_GRID if abs(v - 0.5) < abs(w - 0.5))  # ... no further than needed
    assert fit_fusion_weight(good, good, inst, y, AUC)[0] == 0.5  # every w ties: the paper's 0.5
    with pytest.raises(LatentSiftError, match="no pool with both outcomes"):
        fit_fusion_weight(good, noise, inst, np.ones(120, int), AUC)


def test_registered_as_a_post_hoc_variant():
    e = filter_entry(FITTED_FUSION)
    assert e.kind == "variant" and e.factory is fitted_fusion and e.post_hoc and e.signals is None
    assert FITTED_FUSION in [v.key for v in filters("variant")]


def _world(n_tasks=12, k=6, seed=0):
    rng = np.random.default_rng(seed)
    trajs, states = [], {}
    for i in range(n_tasks):
        for j in range(k):
            y = int(j < k // 2)
            t = f"p/T{i}/{j}"
            # the distance branch sees the label through the states; the learned branch gets a weaker signal
            states[t] = make_states(t, rng, (0.5 if y else -0.5) + 0.5 * rng.standard_normal(), 2 + j % 3)
            trajs.append(Trajectory(traj_id=t, instance_id=f"T{i}", repo="r", task_prompt="x",
                                    steps=[Step(cot="c", fn="f", obs="o")] * (2 + j % 3), reward=float(y)))
    return trajs, states


def test_the_scored_fold_is_never_read():
    trajs, states = _world()
    bank_trajs = [t for t in trajs if int(t.instance_id[1:]) < 8]
    eval_trajs = [t for t in trajs if int(t.instance_id[1:]) >= 8]
    eval_pools = group_pools(eval_trajs)
    bank = Bank.from_trajectories(bank_trajs, states, FP)
    ids = sorted(t.traj_id for t in bank_trajs)
    scorer = LinearScorer(lr=1e-2, max_epochs=3, train_loss=False).fit(
        [states[i] for i in ids], [int(t.label) for t in sorted(bank_trajs, key=lambda t: t.traj_id)],
        fingerprint=FP)
    paper_filter = LatentSift(bank, scorer)
    paper = paper_filter.prepare_many(eval_pools, states, fingerprint=FP)
    group = lambda t: t.instance_id  # noqa: E731
    kw = dict(seed=0, paper=paper, paper_filter=paper_filter, group=group, criterion=AUC)
    filt, prep = fitted_fusion(bank_trajs, eval_pools, states, FP, scorer, **kw)
    w = filt.fitted_["fusion_weight"]
    assert w in FUSION_GRID and filt.fusion_weight == w and filt.fitted_["n_bank_candidates"] == len(bank_trajs)
    assert set(prep) == {p.instance_id for p in eval_pools}
    # the scored fold's labels flipped and its states withheld: the same weight, the same scores
    poisoned = [Pool(p.instance_id, [dataclasses.replace(c, reward=1.0 - c.reward) for c in p.candidates])
                for p in eval_pools]
    bank_states = {t: states[t] for t in ids}
    filt2, prep2 = fitted_fusion(bank_trajs, poisoned, bank_states, FP, scorer, **kw)
    assert filt2.fitted_ == filt.fitted_
    for i, p in prep.items():
        assert filt.rank_subset(p, p.traj_ids) == filt2.rank_subset(prep2[i], p.traj_ids)
    # s = w s_dist + (1 - w) s_lin on the paper's own branch scores
    c = filt.score_pools(eval_pools, states, fingerprint=FP)[0].candidates[0]
    assert c.s == pytest.approx(w * c.s_dist + (1 - w) * c.s_lin)
    with pytest.raises(LatentSiftError, match="needs the learned branch"):
        fitted_fusion(bank_trajs, eval_pools, states, FP, None, **kw)
