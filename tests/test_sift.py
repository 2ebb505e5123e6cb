"""Stage 1: LatentSift and the baselines on synthetic states, then on real data."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from latentsift import FingerprintMismatch, LatentSiftError
from latentsift.bank.bank import Bank
from latentsift.sift.margin import channel_scores_grouped
from latentsift.states.model import Fingerprint
from latentsift.sift.rank import normalized_ranks, null_min_rank
from latentsift.sift.retain import retain_count
from latentsift.sift.scorer import LinearScorer
from latentsift._jobs.filter import filter_options
from latentsift.sift.rules import (FewestStepsFilter, RandomFilter, ShortestCharsFilter, ShortestTokensFilter,
                                   make_baseline)
from latentsift.sift.sift import LatentSift
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS, Pool, Step, Trajectory

L, D = 3, 8
FP = Fingerprint("TestArch", L, D, "tok", "tpl", "w", "float32")
DIRECTION = np.linspace(-1, 1, D).astype(np.float32)


def make_states(tid, rng, quality, *, n_steps=4, drop=()):
    """Spans drift along DIRECTION by ``quality`` (+ = like successes, - = like failures)."""
    steps, chans = [], []
    for t in range(n_steps):
        for c in CHANNELS:
            if c not in drop:
                steps.append(t)
                chans.append(CHANNEL_ID[c])
    layers = 0.3 * rng.standard_normal((len(steps), L, D)).astype(np.float32)
    layers += np.float32(quality) * DIRECTION
    return TrajectoryStates(tid, layers, np.array(steps, np.int32), np.array(chans, np.int8),
                            n_tokens=40 * n_steps + (len(tid) % 7))


def make_traj(tid, inst, repo, n_steps, reward=None):
    steps = [Step(cot="think " * (i + 1), fn=f"cmd{i}", obs="out" * (i + 2)) for i in range(n_steps)]
    return Trajectory(traj_id=tid, instance_id=inst, repo=repo, task_prompt="fix it", steps=steps, reward=reward)


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(0)
    bank_states, labels, inst, repos = {}, {}, {}, {}
    for i in range(30):
        t = f"bank/b{i:02d}"
        y = int(i % 2 == 0)
        bank_states[t] = make_states(t, rng, 1.0 if y else -1.0, n_steps=2 + i % 4)
        labels[t], inst[t], repos[t] = y, f"bankrepo__{i}", "org/bankrepo"
    bank = Bank().fit(bank_states, labels, inst, repos, FP)
    scorer = LinearScorer(lr=1e-2, max_epochs=10).fit(list(bank_states.values()), labels, fingerprint=FP)
    pools, states = [], {}
    for p in range(3):
        cands = []
        for k in range(6):
            t = f"run{k}/evalrepo__{p}"
            quality = [1.2, 0.8, 0.3, -0.3, -0.8, -1.2][(k + p) % 6]
            states[t] = make_states(t, rng, quality, n_steps=2 + (k * 3 + p) % 5)
            cands.append(make_traj(t, f"evalrepo__{p}", "org/evalrepo", 2 + (k * 3 + p) % 5, reward=float(quality > 0)))
        pools.append(Pool(f"evalrepo__{p}", cands))
    return bank, scorer, pools, states


def test_fields_follow_the_spec_equations(world):
    bank, scorer, pools, states = world
    res = LatentSift(bank, scorer).score(pools[0], states, fingerprint=FP)
    ids = [c.traj_id for c in res.candidates]
    assert ids == sorted(c.traj_id for c in pools[0].candidates)
    q = np.empty((len(ids), 3))
    for i, t in enumerate(ids):
        s = states[t]
        for j, c in enumerate(CHANNELS):
            sel = s.channel == CHANNEL_ID[c]
            d_pos, d_neg, _, _ = bank.distances(s.distance_states()[sel], c)
            q[i, j] = channel_scores_grouped(d_pos, d_neg, s.step[sel], np.zeros(len(d_pos), dtype=np.int64), 1)[0]
            assert res.candidates[i].q[c] == pytest.approx(q[i, j], rel=1e-9)
    r = np.stack([normalized_ranks(q[:, j]) for j in range(3)])
    s_dist = null_min_rank(r)  # the min over the channels through its null (Eq. 4'); all three here: the min's order
    np.testing.assert_array_equal(np.argsort(s_dist, kind="stable"), np.argsort(r.min(axis=0), kind="stable"))
    q_lin = scorer.decision_function([states[t] for t in ids])
    s_lin = normalized_ranks(q_lin)
    for i, c in enumerate(res.candidates):
        assert c.r == {ch: pytest.approx(r[j, i]) for j, ch in enumerate(CHANNELS)}
        assert (c.s_dist, c.q_lin, c.s_lin) == (pytest.approx(s_dist[i]), pytest.approx(q_lin[i]),
                                                pytest.approx(s_lin[i]))
        assert c.s == pytest.approx(0.5 * s_dist[i] + 0.5 * s_lin[i])
    assert res.n_keep == retain_count(6) == 3
    kept = sorted(res.candidates, key=lambda c: -c.s)[:3]
    assert {c.traj_id for c in kept} == set(res.retained) or len({c.s for c in res.candidates}) < 6


def test_distance_branch_prefers_success_like_candidates(world):
    bank, scorer, pools, states = world
    for pool in pools:
        res = LatentSift(bank, branches="distance").score(pool, states, fingerprint=FP)
        lab = {c.traj_id: c.label for c in pool.candidates}
        assert all(lab[t] == 1 for t in res.retained)
        assert all(min(c.q.values()) > 0 for c in res.candidates if lab[c.traj_id] == 1)


def test_deterministic_and_independent_of_candidate_order(world):
    bank, scorer, pools, states = world
    sift = LatentSift(bank, scorer)
    a = [r.to_dict() for r in sift.score_pools(pools, states, fingerprint=FP)]
    shuffled = []
    rnd = random.Random(3)
    for p in reversed(pools):
        c = list(p.candidates)
        rnd.shuffle(c)
        shuffled.append(Pool(p.instance_id, c))
    st = dict(sorted(states.items(), reverse=True))
    b = [r.to_dict() for r in LatentSift(bank, scorer).score_pools(shuffled, st, fingerprint=FP)]
    assert json.dumps(a) == json.dumps(b)
    c = [LatentSift(bank, scorer).score(p, states, fingerprint=FP).to_dict() for p in pools]
    assert json.dumps(a) == json.dumps(c)


def test_rank_subset_ranks_within_the_draw(world):
    bank, scorer, pools, states = world
    sift = LatentSift(bank, scorer)
    prep = sift.prepare(pools[1], states, fingerprint=FP)
    sub = prep.traj_ids[1:5]
    got = sift.rank_subset(prep, list(reversed(sub)))
    alone = sift.score(Pool(pools[1].instance_id, [c for c in pools[1].candidates if c.traj_id in sub]),
                       states, fingerprint=FP)
    assert got == {c.traj_id: pytest.approx(c.s) for c in alone.candidates}
    assert sift.retained_subset(prep, sub) == sorted(alone.retained)
    with pytest.raises(LatentSiftError, match="not a prepared candidate"):
        sift.rank_subset(prep, ["nope"])


def test_missing_channel_is_not_ranked(world):
    bank, scorer, _, _ = world
    rng = np.random.default_rng(9)
    st = {"x/a": make_states("x/a", rng, 2.0, drop=("obs",)), "x/b": make_states("x/b", rng, -2.0),
          "x/c": make_states("x/c", rng, -1.0)}
    pool = Pool("new__1", [make_traj(t, "new__1", "org/new", 4) for t in st])
    res = {c.traj_id: c for c in LatentSift(bank, scorer).score(pool, st, fingerprint=FP).candidates}
    # x/a has no observation: obs ranks x/b and x/c only, and x/a's s_dist comes from the min over cot and fn:
    # top of both among 3, P(M >= 1) = 1/9, P(M > 1) = 0 -> 1 - 1/18 (Eq. 4'), still the pool's highest
    assert res["x/a"].q["obs"] is None and res["x/a"].r["obs"] is None
    assert res["x/a"].r["cot"] == 1.0 and res["x/a"].s_dist == pytest.approx(17 / 18)
    assert res["x/a"].s_dist > max(res["x/b"].s_dist, res["x/c"].s_dist)
    assert {res["x/b"].r["obs"], res["x/c"].r["obs"]} == {0.0, 1.0}


def test_ablation_options(world):
    bank, scorer, pools, states = world
    pool = pools[2]
    full = LatentSift(bank, scorer).score(pool, states, fingerprint=FP)
    sub = LatentSift(bank, scorer, channels=("cot", "fn")).score(pool, states, fingerprint=FP)
    two = null_min_rank([[a.r[ch] for a in full.candidates] for ch in ("cot", "fn")])  # Eq. 4' over the subset
    for a, b, s2 in zip(full.candidates, sub.candidates, two):
        assert set(b.q) == {"cot", "fn"} and b.q["cot"] == a.q["cot"]
        assert b.s_dist == pytest.approx(s2)
    t = pool.candidates[0].traj_id
    s = states[t]
    sel = s.channel == CHANNEL_ID["fn"]
    d_pos, d_neg, _, _ = bank.distances(s.distance_states()[sel], "fn")
    w = s.step[sel].astype(float)
    for distance, ev in (("pos", -d_pos), ("neg", d_neg)):
        res = LatentSift(bank, scorer, distance=distance).score(pool, states, fingerprint=FP)
        c = next(c for c in res.candidates if c.traj_id == t)
        assert c.q["fn"] == pytest.approx((w * ev).sum() / w.sum(), rel=1e-6)
    res = LatentSift(bank, scorer, weighting="uniform").score(pool, states, fingerprint=FP)
    c = next(c for c in res.candidates if c.traj_id == t)
    assert c.q["fn"] == pytest.approx(np.mean(d_neg - d_pos), rel=1e-6)
    dist = LatentSift(bank, branches="distance").score(pool, states, fingerprint=FP)
    assert all(c.s == c.s_dist and c.q_lin is None for c in dist.candidates)
    lrn = LatentSift(bank, scorer, branches="learned").score(pool, states, fingerprint=FP)
    assert all(c.s == c.s_lin and c.q is None and not c.evidence for c in lrn.candidates)
    w3 = LatentSift(bank, scorer, fusion_weight=0.25).score(pool, states, fingerprint=FP)
    assert all(c.s == pytest.approx(0.25 * c.s_dist + 0.75 * c.s_lin) for c in w3.candidates)
    with pytest.raises(LatentSiftError, match="'scorer' parameter of LatentSift"):
        LatentSift(bank, None)
    with pytest.raises(LatentSiftError, match="'distance' parameter of LatentSift"):
        LatentSift(bank, scorer, distance="cosine")


def test_evidence_explains_q_and_names_bank_trajectories(world):
    bank, scorer, pools, states = world
    res = LatentSift(bank, scorer, n_evidence=100).score(pools[0], states, fingerprint=FP)
    for c in res.candidates:
        for ch in CHANNELS:
            ev = [e for e in c.evidence if e.channel == ch]
            assert sum(e.contribution for e in ev) == pytest.approx(c.q[ch], rel=1e-6, abs=1e-9)
            assert all(bank.labels_[e.pos_traj] == 1 and bank.labels_[e.neg_traj] == 0 for e in ev)
            assert all(e.evidence == pytest.approx(e.d_neg - e.d_pos) for e in ev)
    cands = LatentSift(bank, scorer).score(pools[0], states, fingerprint=FP).candidates
    assert all(len([e for e in c.evidence if e.channel == "cot"]) == min(3, states[c.traj_id].step.max() + 1)
               for c in cands)
    top = max(cands, key=lambda c: states[c.traj_id].step.max()).evidence
    cot = [abs(e.contribution) for e in top if e.channel == "cot"]
    assert cot == sorted(cot, reverse=True)


def test_guards_stop_with_clear_errors(world):
    bank, scorer, pools, states = world
    sift = LatentSift(bank, scorer)
    t = pools[0].candidates[0]
    leaked = Pool("bankrepo__3", [make_traj("run9/bankrepo__3", "bankrepo__3", "org/bankrepo", 3)])
    st = {"run9/bankrepo__3": states[t.traj_id]}
    with pytest.raises(LatentSiftError, match="in the bank.*'bankrepo__3'"):
        sift.score(leaked, st, fingerprint=FP)
    with pytest.raises(FingerprintMismatch, match="pool states come from a different model"):
        sift.score(pools[0], states, fingerprint=Fingerprint("TestArch", L, D, "tok", "tpl", "w2", "float32"))
    with pytest.raises(LatentSiftError, match="pass fingerprint="):
        sift.score(pools[0], states)
    with pytest.raises(LatentSiftError, match="no states for 1 candidate"):
        sift.score(pools[0], {k: v for k, v in states.items() if k != t.traj_id}, fingerprint=FP)


def test_baselines(world):
    _, _, pools, states = world
    pool = pools[0]
    steps = {c.traj_id: c.n_steps for c in pool.candidates}
    res = FewestStepsFilter().score(pool)
    assert all(c.raw == -steps[c.traj_id] for c in res.candidates)
    fewest = sorted(steps.values())[:3]
    assert sorted(steps[t] for t in res.retained) == fewest or len(set(steps.values())) < 6
    chars = ShortestCharsFilter().score(pool)
    assert all(c.raw == -next(x.n_chars for x in pool.candidates if x.traj_id == c.traj_id) for c in chars.candidates)
    tok = ShortestTokensFilter().score(pool, states)
    assert all(c.raw == -states[c.traj_id].n_tokens for c in tok.candidates)
    with pytest.raises(LatentSiftError, match="needs the candidates' states"):
        ShortestTokensFilter().score(pool)
    r0 = RandomFilter(seed=0).score(pool).to_dict()
    assert r0 == RandomFilter(seed=0).score(Pool(pool.instance_id, pool.candidates[::-1])).to_dict()
    assert [c.raw for c in RandomFilter(seed=1).score(pool).candidates] != [c["raw"] for c in r0["candidates"]]
    f = make_baseline("fewest-steps")
    prep = f.prepare(pool)
    sub = prep.traj_ids[:4]
    assert f.rank_subset(prep, sub) == dict(zip(sub, normalized_ranks([-steps[t] for t in sub])))


# ---------------------------------------------------------------------- CLI and real data
def _cli(*args):
    from typer.testing import CliRunner

    from latentsift.cli import app
    return CliRunner().invoke(app, [str(a) for a in args])


def _synthetic_store(path, states, fp, instance_of):
    from latentsift.states.store import StateStore
    store = StateStore(path).create(fp, {"layers": list(range(1, fp.n_layers + 1)), "store_dtype": "float32"})
    ids = sorted(states)
    store.write([states[t] for t in ids], [instance_of[t] for t in ids])
    return store


def test_cli_on_a_synthetic_store(tmp_path):
    from latentsift.trajectories.trajectory import save_jsonl
    rng = np.random.default_rng(4)
    bank_trajs, states = [], {}
    for i in range(20):
        t = f"bank/b{i:02d}"
        states[t] = make_states(t, rng, 1.0 if i % 2 == 0 else -1.0, n_steps=3)
        bank_trajs.append(make_traj(t, f"bankrepo__{i}", f"org/bank{i % 2}", 3, reward=float(i % 2 == 0)))
    pool_trajs = []
    for k in range(5):
        t = f"run{k}/evalrepo__1"
        states[t] = make_states(t, rng, [1, 0.5, 0, -0.5, -1][k], n_steps=4)
        pool_trajs.append(make_traj(t, "evalrepo__1", "org/eval", 4, reward=float(k < 2)))
    inst = {t.traj_id: t.instance_id for t in bank_trajs + pool_trajs}
    _synthetic_store(tmp_path / "states", states, FP, inst)
    save_jsonl(bank_trajs + pool_trajs, tmp_path / "all.jsonl")
    save_jsonl(pool_trajs, tmp_path / "pools.jsonl")
    r = _cli("bank", "build", tmp_path / "all.jsonl", "--states", tmp_path / "states", "--out", tmp_path / "bank",
             "--exclude-repos", "org/eval")
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "bank" / "manifest.json").read_text())
    assert man["label_counts"] == {"pos": 10, "neg": 10} and man["repos"] == ["org/bank0", "org/bank1"]
    r = _cli("scorer", "train", tmp_path / "bank", "--out", tmp_path / "scorer", "--max-epochs", "3", "--lr", "1e-3")
    assert r.exit_code == 0, r.output
    assert len(json.loads((tmp_path / "scorer" / "scorer.json").read_text())["history"]) == 4
    r = _cli("filter", tmp_path / "pools.jsonl", "--states", tmp_path / "states", "--bank", tmp_path / "bank",
             "--scorer", tmp_path / "scorer", "--out", tmp_path / "f.json", "--channels", "cot,fn", "--weighting",
             "uniform")
    assert r.exit_code == 0, r.output
    out = json.loads((tmp_path / "f.json").read_text())
    assert out["settings"]["channels"] == ["cot", "fn"] and out["n_retained"] == 3
    assert {c["traj_id"] for c in out["pools"][0]["candidates"] if c["retained"]} == \
        {"run0/evalrepo__1", "run1/evalrepo__1", "run2/evalrepo__1"}
    r = _cli("filter", tmp_path / "pools.jsonl", "--states", tmp_path / "states", "--out", tmp_path / "g.json",
             "--method", "fewest-steps")
    assert r.exit_code == 0 and json.loads((tmp_path / "g.json").read_text())["method"] == "fewest-steps"
    r = _cli("bank", "build", tmp_path / "all.jsonl", "--states", tmp_path / "states", "--out", tmp_path / "b2",
             "--repos", "org/bank1")
    assert r.exit_code == 2 and "empty positive class" in r.output  # a message, no traceback


@pytest.fixture(scope="module")
def real(tmp_path_factory, policy, data_dir):
    """Bank: 8 trajectories of repository psf/requests (ACR runs 1-2, both outcomes); held-out pool:
    one pytest instance (4 candidates: ACR runs 1-3 and SWE-agent run 1). Short renderings
    (4 tokens per span, first 96 tokens) keep the model time small; the mechanics are the same."""
    from latentsift.trajectories.importers import import_paths
    from latentsift.states.extract import extract_pools
    from latentsift.trajectories.trajectory import save_jsonl
    runs = [data_dir / "r2egym" / f"acr-run-{i}.jsonl.gz" for i in (1, 2, 3)] + [data_dir / "sweagent" / "cost_2_1.tar.gz"]
    trajs = import_paths(runs, labels=data_dir / "candidates.csv").trajectories
    requests = sorted({t.instance_id for t in trajs if t.repo == "psf/requests"})[:4]
    bank = [t for t in trajs if t.instance_id in requests and t.run in ("acr-run-1", "acr-run-2")]
    assert len(bank) == 8 and 0 < sum(t.label for t in bank) < 8
    pools = [t for t in trajs if t.instance_id == "pytest-dev__pytest-7432"]
    assert len(pools) == 4 and 0 < sum(t.label for t in pools) < 4
    d = tmp_path_factory.mktemp("real")
    save_jsonl(bank, d / "bank.jsonl")
    save_jsonl(pools, d / "pools.jsonl")
    save_jsonl(pools[::-1], d / "pools_reversed.jsonl")
    extract_pools(policy, bank + pools, d / "states", max_span_tokens=4, max_prompt_tokens=8, max_tokens=96)
    return d


@pytest.mark.model
def test_acceptance_real_data(real):
    from dataclasses import replace

    from latentsift.states.store import StateStore
    d = real
    assert _cli("bank", "build", d / "bank.jsonl", "--states", d / "states", "--out", d / "bank").exit_code == 0
    r = _cli("scorer", "train", d / "bank", "--out", d / "scorer")
    assert r.exit_code == 0, r.output
    runs = []
    for name in ("pools.jsonl", "pools.jsonl", "pools_reversed.jsonl"):
        r = _cli("filter", d / name, "--states", d / "states", "--bank", d / "bank", "--scorer", d / "scorer",
                 "--out", d / "f.json")
        assert r.exit_code == 0, r.output
        runs.append(json.loads((d / "f.json").read_text()))
    assert runs[0] == runs[1]
    assert runs[0]["pools"] == runs[2]["pools"]  # independent of the order of candidates
    assert [p["k"] for p in runs[0]["pools"]] == [4] and runs[0]["n_retained"] == 3
    for p in runs[0]["pools"]:  # s_dist: the min over the channels through its null (Eq. 4')
        s_dist = null_min_rank([[c["r"][ch] for c in p["candidates"]] for ch in CHANNELS])
        assert [c["s_dist"] for c in p["candidates"]] == pytest.approx(s_dist.tolist())
    for c in (c for p in runs[0]["pools"] for c in p["candidates"]):
        assert set(c["q"]) == set(CHANNELS)
        assert c["s"] == pytest.approx(0.5 * c["s_dist"] + 0.5 * c["s_lin"])
        assert c["evidence"] and all(e["pos_traj"].split("/")[1].startswith("psf__requests") for e in c["evidence"])
    # a candidate whose instance is in the bank
    r = _cli("filter", d / "bank.jsonl", "--states", d / "states", "--bank", d / "bank", "--scorer", d / "scorer",
             "--out", d / "x.json")
    assert r.exit_code == 2 and "in the bank" in r.output  # a message, no traceback
    # pool states from another model fingerprint
    store = StateStore(d / "states").open()
    ids = [c["traj_id"] for p in runs[0]["pools"] for c in p["candidates"]]
    other = StateStore(d / "other").create(replace(store.fingerprint, weights_sha="0" * 16), store.settings)
    loaded = store.load(ids)
    other.write([loaded[t] for t in ids], [store.instance_of(t) for t in ids])
    r = _cli("filter", d / "pools.jsonl", "--states", d / "other", "--bank", d / "bank", "--scorer", d / "scorer",
             "--out", d / "x.json")
    assert r.exit_code == 2 and "different model" in r.output  # a message, no traceback
    # a bank with an empty class
    unresolved = d / "unresolved.jsonl"
    from latentsift.trajectories.trajectory import load_jsonl, save_jsonl
    save_jsonl([t for t in load_jsonl(d / "bank.jsonl") if t.label == 0], unresolved)
    r = _cli("bank", "build", unresolved, "--states", d / "states", "--out", d / "b3")
    assert r.exit_code == 2 and "empty positive class" in r.output  # a message, no traceback


def test_filter_options_refuse_conflicts_before_any_work_and_resolve_the_defaults():
    both, dist = {"branches": "both"}, {"branches": "distance"}
    assert filter_options(bank_dir="b") == {"branches": "both", "on_leak": "error", "sift_settings": both}  # leakage
    assert filter_options(sifter_dir="s") == {"branches": "both", "on_leak": "allow", "sift_settings": both}  # knowledge
    assert filter_options(bank_dir="b", distance_only=True, on_leak="skip") == {"branches": "distance",
                                                                                "on_leak": "skip", "sift_settings": dist}
    # only the settings given reach the filter (its own defaults apply to the others)
    assert filter_options(bank_dir="b", channels="cot, fn", fusion_weight=0.2)["sift_settings"] == {
        "channels": ("cot", "fn"), "fusion_weight": 0.2, "branches": "both"}
    assert filter_options(method="random")["branches"] == "both"
    for kw, words in ((dict(distance_only=True, learned_only=True), "at most one of --distance-only"),
                      (dict(bank_dir="b", bank_choice="nearest"), "--bank-choice needs --sifter"),
                      (dict(sifter_dir="s", scorer_dir="c"), "pass only --sifter"),
                      (dict(sifter_dir="s", method="random"), "pass only --sifter"),
                      (dict(sifter_dir="s", approx="ivf"), "runs in one process"),
                      # a sifter keeps the settings it was fitted with: nothing is silently ignored
                      (dict(sifter_dir="s", fusion_weight=0.3), "drop --fusion-weight"),
                      (dict(sifter_dir="s", distance="pos", channels="cot"), "drop --channels, --distance"),
                      (dict(sifter_dir="s", weighting="uniform"), "drop --weighting"),
                      (dict(sifter_dir="s", distance_only=True), "drop --distance-only")):
        with pytest.raises(LatentSiftError, match=words):
            filter_options(**kw)

