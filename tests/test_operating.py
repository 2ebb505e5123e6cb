"""Calibration and the recall-targeted keep rule (conformal risk control) on synthetic pools."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import refused

from latentsift import LatentSiftError
from latentsift.cli import app
from latentsift.states.extract import extract_pools
from latentsift.trajectories.importers import import_paths
from latentsift.trajectories.trajectory import Step, Trajectory, group_pools, load_jsonl, save_jsonl
from synthetic import FP, make_states
from latentsift.metrics.calibrate import ece, ece_ci, fit_calibration, reliability
from latentsift.deploy.operating import apply_operating_point
from latentsift.protocol.operating import operating_points
from latentsift.sift.keep import (CalibrationPools, RecallKeep, check_calibration_size, crc_threshold, keep_mask,
                                  min_calibration_pools, pool_miss_score)
from latentsift.sift.sift import CandidateScore, PoolResult


def synthetic_pools(rng, n_pools, k=6, signal=1.5):
    """Exchangeable pools: latent quality per candidate, score = quality + noise, label ~ Bernoulli."""
    q = rng.standard_normal((n_pools, k))
    y = (rng.random((n_pools, k)) < 1 / (1 + np.exp(-(2 * q - 1.5)))).astype(int)
    s = signal * q + rng.standard_normal((n_pools, k))
    ids = [[f"p{i}/c{j}" for j in range(k)] for i in range(n_pools)]
    return CalibrationPools([f"p{i}" for i in range(n_pools)], ids, list(s), list(y))


def realized(op, pools: CalibrationPools):
    """(pool recall over pools holding a resolved candidate, mean candidates kept per pool)."""
    hit, pos, kept = 0, 0, 0
    for t, s, y in zip(pools.traj_ids, pools.scores, pools.labels):
        m = op.keep(s, t)
        kept += m.sum()
        if y.any():
            pos += 1
            hit += bool((m & (y == 1)).any())
    return hit / pos, kept / len(pools.scores)


@pytest.mark.parametrize("target", [0.8, 0.9])
def test_expected_recall_reaches_the_target_over_many_exchangeable_splits(target):
    """What is tested: conformal risk control promises E[recall] >= R over the draw of calibration and
    test pools (marginal, not per split). Over 400 random splits the mean realized recall is at least
    R up to 3 Monte-Carlo standard errors, and at most R + 1/(n+1) + 3 s.e. (the rule is not
    trivially conservative: it keeps fewer than all 6 candidates on average)."""
    rng = np.random.default_rng(1)
    recalls, kept, ns = [], [], []
    for _ in range(400):
        cal, test = synthetic_pools(rng, 60), synthetic_pools(rng, 200)
        op = RecallKeep(target).fit(cal)
        r, k = realized(op, test)
        recalls.append(r)
        kept.append(k)
        ns.append(op.n_calibration_pools_)
    recalls = np.array(recalls)
    se = recalls.std(ddof=1) / np.sqrt(recalls.size)
    assert recalls.mean() >= target - 3 * se
    assert recalls.mean() <= target + 1 / (min(ns) + 1) + 3 * se
    assert np.mean(kept) < 5.5
    # a single split can fall below the target (the guarantee is in expectation): it does here
    assert (recalls < target).any()
    print(f"target {target}: mean realized recall {recalls.mean():.3f} (s.e. {se:.3f}), "
          f"{100 * np.mean(recalls < target):.0f}% of splits below, {np.mean(kept):.2f} of 6 kept")


def test_crc_threshold_allows_floor_alpha_n_plus_1_minus_1_losses():
    u = np.array([0.1, 0.2, 0.3, 0.4, np.inf, np.inf, 0.5, 0.6, 0.7])  # n = 9
    assert crc_threshold(u, 0.1) == 0.1         # 0.1 * 10 - 1 = 0 losses allowed
    assert crc_threshold(u, 0.2) == 0.2         # one loss: the pool at 0.1
    assert crc_threshold(u, 0.0) == -np.inf     # R = 1: keep all
    assert crc_threshold(u, 0.95) == np.inf     # every finite pool may be lost: min_keep only
    assert (u < crc_threshold(u, 0.3)).sum() == 2
    with pytest.raises(LatentSiftError, match="needs n >= 19"):
        crc_threshold(u, 0.05)
    assert min_calibration_pools(0.9) == 9 and min_calibration_pools(0.99) == 99 and min_calibration_pools(1.0) == 0
    with pytest.raises(LatentSiftError, match="needs at least 9 calibration pools"):
        check_calibration_size(8, 0.9)
    check_calibration_size(9, 0.9)
    check_calibration_size(0, 1.0)


def test_keep_rule_and_pool_miss_score_agree():
    ids = ["a", "b", "c", "d"]
    s = np.array([0.9, 0.2, 0.5, np.nan])
    assert keep_mask(s, ids, np.inf, 1).tolist() == [True, False, False, False]       # confident: one
    assert keep_mask(s, ids, -np.inf, 1).tolist() == [True, True, True, True]         # keep all
    assert keep_mask(s, ids, 0.5, 1).tolist() == [True, False, True, False]
    assert keep_mask(s, ids, np.inf, 2).tolist() == [True, False, True, False]        # min_keep 2
    y = np.array([0, 1, 0, 0])
    u = pool_miss_score(s, y, ids, 1)
    assert u == 0.2
    for tau in (0.1, 0.2, 0.3, 0.9):      # lost exactly when tau > u
        assert (not (keep_mask(s, ids, tau, 1) & (y == 1)).any()) == (tau > u)
    assert pool_miss_score(s, np.array([1, 0, 0, 0]), ids, 1) == np.inf
    assert np.isnan(pool_miss_score(s, np.zeros(4), ids, 1))


def test_calibration_maps_are_monotone_and_ece_of_a_calibrated_model_is_small():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(4000)
    p_true = 1 / (1 + np.exp(-2 * s))
    y = (rng.random(4000) < p_true).astype(int)
    for method in ("isotonic", "platt"):
        m = fit_calibration(s, y, method)
        grid = np.linspace(-4, 4, 200)
        assert np.all(np.diff(m.predict(grid)) >= -1e-12)
        assert ece(m.predict(s), y) < 0.05
        assert np.abs(m.predict(grid) - 1 / (1 + np.exp(-2 * grid)))[50:150].max() < 0.15
    assert ece(np.full(4000, 0.9), y) > 0.3          # a badly calibrated constant
    groups = [f"p{i // 4}" for i in range(4000)]
    ci = ece_ci(p_true, y, groups, n_boot=200, seed=0)
    assert ci["lo"] <= ci["mean"] <= ci["hi"] and ci["hi"] < 0.08
    rel = reliability(p_true, y)
    assert sum(rel["count"]) == 4000 and np.allclose(rel["mean_p"], rel["frac_resolved"], atol=0.06)
    const = fit_calibration([0.1, 0.5, 0.9], [1, 1, 1])
    assert np.allclose(const.predict([0.0, 2.0]), 1.0)


def _pool(iid, scores):
    cands = [CandidateScore(traj_id=f"{iid}/{j}", instance_id=iid, s=float(v), retained=False)
             for j, v in enumerate(scores)]
    return PoolResult(iid, "x", 0, cands)


def test_a_flagged_pool_is_never_reported_as_guaranteed():
    rng = np.random.default_rng(3)
    cal = synthetic_pools(rng, 80)
    op = RecallKeep(0.9).fit(cal)
    results = [_pool(f"p{i}", rng.standard_normal(5)) for i in range(6)]
    for on_shift in ("keep-all", "warn"):
        rows = apply_operating_point(results, op, shifted=["p1", "p4"], on_shift=on_shift)
        assert [r["guaranteed"] for r in rows] == [True, False, True, True, False, True]
        assert [r["shift"] for r in rows] == ["passed", "flagged", "passed", "passed", "flagged", "passed"]
        for r, res in zip(rows, results):
            assert r["n_keep"] == res.n_keep == sum(c.retained for c in res.candidates) >= 1
            assert set(r["probabilities"]) == {c.traj_id for c in res.candidates}
        if on_shift == "keep-all":
            assert rows[1]["n_keep"] == 5 and rows[4]["n_keep"] == 5 and "keep-all" in rows[1]["reason"]
        else:
            assert "no guarantee" in rows[1]["reason"]
    # no shift check, or a failed condition: not guaranteed, and the record says which
    rows = apply_operating_point(results, op, shift_checked=False, failed={"p2": ["leak"]})
    assert [r["not_guaranteed"] for r in rows[:3]] == [["shift unchecked"], ["shift unchecked"],
                                                       ["leak", "shift unchecked"]]
    rows = apply_operating_point(results, op, failed={"": ["calibration in the bank"]})
    assert not any(r["guaranteed"] for r in rows) and rows[0]["not_guaranteed"] == ["calibration in the bank"]


# ---------------------------------------------------------------------- latentsift filter --target-recall, real data
def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def shared(tmp_path_factory, policy, data_dir):
    """Bank: 8 trajectories of psf/requests (ACR runs 1-2); pool to filter: pytest-dev__pytest-7432 (4
    candidates, one of each run); calibration: the first 10 other instances (by id, other repositories) with
    a candidate of each of the four runs (K = 4, as the pool: another K is not guaranteed), one of them
    resolved. Short renderings (4 tokens per span, 96 tokens)."""
    runs = [data_dir / "r2egym" / f"acr-run-{i}.jsonl.gz" for i in (1, 2, 3)] + [data_dir / "sweagent" / "cost_2_1.tar.gz"]
    trajs = import_paths(runs, labels=data_dir / "candidates.csv").trajectories
    requests = sorted({t.instance_id for t in trajs if t.repo == "psf/requests"})[:4]
    bank = [t for t in trajs if t.instance_id in requests and t.run in ("acr-run-1", "acr-run-2")]
    pools = [t for t in trajs if t.instance_id == "pytest-dev__pytest-7432"]
    by_inst: dict[str, list] = {}
    for t in trajs:
        if t.repo not in ("psf/requests", "pytest-dev/pytest"):
            by_inst.setdefault(t.instance_id, []).append(t)
    cal_ids = [i for i in sorted(by_inst) if len(by_inst[i]) == 4 and any(t.label == 1 for t in by_inst[i])][:10]
    cal = [t for i in cal_ids for t in by_inst[i]]
    assert len(cal_ids) == 10
    d = tmp_path_factory.mktemp("operating")
    save_jsonl(bank, d / "bank.jsonl")
    save_jsonl(pools, d / "pools.jsonl")
    save_jsonl(cal, d / "cal.jsonl")
    save_jsonl(cal[:24], d / "cal_small.jsonl")
    save_jsonl(cal + pools, d / "cal_and_pool.jsonl")
    extract_pools(policy, bank + pools + cal, d / "states", max_span_tokens=4, max_prompt_tokens=8, max_tokens=96)
    extract_pools(policy, cal, d / "states_other", max_span_tokens=6, max_prompt_tokens=8, max_tokens=96)
    assert _cli("bank", "build", d / "bank.jsonl", "--states", d / "states", "--out", d / "bank").exit_code == 0
    assert _cli("scorer", "train", d / "bank", "--out", d / "scorer", "--max-epochs", "5").exit_code == 0
    return d


@pytest.mark.model
def test_filter_target_recall_on_the_shared_data(shared):
    d = shared
    base = ["filter", d / "pools.jsonl", "--states", d / "states", "--bank", d / "bank", "--scorer", d / "scorer"]
    r = _cli(*base, "--target-recall", "0.9", "--calibration", d / "cal.jsonl", "--out", d / "f.json")
    assert r.exit_code == 0, r.output
    out = json.loads((d / "f.json").read_text())
    op = out["operating_point"]
    assert op["target_recall"] == 0.9 and op["n_calibration_pools"] == 10 and op["n_lost_allowed"] == 0
    assert op["calibration_pools"]["how"].startswith("split") and op["min_keep"] == 1
    assert op["on_shift"] == "keep-all" and op["shift_checked"]
    shifted = {x["instance_id"] for x in out["shift"]["pools"] if x["shifted"]}
    (row,) = op["pools"]
    (pool,) = out["pools"]
    assert row["instance_id"] == pool["instance_id"] == "pytest-dev__pytest-7432"
    assert row["n_keep"] == pool["n_keep"] == len(pool["retained"]) >= 1
    assert set(row["probabilities"]) == {c["traj_id"] for c in pool["candidates"]}
    assert all(0.0 <= p <= 1.0 for p in row["probabilities"].values())
    assert row["guaranteed"] == (row["instance_id"] not in shifted) and row["reason"]
    assert row["not_guaranteed"] == ([] if row["guaranteed"] else ["shift guard flagged the pool"])
    cp = op["calibration_pools"]
    assert cp["file"] == str((d / "cal.jsonl").resolve()) and cp["states"] == str((d / "states").resolve())
    assert cp["n_in_bank"] == 0 and cp["n_in_scorer_training"] == 0 and cp["states_settings"]["max_span_tokens"] == 4
    assert out["inputs"]["calibration"] == cp["file"] and "exchangeable" in op["promise"]
    # no calibration pool may lose its resolved candidates at n = 10, R = 0.9: each pool keeps every
    # candidate scoring at least the lowest best-resolved score of the calibration pools
    kept = [c for c in pool["candidates"] if c["retained"]]
    if op["threshold"] is not None and row["guaranteed"]:
        assert all(c["s"] >= op["threshold"] for c in kept if c["s"] < max(x["s"] for x in pool["candidates"]))
    # a rule (no bank) calibrated the same way: without states its shift is unchecked, so no pool is guaranteed
    r = _cli("filter", d / "pools.jsonl", "--method", "shortest-chars", "--target-recall", "0.9", "--calibration",
             d / "cal.jsonl", "--out", d / "g.json")
    assert r.exit_code == 0, r.output
    g = json.loads((d / "g.json").read_text())["operating_point"]
    assert g["calibration_pools"]["how"].startswith("split (a rule") and not g["shift_checked"]
    assert [(p["shift"], p["guaranteed"], p["not_guaranteed"]) for p in g["pools"]] == \
        [("unchecked", False, ["shift unchecked"])] and g["n_guaranteed"] == 0
    assert "1 shift unchecked" in " ".join(r.output.split())
    # with states, the rule's pools are checked against the calibration pools' states
    r = _cli("filter", d / "pools.jsonl", "--method", "shortest-chars", "--states", d / "states", "--target-recall",
             "0.9", "--calibration", d / "cal.jsonl", "--out", d / "h.json")
    assert r.exit_code == 0, r.output
    h = json.loads((d / "h.json").read_text())
    (row,) = h["operating_point"]["pools"]
    assert h["operating_point"]["shift_checked"] and h["shift"]["reference_of"].startswith("the calibration pools")
    assert row["shift"] in ("passed", "flagged") and row["guaranteed"] == (row["shift"] == "passed")


@pytest.mark.model
def test_filter_target_recall_refusals_before_any_work(shared):
    d = shared
    base = ["filter", d / "pools.jsonl", "--states", d / "states", "--bank", d / "bank", "--scorer", d / "scorer",
            "--out", d / "x.json"]
    for extra, words in ((["--target-recall", "0", "--calibration", d / "cal.jsonl"], ("--target-recall", "(0, 1]")),
                         (["--target-recall", "1.5", "--calibration", d / "cal.jsonl"], ("(0, 1]",)),
                         (["--target-recall", "0.99", "--calibration", d / "cal.jsonl"], ("at least 99", "has 10")),
                         (["--target-recall", "0.9", "--calibration", d / "cal_small.jsonl"], ("at least 9", "has 6")),
                         (["--target-recall", "0.9"], ("needs --calibration",)),
                         (["--calibration", d / "cal.jsonl"], ("with --target-recall only",)),
                         (["--target-recall", "0.9", "--calibration", d / "cal.jsonl", "--calibration-method", "beta"],
                          ("--calibration-method",)),
                         (["--target-recall", "0.9", "--calibration", d / "cal.jsonl", "--calibration-epochs", "0"],
                          ("--calibration-epochs",)),
                         (["--target-recall", "0.9", "--calibration", d / "cal_and_pool.jsonl"],
                          ("also pools to filter", "pytest-dev__pytest-7432")),
                         (["--target-recall", "0.9", "--calibration", d / "cal.jsonl", "--calibration-states",
                           d / "states_other"], ("other settings", "max_span_tokens"))):
        refused(_cli(*base, *extra), *words)
        assert not (d / "x.json").exists()


def test_protocol_commands_refuse_a_bad_target_recall_before_any_work(tmp_path):
    for cmd in (["crossval", tmp_path / "p.jsonl", "--states", tmp_path / "s", "--out", tmp_path / "o"],
                ["reproduce", "--data", tmp_path / "data", "--out", tmp_path / "o"]):
        for bad in ("0", "1.01"):
            refused(_cli(*cmd, "--target-recall", "0.9", "--target-recall", bad), "--target-recall", "(0, 1]")
        assert not (tmp_path / "o").exists()


def test_tiny_run_reports_operating_points(tiny_run):
    """The tiny run (4 pools, 2 folds) carries the section to the report. With 2 folds a bank without
    both folds is empty, so the trained filter has no clean calibration and says so per fold; the rules
    and the EF verifier calibrate on the other fold's pools, which are enough for the bound at R = 0.5
    (n >= 1): there the rule runs and some fold keeps fewer than its K candidates. (The rule on enough
    real pools, every fold running it: ``test_operating_points_on_the_shared_pools``.)"""
    data = json.loads(tiny_run["summary"])
    op = data["operating_points"]
    assert op["targets"] == [0.9, 0.95, 0.99] and op["reference"] == "shortest_chars"
    (pair,) = op["nested"]                                  # 2 folds: the one pair leaves an empty bank
    assert pair["status"].startswith("skipped: the bank without folds 0 and 1 holds 0 trajectories")
    mean_k = np.mean([len(p["candidates"]) for p in _pools(tiny_run["out"])])
    folds = op["filters"]["latentsift"]["targets"]["0.9"]["realized_recall"]["per_fold"]
    assert [f["calibration"] for f in folds] == ["no clean calibration"] * 2
    assert op["filters"]["latentsift"]["ece"]["n"] == 0    # no calibrated probability without a clean set
    for name in ("shortest_chars", "random", "ef_verifier"):
        e = op["filters"][name]
        assert {f["calibration"] for f in e["targets"]["0.9"]["realized_recall"]["per_fold"]} == {
            "label-free scores (no training)"}
        assert 0.0 <= e["ece"]["lo"] <= e["ece"]["mean"] <= e["ece"]["hi"] <= 1.0
        assert sum(e["reliability"]["count"]) == sum(len(p["candidates"]) for p in _pools(tiny_run["out"]))
        curve = {c["target"]: c for c in e["curve"]}
        assert curve[1.0]["verifier_calls"] == pytest.approx(mean_k) and curve[1.0]["recall"] == 1.0
        # R = 0.5: the rule runs; pooled calls below the mean K means some fold keeps fewer than its K
        assert curve[0.5]["verifier_calls"] < mean_k, name
    assert op["filters"]["shortest_chars"]["curve"][0]["verifier_calls"] < mean_k / 2
    # the way back for a new agent: bank of ACR, SWE-agent's candidates; no clean calibration with 2 folds
    pair = op["new_agent"]["pairs"]["acr -> sweagent"]
    swe = [c for p in _pools(tiny_run["out"]) for c in p["candidates"] if c.agent == "sweagent"]
    assert pair["n_new_agent_pools"] == len({c.instance_id for c in swe})
    assert set(pair["m_restored"].values()) == {None}
    report = (tiny_run["report"] / "report.md").read_text()
    assert "## Operating points" in report and "![reliability.png]" in report and "![cost_recall.png]" in report and "A way back" in report
    assert (tiny_run["report"] / "cost_recall.png").is_file()


def test_operating_points_on_the_shared_pools(shared_pools):
    """What is tested: on real pools (the shared data's 300 instances of the default runs, 87 with a
    resolved candidate, 4 repository folds), the recall-targeted rule of every label-free filter runs in
    every fold at R = 0.9 and 0.95 (each fold's calibration set, the other folds' pools, is large enough):
    no fold keeps every candidate by default, each fold's allowed losses are floor((1 - R)(n + 1) - 1)
    of its n calibration pools, some fold keeps fewer than K, and the recorded recall and calls are those
    of the fold's pools. Shortest-in-characters, which ranks resolved candidates higher on these pools,
    needs fewer calls than random at both targets."""
    run, trajs, folds, filters = shared_pools
    op = operating_points(run, trajs, folds, filters, None, targets=(0.9, 0.95))
    assert set(op["filters"]) >= {"shortest_chars", "fewest_steps", "random"}
    for name, e in op["filters"].items():
        for r in ("0.9", "0.95"):
            row = e["targets"][r]
            assert row["n_folds_keep_all"] == 0, (name, r)
            per = row["realized_recall"]["per_fold"]
            assert [f["status"] for f in per] == ["ok"] * 4, (name, r)
            for f in per:
                assert f["n_lost_allowed"] == int(np.floor((1 - float(r)) * (f["n_calibration_pools"] + 1) - 1 + 1e-9))
                assert 0.0 <= f["realized_recall"] <= 1.0 and 1.0 <= f["verifier_calls"] <= f["n_candidates"]
            assert any(f["verifier_calls"] < f["n_candidates"] for f in per), (name, r)   # some fold keeps fewer
            n = np.array([f["n_pools"] for f in per])
            assert row["verifier_calls"]["mean"] == pytest.approx(np.dot(n, [f["verifier_calls"] for f in per]) / n.sum())
            m = np.array([f["n_pools_with_resolved"] for f in per])
            assert row["realized_recall"]["pooled"]["mean"] == pytest.approx(
                np.dot(m, [f["realized_recall"] for f in per]) / m.sum())
    for r in ("0.9", "0.95"):
        calls = {n: op["filters"][n]["targets"][r]["verifier_calls"]["mean"] for n in ("shortest_chars", "random")}
        assert calls["shortest_chars"] < calls["random"] - 0.5, (r, calls)


def _pools(out):
    return [{"candidates": p.candidates} for p in group_pools(load_jsonl(out / "pools.jsonl"))]


def test_filter_target_recall_cross_fits_the_banks_own_pools_and_scores_disjoint_ones_with_the_bank(tmp_path):
    """Calibration pools in the bank are cross-fitted (two repository halves, a bank and scorer each);
    pools the bank has not seen are scored by it (split). Synthetic states, 4 bank repositories."""
    from latentsift.states.store import StateStore
    rng = np.random.default_rng(5)
    bank_trajs, cal_trajs, pool_trajs, states = [], [], [], {}

    def add(out, tid, inst, repo, quality, label):
        states[tid] = make_states(tid, rng, quality, n_steps=3)
        steps = [Step(cot="think " * (i + 1), fn=f"cmd{i}", obs="out" * (i + 2)) for i in range(3)]
        out.append(Trajectory(traj_id=tid, instance_id=inst, repo=repo, task_prompt="fix it", steps=steps,
                              reward=float(label)))

    for i in range(24):
        for j in range(3):
            lab = int(j == 0 or (j == 1 and i % 3 == 0))
            add(bank_trajs, f"r{j}/bank__{i}", f"bank__{i}", f"org/bank{i % 4}", 1.0 if lab else -1.0, lab)
            add(cal_trajs, f"r{j}/cal__{i}", f"cal__{i}", f"org/cal{i % 4}", 0.8 if lab else -0.8, lab)
    for j in range(3):  # a pool of the calibration pools' size (another K is not guaranteed)
        add(pool_trajs, f"r{j}/new__0", "new__0", "org/new", [1, 0, -1][j], int(j == 0))
    leak_trajs: list = []
    for j in range(3):  # other attempts at an instance of the bank
        add(leak_trajs, f"x{j}/bank__0", "bank__0", "org/bank0", 1.0 if j == 0 else -1.0, int(j == 0))
    store = StateStore(tmp_path / "states").create(FP, {"layers": [1, 2, 3], "store_dtype": "float32"})
    ids = sorted(states)
    inst = {t.traj_id: t.instance_id for t in bank_trajs + cal_trajs + pool_trajs + leak_trajs}
    store.write([states[t] for t in ids], [inst[t] for t in ids])
    save_jsonl(bank_trajs, tmp_path / "bank.jsonl")
    save_jsonl(cal_trajs, tmp_path / "cal.jsonl")
    save_jsonl(pool_trajs, tmp_path / "pools.jsonl")
    assert _cli("bank", "build", tmp_path / "bank.jsonl", "--states", tmp_path / "states", "--out",
                tmp_path / "bank").exit_code == 0
    r = _cli("scorer", "train", tmp_path / "bank", "--out", tmp_path / "scorer", "--max-epochs", "2", "--lr", "1e-3")
    assert r.exit_code == 0, r.output
    base = ["filter", tmp_path / "pools.jsonl", "--states", tmp_path / "states", "--bank", tmp_path / "bank",
            "--scorer", tmp_path / "scorer", "--target-recall", "0.9", "--calibration-epochs", "2"]
    for cal, how, out in (("bank.jsonl", "cross-fitted", "a.json"), ("cal.jsonl", "split", "b.json")):
        r = _cli(*base, "--calibration", tmp_path / cal, "--out", tmp_path / out)
        assert r.exit_code == 0, r.output
        op = json.loads((tmp_path / out).read_text())["operating_point"]
        assert op["calibration_pools"]["how"].startswith(how), op["calibration_pools"]
        assert op["n_calibration_pools"] == 24 and op["n_lost_allowed"] == 1
        # clear separation: every calibration pool ranks its resolved candidate first -> keep the best only
        assert op["threshold"] is None and op["threshold_meaning"] == "keep min_keep only"
        (row,) = op["pools"]
        shifted = json.loads((tmp_path / out).read_text())["shift"]["pools"][0]["shifted"]
        assert row["n_keep"] == (3 if shifted else 1)  # keep-all if flagged
        in_bank = ["24 calibration pools are in the bank (cross-fitted scores of half-size banks stand in for the "
                   "deployed bank's)"] if how == "cross-fitted" else []
        assert row["not_guaranteed"] == in_bank + (["shift guard flagged the pool"] if shifted else [])
        assert row["guaranteed"] == (not row["not_guaranteed"])
    # a pool whose instance is in the bank (allowed) is scored but not guaranteed: a leak
    save_jsonl(leak_trajs, tmp_path / "leaky.jsonl")
    r = _cli(*base[:1], tmp_path / "leaky.jsonl", *base[2:], "--calibration", tmp_path / "cal.jsonl", "--on-leak",
             "allow", "--on-shift", "warn", "--out", tmp_path / "l.json")
    assert r.exit_code == 0, r.output
    (row,) = json.loads((tmp_path / "l.json").read_text())["operating_point"]["pools"]
    assert not row["guaranteed"] and "leak: the pool's instance is in the bank" in row["not_guaranteed"]
    r = _cli(*base, "--calibration", tmp_path / "cal.jsonl", "--on-shift", "warn", "--out", tmp_path / "w.json")
    out = json.loads((tmp_path / "w.json").read_text())
    (row,) = out["operating_point"]["pools"]
    assert row["n_keep"] == 1 and out["pools"][0]["retained"] == ["r0/new__0"]
    assert row["guaranteed"] == (not out["shift"]["pools"][0]["shifted"])
    # the high-probability mode: the pools it needs are printed first; 24 suffice at 0.9, not at 0.95
    r = _cli(*base, "--calibration", tmp_path / "cal.jsonl", "--confidence", "0.9", "--out", tmp_path / "hp.json")
    assert r.exit_code == 0, r.output
    first = " ".join(r.output.split())
    assert first.startswith("--target-recall 0.9 --confidence 0.9 needs at least 22 calibration pools holding a "
                            "resolved candidate;") and "has 24" in first
    hp = json.loads((tmp_path / "hp.json").read_text())["operating_point"]
    assert hp["confidence"] == 0.9 and hp["n_lost_allowed"] == 0 and "Learn then Test" in hp["guarantee"]
    assert "with probability" in hp["promise"] and hp["n_calibration_pools_needed"] == 22
    refused(_cli(*base, "--calibration", tmp_path / "cal.jsonl", "--confidence", "0.95", "--out", tmp_path / "c.json"),
            "needs at least 29", "has 24")
    refused(_cli(*base, "--calibration", tmp_path / "cal.jsonl", "--confidence", "1", "--out", tmp_path / "c.json"),
            "confidence", "(0, 1)")
    refused(_cli(*base, "--calibration", tmp_path / "pools.jsonl", "--out", tmp_path / "c.json"), "also pools to filter")
    assert not (tmp_path / "c.json").exists()


# ---------------------------------------------------------------------- clean evaluation: nested calibration
def _synthetic_protocol(tmp, labels_of=None, seed=7, n_repos=8, per_repo=4, k=6, agents=("acr", "swe")):
    """Trajectories of ``n_repos`` repositories (``per_repo`` pools of ``k`` candidates, two agents), their
    synthetic states, and a protocol Run (4 repository folds) writing into ``tmp``; ``labels_of``: traj_id ->
    label overrides (the states keep the original quality)."""
    from latentsift.protocol.crossval import CrossvalSettings
    from latentsift.protocol.run import Run
    rng = np.random.default_rng(seed)
    trajs, states = [], {}
    for r in range(n_repos):
        for i in range(per_repo):
            inst = f"org__r{r}-{i}"
            q = rng.standard_normal(k)
            y = (rng.random(k) < 1 / (1 + np.exp(-(2.5 * q - 0.5)))).astype(int)
            for j in range(k):
                tid = f"{agents[j % 2]}/{inst}/{j}"
                lab = int(y[j]) if labels_of is None else labels_of.get(tid, int(y[j]))
                states[tid] = make_states(tid, rng, 0.6 * q[j], n_steps=2 + j % 3)
                steps = [Step(cot="think " * (s + 1 + j), fn=f"cmd{s}", obs="out" * (s + 2)) for s in range(2 + j % 3)]
                trajs.append(Trajectory(traj_id=tid, instance_id=inst, repo=f"org/r{r}", task_prompt="fix it",
                                        steps=steps, reward=float(lab), agent=agents[j % 2]))
    s = CrossvalSettings(pools="-", states="-", out=str(tmp), n_folds=4, variants=False, agent_transfer=True,
                         scorer_epochs=2, n_boot=50, ks=(3,), target_recalls=(0.8,))
    return Run(s, log=lambda m: None), trajs, states


def _operating_on(tmp, labels_of=None):
    from latentsift.protocol.nested import nested_calibration
    from latentsift.protocol.operating import operating_points
    from latentsift.protocol.stage1 import stage1_filters
    from latentsift.protocol.transfer_agents import agent_transfer
    run, trajs, states = _synthetic_protocol(tmp, labels_of)
    folds = run.folds(trajs)
    ds, _, _ = stage1_filters(run, trajs, folds, states, FP, None)
    ds |= agent_transfer(run, trajs, folds, states, FP)[0]
    nested = nested_calibration(run, trajs, folds, states, FP, None)
    return run, trajs, folds, operating_points(run, trajs, folds, ds, None, nested=nested, targets=(0.8,))


@pytest.fixture(scope="module")
def operating(tmp_path_factory):
    """The synthetic protocol's operating points with its own labels, made once for the tests that only read
    them (the permutation test and the reporting test): (run, trajs, folds, operating points)."""
    return _operating_on(tmp_path_factory.mktemp("operating-base"))


def test_permuting_a_folds_labels_leaves_its_threshold_unchanged(operating, tmp_path):
    """What is tested: fold k's operating point (threshold, calibrated probability there, calibration size)
    depends on the other folds' labels only. The labels of fold k's candidates are permuted (a seeded
    shuffle within fold k); every trained filter's fold-k threshold stays the same, while the other
    folds' thresholds (whose calibration sets hold fold k) move for some filter. Cross-fitted
    calibration (the other folds scored by their own fold's bank, trained on fold k) fails this."""
    run, trajs, folds, base = operating
    k = 1
    fold_k = {t.traj_id for t in trajs if run.group(t) in set(folds[k][1])}
    ids = sorted(fold_k)
    lab = {t.traj_id: int(t.label) for t in trajs}
    perm = np.random.default_rng(0).permutation(len(ids))
    flipped = {t: lab[ids[p]] for t, p in zip(ids, perm)}
    assert sum(flipped[t] != lab[t] for t in ids) >= 10          # a real change of fold k's labels
    _, _, _, perm_op = _operating_on(tmp_path, flipped)

    def point(op, name, fold):
        row = next(f for f in op["filters"][name]["targets"]["0.8"]["realized_recall"]["per_fold"] if f["fold"] == fold)
        return row["status"], row.get("threshold"), row.get("p_threshold"), row.get("n_calibration_pools")

    trained = [n for n in base["filters"] if n.startswith(("latentsift", "channels:", "distance:", "transfer:"))]
    assert "latentsift" in trained and any(n.startswith("transfer:") for n in trained)
    moved_elsewhere = False
    for name in trained:
        assert point(base, name, k) == point(perm_op, name, k), name
        assert point(base, name, k)[0] == "ok"       # the rule ran: it did not keep everything
        moved_elsewhere |= any(point(base, name, j) != point(perm_op, name, j) for j in range(4) if j != k)
    assert moved_elsewhere
    # every fold of every filter ran the rule (nothing kept whole by default), and keeps fewer than all
    for name, e in base["filters"].items():
        row = e["targets"]["0.8"]
        assert row["n_folds_keep_all"] == 0, name
        assert row["verifier_calls"]["mean"] < 6, name
        assert {f["calibration"] for f in row["realized_recall"]["per_fold"]} == (
            {"label-free scores (no training)"} if name in ("shortest_chars", "fewest_steps", "random")
            or not name.startswith(("latentsift", "channels:", "distance:", "weighting:", "branch:", "transfer:"))
            else {"nested"}), name
    assert [p["status"] for p in base["nested"]] == ["ok"] * 6


def test_operating_points_compare_at_realized_recall_with_one_multiplicity_rule(operating):
    """What is tested: every row carries its realized recall beside its calls, the paper's fixed rule's
    realized recall and calls on the same scores, the recall difference beside the calls difference, a
    Bonferroni interval over the whole family (wider than the 95% one), post-hoc rows marked, and one
    sentence per target naming the cheapest filter that reaches it and whether that is decided."""
    from latentsift.report.sections import _operating_markdown
    run, trajs, folds, op = operating
    names = list(op["filters"])
    mult = op["multiplicity"]
    assert mult["m"] == (len(names) - 1) * 1 + 1 and mult["level"] == pytest.approx(1 - 0.05 / mult["m"])
    for name, e in op["filters"].items():
        fx = e["fixed_rule"]
        assert fx["verifier_calls"]["mean"] == 3.0             # max(3, floor(6/2)) of every 6-candidate pool
        assert 0.0 <= fx["realized_recall"]["lo"] <= fx["realized_recall"]["mean"] <= 1.0
        assert e["post_hoc"] is False
        row = e["targets"]["0.8"]
        if name != op["reference"]:
            d = row["difference_vs_reference"]
            assert "realized_recall" in d
            a, b = d["verifier_calls_adjusted"], d["verifier_calls"]
            assert a["lo"] <= b["lo"] <= b["hi"] <= a["hi"] and a["mean"] == b["mean"]
    c = op["cheapest"]["0.8"]
    reach = {n: e["targets"]["0.8"] for n, e in op["filters"].items()
             if e["targets"]["0.8"]["realized_recall"]["pooled"]["mean"] >= 0.8}
    assert c["filter"] == min(reach, key=lambda n: (reach[n]["verifier_calls"]["mean"], n))
    assert c["n_reaching"] == len(reach) and c["decided"] == (c["difference"]["hi"] < 0)
    assert c["sentence"].startswith(f"At R = 0.8 the cheapest filter reaching the target is `{c['filter']}`")
    assert ("not decided" in c["sentence"]) == (not c["decided"])
    md = "\n".join(_operating_markdown({"operating_points": op, "settings": {"headline": names}}))
    assert "Bonferroni" in md and "fixed max(3, floor(K/2)): recall % / calls" in md and c["sentence"] in md
    # the way back for a new agent, expected and high-probability: the latter needs more of its pools
    pairs = op["new_agent"]["pairs"]
    assert pairs and "alone, confidence 0.9" in md
    for d in pairs.values():
        assert {x["confidence"] for x in d["rows"]} == {None, 0.9}
        e, h = d["m_restored"]["expected R=0.8"], d["m_restored"]["confidence 0.9 R=0.8"]
        assert e is not None and (h is None or h >= e)


def test_the_nested_calibration_says_each_pair_of_folds_as_it_ends(tmp_path):
    """Minutes a pair on a large run: the run's progress gets each pair of folds, in order, after Stage 1's
    four folds; the pairs' own Stage-1 runs report nothing (they would restart the outer stage1)."""
    from latentsift.protocol.nested import nested_calibration
    from latentsift.protocol.stage1 import stage1_filters
    run, trajs, states = _synthetic_protocol(tmp_path)
    said = []
    run.progress = lambda stage, done, total, info: said.append((stage, done, total))
    folds = run.folds(trajs)
    stage1_filters(run, trajs, folds, states, FP, None)
    nested_calibration(run, trajs, folds, states, FP, None, transfer=False)
    assert said == [("stage1", i, 4) for i in range(5)] + [("operating_nested", i, 6) for i in range(7)]
