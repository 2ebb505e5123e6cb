"""A candidate without a channel is ranked by the channels it has (paper Eq. 4 read faithfully)."""
from __future__ import annotations

import numpy as np
import pytest

from latentsift.bank.bank import Bank
from latentsift.metrics.diagnostics import within_pool_auc
from latentsift.sift.rank import (NEUTRAL_RANK, channel_ranks, grouped_channel_ranks, min_channel_rank,
                                  normalized_ranks)
from latentsift.sift.sift import LatentSift
from latentsift.states.model import Fingerprint
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS, Pool, Step, Trajectory

L, D = 2, 6
FP = Fingerprint("TestArch", L, D, "tok", "tpl", "w", "float32")
DIRECTION = np.linspace(-1, 1, D).astype(np.float32)


def test_channel_ranks_rank_the_holders_only():
    np.testing.assert_allclose(channel_ranks([np.nan, 2.0, 1.0, 3.0]), [np.nan, 0.5, 0.0, 1.0])
    # all present: exactly the paper's ranks
    x = np.array([0.3, -2.0, 5.0, 5.0])
    assert channel_ranks(x).tobytes() == normalized_ranks(x).tobytes()
    # one holder among several ranks nobody; a pool of one keeps the paper's rank 0; none: nobody
    assert np.isnan(channel_ranks([np.nan, 4.0, np.nan])).all()
    np.testing.assert_allclose(channel_ranks([4.0]), [0.0])
    assert np.isnan(channel_ranks([np.nan, np.nan])).all()


def test_min_over_the_channels_a_candidate_has():
    r = np.array([[0.0, 1.0, np.nan, np.nan],
                  [np.nan, 0.5, 0.25, np.nan],
                  [0.75, 0.0, 1.0, np.nan]])
    np.testing.assert_allclose(min_channel_rank(r), [0.0, 0.0, 0.25, NEUTRAL_RANK])
    np.testing.assert_allclose(min_channel_rank(np.array([[0.67], [1.00], [0.33]])), [0.33])  # the paper's example


def test_grouped_channel_ranks_equal_per_group():
    rng = np.random.default_rng(3)
    s = rng.standard_normal(40)
    s[rng.random(40) < 0.4] = np.nan
    g = rng.integers(0, 6, 40)
    got = grouped_channel_ranks(s, g)
    for k in np.unique(g):
        np.testing.assert_array_equal(got[g == k], channel_ranks(s[g == k]))
    with pytest.raises(ValueError, match="groups"):
        grouped_channel_ranks([1.0, 2.0], ["a"])


def _states(tid, rng, quality, channels, n_steps=3):
    steps = [t for t in range(n_steps) for c in CHANNELS if c in channels]
    chans = [CHANNEL_ID[c] for t in range(n_steps) for c in CHANNELS if c in channels]
    z = 0.3 * rng.standard_normal((len(steps), L, D)).astype(np.float32) + np.float32(quality) * DIRECTION
    return TrajectoryStates(tid, z, np.array(steps, np.int32), np.array(chans, np.int8), n_tokens=30 * n_steps)


def _traj(tid, inst, channels, reward=None, n_steps=3):
    steps = [Step(**{c: (f"{c} {i}" if c in channels else "") for c in CHANNELS}) for i in range(n_steps)]
    return Trajectory(traj_id=tid, instance_id=inst, repo="org/r", task_prompt="t", steps=steps, reward=reward)


def test_a_pool_where_some_candidates_lack_observations():
    """The rollout scaffold's case: candidates that submit at once have no observation, and they are the
    good ones. Ranked by the channels they have, they keep their place; the old rule (missing ranks
    lowest) capped every one of them at the pool's bottom ranks."""
    rng = np.random.default_rng(0)
    bank_st, labels, inst, repos = {}, {}, {}, {}
    for i in range(24):
        t, y = f"bank/{i}", i % 2
        bank_st[t] = _states(t, rng, 1.0 if y else -1.0, CHANNELS)
        labels[t], inst[t], repos[t] = y, f"b/{i}", "org/bank"
    bank = Bank().fit(bank_st, labels, inst, repos, FP)
    sift = LatentSift(bank, branches="distance")
    pools, st, y_all, inst_all, s_all, s_old = [], {}, [], [], [], []
    for p in range(12):
        cands = []
        for j in range(6):
            t, good = f"c/{p}/{j}", j < 3
            chans = ("cot", "fn") if good else CHANNELS  # the good ones submit at once: no observation
            st[t] = _states(t, rng, 0.8 if good else -0.8, chans)
            cands.append(_traj(t, f"task/{p}", chans, reward=float(good)))
        pools.append(Pool(f"task/{p}", cands))
    for pool in pools:
        res = sift.score(pool, st, fingerprint=FP)
        prep = sift.prepare(pool, st, fingerprint=FP)
        old = min_channel_rank(np.stack([normalized_ranks(prep.q[:, j]) for j in range(3)]))  # NaN lowest
        for c, o in zip(res.candidates, old):
            good = c.traj_id.rsplit("/", 1)[1] in "012"
            assert (c.q["obs"] is None) == good
            if good:  # ranked by cot and fn alone
                assert c.r["obs"] is None and c.s_dist == pytest.approx(min(c.r["cot"], c.r["fn"]))
            else:  # the obs channel ranks the three holders among themselves (n = 3)
                assert c.r["obs"] in (0.0, 0.5, 1.0)
            y_all.append(int(good))
            inst_all.append(pool.instance_id)
            s_all.append(c.s_dist)
            s_old.append(o)
    auc_new = within_pool_auc(np.array(inst_all), np.array(y_all), np.array(s_all)).auc
    auc_old = within_pool_auc(np.array(inst_all), np.array(y_all), np.array(s_old)).auc
    assert auc_new == 1.0 and auc_old < 0.75
    # the old rule: the three without observation tie at the pool's bottom ranks 0..2 of 5 in obs
    assert [o for o, y in zip(s_old, y_all) if y] == pytest.approx([0.2] * 36)


def test_a_candidate_with_no_state_gets_the_neutral_rank():
    rng = np.random.default_rng(1)
    bank_st = {f"bank/{i}": _states(f"bank/{i}", rng, 1.0 if i % 2 else -1.0, CHANNELS) for i in range(10)}
    bank = Bank().fit(bank_st, {t: i % 2 for i, t in enumerate(bank_st)}, {t: t for t in bank_st},
                      {t: "org/bank" for t in bank_st}, FP)
    st = {"n/a": _states("n/a", rng, 1.0, ()), "n/b": _states("n/b", rng, 1.0, CHANNELS),
          "n/c": _states("n/c", rng, -1.0, CHANNELS)}
    pool = Pool("task/x", [_traj(t, "task/x", ()) for t in st])
    res = {c.traj_id: c for c in LatentSift(bank, branches="distance").score(pool, st, fingerprint=FP).candidates}
    assert res["n/a"].s_dist == NEUTRAL_RANK and all(v is None for v in res["n/a"].r.values())
    assert res["n/b"].s_dist == 1.0 and res["n/c"].s_dist == 0.0
