"""Early pruning: prefix scores, the stop rule, the tokens-saved arithmetic, the offline
evaluation and the online Pruner (with the embedded model in the example loop)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift.bank.bank import Bank
from latentsift.protocol import evaluate_pruning, verdict
from latentsift.sift.prune import (POLICIES, PoolRun, PrefixBankSift, PrefixSift, Pruner, StepTokens, cut_length,
                                   cut_states, min_alive, prefix_prepare, simulate_pool, stop_decision, tokens_saved)
from latentsift.sift.scorer import LinearScorer
from latentsift.sift.rules import make_baseline
from latentsift.sift.sift import LatentSift
from latentsift.trajectories.trajectory import Pool, Step, Trajectory

from synthetic import FP, make_states  # tests/synthetic.py

ROOT = Path(__file__).resolve().parents[1]


def make_traj(tid, inst, repo, n_steps, reward):
    steps = [Step(cot="think " * (i + 1), fn=f"cmd{i}", obs="out " * (i + 2)) for i in range(n_steps)]
    return Trajectory(traj_id=tid, instance_id=inst, repo=repo, task_prompt="fix it", steps=steps, reward=reward)


def toks(traj):
    """Hand-made token counts: step i writes 10 (i + 1) model tokens and sees 100 observation tokens."""
    n = traj.n_steps
    return StepTokens(gen=10 * np.arange(1, n + 1), obs=np.full(n, 100))


@pytest.fixture(scope="module")
def world():
    """Bank repo 'org/bank' (30 trajectories), two evaluation repos of 3 pools x 6 candidates whose
    states drift towards the success direction with their quality (one resolved per pool)."""
    rng = np.random.default_rng(0)
    trajs, states = [], {}
    for i in range(30):
        t, y = f"bank/b{i:02d}", int(i % 2 == 0)
        n = 3 + i % 6
        states[t] = make_states(t, rng, 1.0 if y else -1.0, n)
        trajs.append(make_traj(t, f"bank__{i // 2}", f"org/bank{i % 2}", n, float(y)))
    for r in range(2):
        for p in range(3):
            for k in range(6):
                t, q = f"run{k}/eval{r}__{p}", [1.2, 0.8, 0.3, -0.3, -0.8, -1.2][(k + p) % 6]
                n = 3 + (k * 3 + p) % 8
                states[t] = make_states(t, rng, q, n)
                trajs.append(make_traj(t, f"eval{r}__{p}", f"org/eval{r}", n, float(q > 1.0)))
    tokens = {t.traj_id: toks(t) for t in trajs}
    return trajs, states, tokens


def _fit(trajs, states):
    ids = sorted(t.traj_id for t in trajs)
    lab = {t.traj_id: int(t.label) for t in trajs}
    bank = Bank().fit({i: states[i] for i in ids}, lab, {t.traj_id: t.instance_id for t in trajs},
                      {t.traj_id: t.repo for t in trajs}, FP)
    scorer = LinearScorer(lr=1e-2, max_epochs=5).fit([states[i] for i in ids], [lab[i] for i in ids], fingerprint=FP)
    return bank, scorer


def _eval_pools(trajs, repo):
    by = {}
    for t in trajs:
        if t.repo == repo:
            by.setdefault(t.instance_id, []).append(t)
    return [Pool(i, c) for i, c in sorted(by.items())]


def test_prefix_score_at_the_full_trajectory_equals_stage1(world):
    trajs, states, tokens = world
    bank, scorer = _fit([t for t in trajs if t.repo.startswith("org/bank")], states)
    pools = _eval_pools(trajs, "org/eval0")
    full = {c.traj_id: c.n_steps for p in pools for c in p.candidates}
    for branches in ("both", "distance", "learned"):
        f = LatentSift(bank, scorer if branches != "distance" else None, branches=branches, n_evidence=0)
        ref = f.prepare_many(pools, states, fingerprint=FP)
        fast = PrefixSift(f, pools, states, fingerprint=FP).prepare(full)
        slow = prefix_prepare(f, pools, states, full, fingerprint=FP)
        for i, p in ref.items():
            for got in (fast[i], slow[i]):
                assert f.rank_subset(got, p.traj_ids) == f.rank_subset(p, p.traj_ids)
                if p.q is not None:
                    np.testing.assert_allclose(got.q, p.q, rtol=1e-12)
    # a shorter cut: the fast path (distances once) equals the filter run on the cut states
    cut = {t: cut_length(tokens[t], "steps", 2) for t in full}
    f = LatentSift(bank, scorer, n_evidence=0)
    fast = PrefixSift(f, pools, states, fingerprint=FP).prepare(cut)
    slow = prefix_prepare(f, pools, states, cut, fingerprint=FP)
    for i in fast:
        np.testing.assert_allclose(fast[i].q, slow[i].q, rtol=1e-12)
        np.testing.assert_allclose(fast[i].q_lin, slow[i].q_lin, rtol=1e-5)
    # the length baselines on the full cut: their Stage-1 scores
    for name in ("shortest-tokens", "shortest-chars", "fewest-steps", "random"):
        b = make_baseline(name)
        st = {t: cut_states(states[t], full[t], 50 * full[t]) for t in full}
        assert {i: p.raw.tolist() for i, p in prefix_prepare(b, pools, st, full).items()} == \
               {i: p.raw.tolist() for i, p in b.prepare_many(pools, states).items()}


def test_cut_length_steps_tokens_and_beyond_the_end():
    tok = StepTokens(gen=np.array([10, 20, 30, 40]), obs=np.array([5, 5, 5, 5]))  # 100 model tokens
    assert [cut_length(tok, "steps", t) for t in (1, 2, 4, 9)] == [1, 2, 4, 4]  # beyond: whole trajectory
    assert [cut_length(tok, "tokens", f) for f in (0.1, 0.25, 0.3, 0.5, 0.75)] == [1, 2, 2, 3, 4]


def test_stop_rule_never_below_max3_halfk():
    ids = [f"c{i}" for i in range(8)]
    sc = list(range(8))  # c0 worst
    assert stop_decision(ids, sc, [True] * 8, 1.0, 8) == ["c0", "c1", "c2", "c3"]  # 8 - max(3, 4)
    assert stop_decision(ids, sc, [True] * 8, 0.2, 8) == ["c0", "c1"]  # ranks 0, 1/7 < 0.2
    # finished candidates are never stopped, but count as alive
    assert stop_decision(ids, sc, [i > 1 for i in range(8)], 1.0, 8) == ["c2", "c3", "c4", "c5"]
    # pools with no more than max(3, floor(K/2)) candidates are never pruned
    for k in (1, 2, 3):
        assert stop_decision(ids[:k], sc[:k], [True] * k, 1.0, k) == []
    assert min_alive(6) == 3 and min_alive(9) == 4
    assert stop_decision(ids[:4], sc[:4], [True] * 4, 1.0, 4) == ["c0"]


def test_tokens_saved_arithmetic_on_a_hand_made_pool():
    # five candidates, steps 4, 4, 2, 6, 3; model tokens 10 (i + 1) at step i, 100 observation tokens
    n = {"a": 4, "b": 4, "c": 2, "d": 6, "e": 3}
    tokens = {t: StepTokens(gen=10 * np.arange(1, m + 1), obs=np.full(m, 100)) for t, m in n.items()}
    scores = [{"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0, "e": 4.0}, {"a": 0, "b": 9.0, "c": 2, "d": -1.0, "e": 0.5}]
    cuts = [{t: min(2, m) for t, m in n.items()}, {t: min(3, m) for t, m in n.items()}]
    run = simulate_pool(list(n), n, cuts, lambda j, alive: {t: scores[j][t] for t in alive}, 0.2)
    # checkpoint 1 (2 steps): c is finished; only a (rank 0 < 0.2; b has 1/4) is stopped -> alive b, c, d, e
    # checkpoint 2 (3 steps): e is finished; d is lowest and running -> stopped; 3 alive left
    assert run.stopped == {"a": 2, "d": 3}
    assert sorted(run.survivors) == ["b", "c", "e"]
    gen, obs = tokens_saved(run, tokens)
    assert gen == (30 + 40) + (40 + 50 + 60)  # a: steps 2-3; d: steps 3-5
    assert obs == 2 * 100 + 3 * 100
    # a checkpoint beyond every trajectory's length stops nobody
    late = simulate_pool(list(n), n, [{t: m for t, m in n.items()}], lambda j, a: {t: 0.0 for t in a}, 1.0)
    assert late.stopped == {}


def test_errors_are_clear(world):
    trajs, states, tokens = world
    with pytest.raises(LatentSiftError, match="The 'threshold' parameter of stop_decision must be a float in"):
        stop_decision(["a"], [0.0], [True], 0.0, 1)
    with pytest.raises(LatentSiftError, match="threshold"):
        stop_decision(["a"], [0.0], [True], 1.5, 1)
    with pytest.raises(LatentSiftError, match="policies"):
        evaluate_pruning(trajs, states, FP, [], tokens, fit=None, policies=["longest"])
    with pytest.raises(LatentSiftError, match="schedule"):
        evaluate_pruning(trajs, states, FP, [], tokens, fit=None, schedules={"time": (1,)})
    with pytest.raises(LatentSiftError, match="checkpoints"):
        evaluate_pruning(trajs, states, FP, [], tokens, fit=None, schedules={"tokens": (0.5, 1.5)})
    with pytest.raises(LatentSiftError, match="threshold"):
        Pruner(make_baseline("random"), ["a", "b"], threshold=2)
    p = Pruner(make_baseline("random"), ["a", "b", "c", "d"], checkpoints=(1,))
    with pytest.raises(LatentSiftError, match="no states yet"):
        p.step(1)
    with pytest.raises(LatentSiftError, match="not an alive candidate"):
        p.update("zz", states[trajs[0].traj_id])


def test_offline_evaluation_runs_and_chooses_thresholds_in_bank(world):
    trajs, states, tokens = world
    folds = [(["org/bank0", "org/bank1", "org/eval1"], ["org/eval0"]),
             (["org/bank0", "org/bank1", "org/eval0"], ["org/eval1"])]
    fitted = []

    def fit(name, bank_trajs):
        fitted.append((name, sorted({t.repo for t in bank_trajs})))
        return _fit(bank_trajs, states)

    res = evaluate_pruning(trajs, states, FP, folds, tokens, fit=fit, schedules={"steps": (2, 4), "tokens": (0.5,)},
                           thresholds=(0.3, 1.0), n_boot=50)
    # inner fits only ever see the bank fold's repositories (never the evaluation repository)
    for name, repos in fitted:
        k = int(name.split("-")[1])
        assert not set(repos) & set(folds[k][1])
    assert {n for n, _ in fitted} >= {"fold-0", "fold-0-inner-0", "fold-0-inner-1", "fold-1"}
    rows = {(r["policy"], r["schedule"], r["threshold"]): r for r in res["rows"]}
    assert set(POLICIES) <= {p for p, _, _ in rows}
    assert res["n_instances"] == 6 and res["k"] == [6]
    none = rows[("no pruning", "-", None)]
    assert none["gen_saved"]["mean"] == 0 and none["retention"]["mean"] == 1.0
    for (p, kind, th), r in rows.items():
        assert 0 <= r["gen_saved"]["lo"] <= r["gen_saved"]["mean"] <= r["gen_saved"]["hi"] < 1
        assert r["stopped_per_pool"] <= 3  # K = 6: never fewer than 3 alive
    # the state policies follow the planted signal: they keep a resolved candidate more often than random
    assert rows[("latentsift", "steps", 1.0)]["retention"]["mean"] > rows[("random", "steps", 1.0)]["retention"]["mean"]
    assert all(c["threshold"] in (0.3, 1.0) for p in res["chosen_thresholds"].values() for v in p.values() for c in v)
    assert "length-based pruning rules on these pools" in res["verdict"]["sentence"]
    # the report's section and figure read these numbers
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from latentsift.report.figures import _fig_pruning
    from latentsift.report.sections import _pruning_markdown
    md = "\n".join(_pruning_markdown(res))
    assert res["verdict"]["sentence"] in md and "| latentsift | steps | in-bank |" in md
    assert f"{100 * rows[('latentsift', 'steps', 1.0)]['gen_saved']['mean']:.2f}" in md
    fig = _fig_pruning({"pruning": res}, plt)
    assert len(fig.axes) == 2
    plt.close(fig)
    # the prefix bank is one bank per checkpoint, cut the same way
    pb = PrefixBankSift([t for t in trajs if t.repo.startswith("org/bank")], states, FP, tokens)
    f = pb.filter_at("steps", 2)
    assert f.bank.state_counts() and pb.filter_at("steps", 2) is f


def test_verdict_is_computed_from_the_numbers():
    def row(p, ret, gen):
        return {"policy": p, "schedule": "steps", "threshold": "in-bank", "retention": {"mean": ret},
                "gen_saved": {"mean": gen}}
    better = verdict({"rows": [row("latentsift", 0.95, 0.30), row("longest-so-far", 0.9, 0.2)]})
    assert better["beats"] and better["sentence"].startswith("State-based pruning beats")
    worse = verdict({"rows": [row("latentsift", 0.85, 0.10), row("longest-so-far", 0.9, 0.2)]})
    assert not worse["beats"] and "does not beat" in worse["sentence"]


@pytest.mark.model
def test_pruner_example_stops_the_known_hopeless_candidates(policy, one_torch_thread):
    spec = importlib.util.spec_from_file_location("prune_loop", ROOT / "examples" / "prune_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.main(k=6, steps=2, new_tokens=3, n_garbled=2, threshold=0.3, policy=policy, log=lambda m: None)
    assert res["stopped"]  # at least one candidate stopped
    assert res["garbled_stopped_first"], res["decisions"][0]
    first = res["decisions"][0]
    assert first["checked"] and set(first["scores"]) == {f"cand-{j}" for j in range(6)}
    assert all(first["evidence"][t] for t in first["stop"])  # each stop comes with its strongest step
    # stopped candidates generated nothing after their stop
    assert all(res["generated"][t] <= 3 for t in res["stopped"])
    assert len(res["survivors"]) >= 3


def test_offline_evaluation_uses_the_protocols_grouping(world):
    """Folds by instance (the protocol's ``group_by="instance"``): the folds name instance ids and the
    evaluation groups by them; grouped by repository, the same folds would match nothing."""
    trajs, states, tokens = world
    insts = sorted({t.instance_id for t in trajs})
    held = [i for i in insts if i.startswith("eval0__")]
    folds = [([i for i in insts if i not in held], held)]
    seen = []

    def fit(name, bank_trajs):
        seen.append({t.instance_id for t in bank_trajs})
        return _fit(bank_trajs, states)

    kw = dict(fit=fit, schedules={"steps": (2,)}, thresholds=(1.0,), n_boot=20, inner=False)
    with pytest.raises(LatentSiftError, match="no fold has evaluation pools"):
        evaluate_pruning(trajs, states, FP, folds, tokens, **kw)
    res = evaluate_pruning(trajs, states, FP, folds, tokens, group=lambda t: t.instance_id, **kw)
    assert res["n_instances"] == len(held) and seen and not any(s & set(held) for s in seen)


@pytest.mark.model
def test_token_cache_is_keyed_by_the_model(policy, world, tmp_path):
    """The cached per-step token counts are reused for the same model only (prune/tokens.json)."""
    from dataclasses import replace

    from latentsift.protocol import cached_step_tokens
    from latentsift.sift.prune import step_tokens
    trajs = world[0][:4]
    path = tmp_path / "tokens.json"
    fp = policy.fingerprint
    first = cached_step_tokens(path, trajs, policy.tokenizer, fp)
    key = json.loads(path.read_text())["key"]
    again = cached_step_tokens(path, trajs, policy.tokenizer, fp)
    assert json.loads(path.read_text())["key"] == key and again.keys() == first.keys()
    other = replace(fp, tokenizer_sha="another-tokenizer")
    cached_step_tokens(path, trajs, policy.tokenizer, other)
    assert json.loads(path.read_text())["key"] != key  # recomputed for the other model, not reused
    direct = step_tokens(trajs, policy.tokenizer)
    assert all((first[t].gen == direct[t].gen).all() and (first[t].obs == direct[t].obs).all() for t in direct)


def test_a_run_reuses_a_bank_and_scorer_fitted_under_another_name_with_the_same_key(world, tmp_path, monkeypatch):
    """The pruning's inner splits of different folds often leave the same bank trajectories:
    ``Run.fit_fold`` copies that fit (the same arrays) instead of fitting again; another set is fitted."""
    from latentsift.protocol.crossval import CrossvalSettings
    from latentsift.protocol.run import Run

    trajs, states, _ = world
    run = Run(CrossvalSettings(pools="p", states="s", out=str(tmp_path), scorer_epochs=3), log=lambda m: None)
    bank_trajs = [t for t in trajs if t.repo.startswith("org/bank")]
    fits = []
    real = LinearScorer.fit
    monkeypatch.setattr(LinearScorer, "fit", lambda self, *a, **kw: (fits.append(1), real(self, *a, **kw))[1])
    b1, s1 = run.fit_fold(0, bank_trajs, states, FP, {}, "prune-inner-0")
    b2, s2 = run.fit_fold(2, bank_trajs, states, FP, {}, "prune-inner-1")
    assert len(fits) == 1 and (tmp_path / "folds" / "fold-2" / "prune-inner-1" / "key.json").is_file()
    assert np.array_equal(s1.W_, s2.W_) and list(b1.traj_ids_) == list(b2.traj_ids_)
    run.fit_fold(1, bank_trajs[:-2], states, FP, {}, "prune-inner-0")
    assert len(fits) == 2


def test_filters_sharing_a_scorer_score_each_cut_once(world, monkeypatch):
    """PrefixSift's shared cache: the learned prefix scores of a cut are computed once for every filter
    with that scorer, and are what each filter computes alone."""
    trajs, states, tokens = world
    bank, scorer = _fit([t for t in trajs if t.repo.startswith("org/bank")], states)
    pools = _eval_pools(trajs, "org/eval0")
    cuts = [{c.traj_id: cut_length(tokens[c.traj_id], "steps", v) for p in pools for c in p.candidates}
            for v in (1, 2, 4)]
    filters = [LatentSift(bank, scorer, branches=b, n_evidence=0) for b in ("both", "learned")]
    alone = [[PrefixSift(f, pools, states, fingerprint=FP).prepare(c) for c in cuts] for f in filters]
    calls = []
    original = type(scorer).decision_function
    monkeypatch.setattr(type(scorer), "decision_function",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    cache: dict = {}
    shared = [[PrefixSift(f, pools, states, fingerprint=FP, cache=cache).prepare(c) for c in cuts] for f in filters]
    assert len(calls) == len(cuts)  # one scoring per cut, not per filter
    for a, b in zip(alone, shared):
        for x, y in zip(a, b):
            for i in x:
                assert x[i].q_lin.tobytes() == y[i].q_lin.tobytes()
                assert (x[i].q is None) == (y[i].q is None) and (x[i].q is None or x[i].q.tobytes() == y[i].q.tobytes())
