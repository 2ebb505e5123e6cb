"""A candidate without a channel is ranked by the channels it has, and its number of channels does not move it
(paper Eq. 4; s_dist the channels' minimum through its null distribution, ``rank.null_min_rank``)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from latentsift.bank.bank import Bank
from latentsift.metrics.diagnostics import within_pool_auc
from latentsift.sift.rank import (NEUTRAL_RANK, channel_ranks, grouped_channel_ranks, min_channel_rank,
                                  normalized_ranks, null_min_rank)
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



def _null_s(ns, ks):
    """s_dist of one candidate whose channels have ``ns`` holders and who ranks ``ks`` in them (a pool built
    for it: the candidate is column 0, the other holders take the other grid points)."""
    r = np.full((len(ns), max(ns)), np.nan)
    for c, (n, k) in enumerate(zip(ns, ks)):
        r[c, :n] = np.arange(n) / max(n - 1, 1)
        r[c, [0, k]] = r[c, [k, 0]]
    return null_min_rank(r)[0]


@pytest.mark.parametrize("ns", [(2,), (6,), (2, 2, 2), (6, 6, 3), (16, 16), (16, 16, 8), (8, 8, 8), (1, 5)])
def test_null_mean_is_one_half_whatever_the_channels(ns):
    """Eq. 4': under no signal (each channel's rank uniform on its grid, channels independent) every
    candidate's s_dist averages exactly 1/2, whatever its number of channels and their holder counts;
    the plain minimum averages 1/2 for one channel and less for more."""
    s = [_null_s(ns, ks) for ks in itertools.product(*[range(n) for n in ns])]
    assert np.mean(s) == pytest.approx(0.5, abs=1e-12)
    m = [min(k / max(n - 1, 1) for n, k in zip(ns, ks)) for ks in itertools.product(*[range(n) for n in ns])]
    if len(ns) > 1 and min(ns) > 1:
        assert np.mean(m) < 0.45


def test_null_min_rank_worked_values():
    # one channel among 4: rank k -> (k + 1/2) / 4
    np.testing.assert_allclose(null_min_rank([[0, 1 / 3, 2 / 3, 1]]), [1 / 8, 3 / 8, 5 / 8, 7 / 8])
    # three channels among 2: the top in all three has P(M >= 1) = 1/8, P(M > 1) = 0 -> 15/16; the
    # bottom has min 0: P(M >= 0) = 1, P(M > 0) = 1/8 -> 7/16; a candidate ranked in none: 1/2
    r = np.array([[1.0, 0.0, np.nan], [1.0, 0.0, np.nan], [1.0, 0.0, np.nan]])
    np.testing.assert_allclose(null_min_rank(r), [15 / 16, 7 / 16, NEUTRAL_RANK])
    # large pools: the continuous 1 - (1 - m)^c
    n = 2001
    r = np.stack([np.arange(n) / (n - 1)] * 3)
    np.testing.assert_allclose(null_min_rank(r), 1 - (1 - np.arange(n) / (n - 1)) ** 3, atol=2e-3)


def test_null_min_rank_keeps_the_order_of_the_min_among_equals_and_groups_alone():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 40))
    g = np.repeat(np.array(["a", "b", "c", "d"]), 10)
    q[1, 30:] = np.nan  # group d lacks the observation channel altogether
    r = np.stack([grouped_channel_ranks(q[c], g) for c in range(3)])
    s, m = null_min_rank(r, g), min_channel_rank(r)
    for k in np.unique(g):  # every candidate of a group has the same channels: the order is the min's
        sel = g == k
        np.testing.assert_array_equal(np.argsort(s[sel], kind="stable"), np.argsort(m[sel], kind="stable"))
        np.testing.assert_array_equal(s[sel], null_min_rank(r[:, sel]))  # counts per group, never pooled
    assert ((s > 0) & (s < 1)).all()
    with pytest.raises(ValueError, match="ranks"):
        null_min_rank(np.zeros(3))
    assert null_min_rank(np.zeros((3, 0))).shape == (0,)


N_POOLS, POOL = 300, 16


def _noise_pools(lacks, seed):
    """N_POOLS pools of POOL candidates whose channel scores are pure noise; the first half of each pool (the
    label 1) lacks the channels ``lacks`` (0 cot, 1 obs, 2 fn)."""
    rng = np.random.default_rng(seed)
    inst = np.repeat([f"task/{i}" for i in range(N_POOLS)], POOL)
    y = np.tile(np.arange(POOL) < POOL // 2, N_POOLS).astype(int)
    q = rng.standard_normal((3, N_POOLS * POOL))
    q[list(lacks)] = np.where(y == 1, np.nan, q[list(lacks)])
    return inst, y, np.stack([grouped_channel_ranks(q[c], inst) for c in range(3)])


@pytest.mark.parametrize("lacks, old_auc", [((1,), 0.60), ((0, 1), 0.75)])
def test_a_missing_channel_is_neutral_on_pure_noise(lacks, old_auc):
    """Channel presence goes with the label, the scores carry nothing: s_dist's within-pool AUC is near 1/2.

    Tolerance from the number of pools: under no signal one pool's AUC (8 against 8) has variance
    (8 + 8 + 1) / (12 * 8 * 8) (Mann-Whitney), so the mean over 300 pools has SE 0.0086; 4 SE = 0.034. The
    rule's own residual on such pools is +0.022 (missing observation) and +0.010 (two channels missing),
    measured over 3,000 pools (``rank`` module docstring), inside it. The plain minimum on the same pools
    lifts the candidates without the channel to about 0.60 and 0.75: more than 0.06 beyond the tolerance.
    """
    tol = 4 * np.sqrt((POOL + 1) / (12 * (POOL // 2) ** 2)) / np.sqrt(N_POOLS)
    assert tol == pytest.approx(0.034, abs=1e-3)
    for seed in range(2):
        inst, y, r = _noise_pools(lacks, seed)
        new = within_pool_auc(inst, y, null_min_rank(r, inst)).auc
        old = within_pool_auc(inst, y, min_channel_rank(r)).auc
        assert abs(new - 0.5) < tol, (lacks, seed, new)
        assert old == pytest.approx(old_auc, abs=0.025) and old - 0.5 > tol + 0.06

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
    lowest) capped every one of them at the pool's bottom ranks. Their s_dist is the minimum of two ranks
    among 6 through its null (Eq. 4'), not the plain minimum, which the two channels would have lifted."""
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
            if good:  # ranked by cot and fn alone (6 holders each): 1 - (P(M >= m) + P(M > m)) / 2, k = 5 m
                k = 5 * min(c.r["cot"], c.r["fn"])
                assert c.r["obs"] is None and c.s_dist == pytest.approx(1 - (((6 - k) / 6) ** 2
                                                                             + ((5 - k) / 6) ** 2) / 2)
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
    # three channels of two holders (test_null_min_rank_worked_values): the top 15/16, the bottom 7/16
    assert res["n/b"].s_dist == 15 / 16 and res["n/c"].s_dist == 7 / 16
