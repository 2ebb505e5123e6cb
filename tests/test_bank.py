"""Banks: exact retrieval with row owners, guards, persistence, repository splits."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from latentsift import FingerprintMismatch, LatentSiftError, NotFittedError
from latentsift.bank.bank import Bank, leave_one_repo_out, select_by_repo, split_by_repo
from latentsift.states.model import Fingerprint
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS

FP = Fingerprint("TestArch", 4, 16, "tok", "tpl", "w", "float32")
OTHER_FP = Fingerprint("TestArch", 4, 16, "tok", "tpl", "other-weights", "float32")


def make_states(tid, rng, *, n_steps=5, L=4, d=16, shift=0.0, drop=()):
    """Random states: every step has cot, fn and obs spans (minus the channels in ``drop``)."""
    steps, chans = [], []
    for t in range(n_steps):
        for c in ("cot", "fn", "obs"):
            if c not in drop:
                steps.append(t)
                chans.append(CHANNEL_ID[c])
    layers = rng.standard_normal((len(steps), L, d)).astype(np.float32) + np.float32(shift)
    return TrajectoryStates(tid, layers, np.array(steps, np.int32), np.array(chans, np.int8), n_tokens=100 + len(steps))


def make_bank_data(seed=0, n=12):
    rng = np.random.default_rng(seed)
    states, labels, inst, repos = {}, {}, {}, {}
    for i in range(n):
        t = f"run/r{i % 3}__inst-{i}"
        y = int(i % 2 == 0)
        states[t] = make_states(t, rng, n_steps=3 + i % 4, shift=1.0 if y else -1.0)
        labels[t], inst[t], repos[t] = y, f"r{i % 3}__inst-{i}", f"org/r{i % 3}"
    return states, labels, inst, repos


@pytest.fixture(scope="module")
def data():
    return make_bank_data()


@pytest.fixture(scope="module")
def bank(data):
    return Bank().fit(*data, FP)


def brute(bank_rows, z):
    D = cdist(z.astype(np.float64), bank_rows.astype(np.float64))
    return D.min(axis=1), D.argmin(axis=1)


def test_rows_owners_and_steps_come_from_the_right_trajectories(bank, data):
    states, labels, _, _ = data
    for c in CHANNELS:
        for cls, y in (("pos", 1), ("neg", 0)):
            rows = getattr(bank, f"{cls}_")[c]
            owners = bank.owner(c, cls, np.arange(rows.shape[0]))
            steps = getattr(bank, f"{cls}_step_")[c]
            expected = [(t, int(s)) for t in sorted(states) if labels[t] == y
                        for s in states[t].step[states[t].channel == CHANNEL_ID[c]]]
            assert list(zip(owners, steps.tolist())) == expected
            want = np.concatenate([states[t].layers[states[t].channel == CHANNEL_ID[c], -1]
                                   for t in sorted(states) if labels[t] == y])
            np.testing.assert_array_equal(rows, want)
    assert bank.label_counts() == {"pos": 6, "neg": 6}


def test_distances_are_exact_nearest_neighbours(bank):
    rng = np.random.default_rng(5)
    z = rng.standard_normal((40, 16)).astype(np.float32)
    for c in CHANNELS:
        d_pos, d_neg, i_pos, i_neg = bank.distances(z, c)
        bp, ip = brute(bank.pos_[c], z)
        bn, in_ = brute(bank.neg_[c], z)
        np.testing.assert_allclose(d_pos, bp, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(d_neg, bn, rtol=1e-4, atol=1e-4)
        assert (i_pos == ip).all() and (i_neg == in_).all()
        assert d_pos.dtype == np.float32 and i_pos.dtype == np.int64


def test_layer_normalize_and_center_settings(data):
    states = data[0]
    b0 = Bank(layer=0).fit(*data, FP)
    t = sorted(t for t in states if data[1][t] == 1)[0]
    np.testing.assert_array_equal(b0.pos_["cot"][0], states[t].layers[states[t].channel == 0][0, 0])
    bn = Bank(normalize="l2", center="mean").fit(*data, FP)
    raw = np.concatenate([Bank().fit(*data, FP).pos_["fn"], Bank().fit(*data, FP).neg_["fn"]])
    np.testing.assert_allclose(bn.center_["fn"], raw.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(bn.pos_["fn"], axis=1), 1.0, rtol=1e-5)
    z = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)
    zt = z - bn.center_["fn"]
    zt /= np.linalg.norm(zt, axis=1, keepdims=True)
    d_pos, _, i_pos, _ = bn.distances(z, "fn")
    bp, ip = brute(bn.pos_["fn"], zt)
    np.testing.assert_allclose(d_pos, bp, atol=1e-4)
    assert (i_pos == ip).all()


def test_empty_class_and_bad_inputs_stop_with_clear_errors(data):
    states, labels, inst, repos = data
    with pytest.raises(LatentSiftError, match="empty positive"):
        Bank().fit(states, {t: 0 for t in states}, inst, repos, FP)
    with pytest.raises(LatentSiftError, match="empty negative"):
        Bank().fit(states, {t: 1 for t in states}, inst, repos, FP)
    with pytest.raises(LatentSiftError, match="'labels' parameter of Bank.fit must hold 0 or 1"):
        Bank().fit(states, {t: 0.5 for t in states}, inst, repos, FP)
    short = dict(list(repos.items())[1:])
    with pytest.raises(LatentSiftError, match="'repos' parameter of Bank.fit has no entry"):
        Bank().fit(states, labels, inst, short, FP)
    with pytest.raises(LatentSiftError, match="'normalize' parameter of Bank"):
        Bank(normalize="cosine").fit(states, labels, inst, repos, FP)
    with pytest.raises(LatentSiftError, match="'layer' parameter of Bank"):
        Bank(layer=9).fit(states, labels, inst, repos, FP)
    with pytest.raises(FingerprintMismatch, match="d_model=16"):
        Bank().fit(states, labels, inst, repos, Fingerprint("X", 4, 32, "t", "t", "w", "float32"))
    with pytest.raises(LatentSiftError, match="Fingerprint"):
        Bank().fit(states, labels, inst, repos, "abc")


def test_channel_without_states_in_one_class_raises_on_use():
    rng = np.random.default_rng(2)
    states = {"a": make_states("a", rng, drop=("obs",)), "b": make_states("b", rng)}
    bank = Bank().fit(states, {"a": 1, "b": 0}, {"a": "i1", "b": "i2"}, {"a": "r", "b": "r"}, FP)
    assert bank.state_counts()["obs"] == {"pos": 0, "neg": 5}
    with pytest.raises(LatentSiftError, match="positive bank has no state in channel 'obs'"):
        bank.distances(np.zeros((1, 16), np.float32), "obs")
    bank.distances(np.zeros((1, 16), np.float32), "cot")


def test_not_fitted():
    with pytest.raises(NotFittedError, match="not fitted"):
        Bank().distances(np.zeros((1, 16), np.float32), "cot")


def test_guards(bank, data):
    bank.check_candidates(["r0__other"], ["run2/r0__other"])
    with pytest.raises(LatentSiftError, match="instance.*in the bank.*'r1__inst-1'"):
        bank.check_candidates(["r0__other", "r1__inst-1"])
    with pytest.raises(LatentSiftError, match="are bank entries"):
        bank.check_candidates(["fresh"], [sorted(data[0])[0]])
    bank.check_fingerprint(FP)
    with pytest.raises(FingerprintMismatch, match="different model"):
        bank.check_fingerprint(OTHER_FP)


def test_save_load_round_trip(bank, tmp_path):
    bank.save(tmp_path / "b", source={"states_dir": "/x"})
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert man["fingerprint"]["digest"] == FP.digest
    assert man["label_counts"] == {"pos": 6, "neg": 6}
    assert man["repos"] == ["org/r0", "org/r1", "org/r2"]
    assert man["source"] == {"states_dir": "/x"}
    assert [r["traj_id"] for r in man["trajectories"]] == bank.traj_ids_
    back = Bank.load(tmp_path / "b")
    assert back.get_params() == bank.get_params() and back.traj_ids_ == bank.traj_ids_
    assert back.instances_ == bank.instances_ and back.repos_ == bank.repos_ and back.labels_ == bank.labels_
    z = np.random.default_rng(3).standard_normal((9, 16)).astype(np.float32)
    for c in CHANNELS:
        for a, b in zip(bank.distances(z, c), back.distances(z, c)):
            np.testing.assert_array_equal(a, b)
    blob = bytearray((tmp_path / "b" / "bank.safetensors").read_bytes())
    blob[-1] ^= 1
    (tmp_path / "b" / "bank.safetensors").write_bytes(bytes(blob))
    with pytest.raises(LatentSiftError, match="checksum"):
        Bank.load(tmp_path / "b")
    with pytest.raises(LatentSiftError, match="not a bank directory"):
        Bank.load(tmp_path)


def test_split_by_repo_partitions_and_balances():
    sizes = {"a": 50, "b": 30, "c": 20, "d": 20, "e": 10, "f": 5, "g": 5}
    repos = {f"{r}-{i}": r for r, n in sizes.items() for i in range(n)}
    folds = split_by_repo(repos, n_folds=3, seed=0)
    assert folds == split_by_repo(dict(reversed(list(repos.items()))), n_folds=3, seed=0)
    evals = [e for _, e in folds]
    assert sorted(r for e in evals for r in e) == sorted(sizes)
    for bank_repos, eval_repos in folds:
        assert not set(bank_repos) & set(eval_repos)
        assert set(bank_repos) | set(eval_repos) == set(sizes)
    loads = sorted(sum(sizes[r] for r in e) for e in evals)
    assert loads == [45, 45, 50]  # greedy, largest first: a | b+e+f | c+d+g
    with pytest.raises(LatentSiftError, match="'n_folds' parameter of split_by_repo"):
        split_by_repo(repos, n_folds=8)


def test_leave_one_repo_out_and_select():
    repos = {"t1": "a", "t2": "b", "t3": "a", "t4": "c"}
    assert leave_one_repo_out(repos) == [(["b", "c"], ["a"]), (["a", "c"], ["b"]), (["a", "b"], ["c"])]
    assert select_by_repo(repos, include=["a"]) == ["t1", "t3"]
    assert select_by_repo(repos, exclude=["a"]) == ["t2", "t4"]
    with pytest.raises(LatentSiftError, match="unknown repositories \\['zz'\\]"):
        select_by_repo(repos, exclude=["zz"])
    with pytest.raises(LatentSiftError, match="at least 2 repositories"):
        leave_one_repo_out({"t": "a"})


def test_whitening_is_fitted_on_the_bank_and_travels_with_it(data, tmp_path):
    from latentsift.bank.bank import fit_whitening
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4000, 6)) @ np.diag([10.0, 3.0, 1.0, 1.0, 0.3, 0.1]) + 5.0
    mu, w = fit_whitening(x.astype(np.float32), shrinkage=0.0)
    cov = np.cov((x - mu) @ w, rowvar=False)
    np.testing.assert_allclose(cov, np.eye(6), atol=2e-2)
    # the ridge shrinks the smallest directions less than full whitening would
    _, w_ridge = fit_whitening(x.astype(np.float32))
    assert np.cov((x - mu) @ w_ridge, rowvar=False)[5, 5] < 0.1
    bw = Bank(normalize="whiten").fit(*data, FP)
    both = np.concatenate([Bank().fit(*data, FP).pos_["cot"], Bank().fit(*data, FP).neg_["cot"]])
    mu_c, w_c = bw.whiten_["cot"]
    np.testing.assert_allclose(mu_c, both.mean(axis=0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bw.pos_["cot"], (Bank().fit(*data, FP).pos_["cot"] - mu_c) @ w_c, atol=1e-4)
    z = np.random.default_rng(5).standard_normal((7, 16)).astype(np.float32)
    d_pos, _, i_pos, _ = bw.distances(z, "cot")
    bp, ip = brute(bw.pos_["cot"], (z - mu_c) @ w_c)
    np.testing.assert_allclose(d_pos, bp, atol=1e-3)
    assert (i_pos == ip).all()
    back = Bank.load(bw.save(tmp_path / "w"))
    for a, b in zip(bw.distances(z, "fn"), back.distances(z, "fn")):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="'normalize' parameter of Bank"):
        Bank(normalize="pca").fit(*data, FP)


# ---------------------------------------------------------------------- from trajectories, the fold loop
def _trajectories(data):
    from latentsift.trajectories.trajectory import Trajectory
    states, labels, inst, repos = data
    return [Trajectory(t, inst[t], repos[t], "", [], reward=float(labels[t])) for t in sorted(states, reverse=True)]


def test_a_bank_from_trajectories_is_the_bank_of_their_mappings(data, bank):
    states = data[0]
    b = Bank.from_trajectories(_trajectories(data), states, FP)
    assert b.traj_ids_ == bank.traj_ids_ and b.labels_ == bank.labels_
    assert b.instances_ == bank.instances_ and b.repos_ == bank.repos_
    for c in bank.channels:
        np.testing.assert_array_equal(b.pos_[c], bank.pos_[c])
        np.testing.assert_array_equal(b.neg_owner_[c], bank.neg_owner_[c])
    assert Bank.from_trajectories(_trajectories(data), states, FP, normalize="l2").normalize == "l2"


def test_the_fold_loop_pairs_bank_trajectories_with_held_out_pools(data):
    from latentsift.bank.bank import inner_folds, iter_folds
    trajs = _trajectories(data)
    splits = split_by_repo({t.traj_id: t.repo for t in trajs}, n_folds=3)
    folds = list(iter_folds(trajs, splits))
    assert [f.k for f in folds] == [0, 1, 2]
    for f in folds:
        assert {t.repo for t in f.bank_trajs} == set(f.bank_groups)
        assert {c.repo for p in f.eval_pools for c in p.candidates} == set(f.eval_groups)
        assert [p.instance_id for p in f.eval_pools] == sorted(p.instance_id for p in f.eval_pools)
    assert sorted(p.instance_id for f in folds for p in f.eval_pools) == sorted({t.instance_id for t in trajs})
    kept = list(iter_folds(trajs, splits, bank_filter=lambda t: t.label == 1))
    assert all(t.label == 1 for f in kept for t in f.bank_trajs)
    inner = list(inner_folds(trajs, seed=0))
    assert sorted(c.traj_id for f in inner for p in f.eval_pools for c in p.candidates) == sorted(data[0])


def test_a_repeated_search_is_answered_once_and_a_refit_forgets_it(data, monkeypatch):
    """Stage 1's ablations search one bank with the same query states: the bank searches once per
    (channel, query bytes); other queries, channels or a refit search again, and callers get copies."""
    b = Bank().fit(*data, FP)
    calls = []
    real = Bank._search
    monkeypatch.setattr(Bank, "_search", lambda self, q, cls, ch: calls.append((cls, ch)) or real(self, q, cls, ch))
    z = np.random.default_rng(5).standard_normal((7, 16)).astype(np.float32)
    first = b.distances(z, "cot")
    first[0][:] = -1  # a caller's change does not reach the bank's answer
    again = b.distances(z.copy(), "cot")
    assert len(calls) == 2
    for x, y in zip(again, b.distances(z, "cot")):
        np.testing.assert_array_equal(x, y)
    d_pos, _ = brute(b.pos_["cot"], z)
    np.testing.assert_allclose(again[0], d_pos, rtol=1e-5)
    b.distances(z, "obs"), b.distances(z[:6], "cot"), b.distances(z.astype(np.float64), "cot")
    assert len(calls) == 8
    b.fit(*data, FP)
    b.distances(z, "cot")
    assert len(calls) == 10
