"""Evaluation protocol: Best@K, Pass@K, retention, tokens, bootstrap, input errors, CLI."""
from __future__ import annotations

import itertools
import json
from math import comb

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift._core.io import jsonable
from latentsift.cascade.cascade import CandidateRecord, PoolSpec, run_cascade
from latentsift.metrics.bootstrap import bootstrap_indices, bootstrap_weights, draw_subsets, instance_seed
from latentsift.metrics.evaluate import EvaluateSettings, evaluate_run
from latentsift.metrics.formats import load_pool_file, load_scores, pools_from_trajectories, save_pool_file, save_scores
from latentsift.cascade.verifier import Verdict, VerifierFailure, save_results

DATA = "/work/shared/datasets/swebench-lite-pools"


def verdicts(scores, n_in):
    return {t: Verdict(t, s, s, 1 - s, n_in[t], 1) for t, s in scores.items()}


@pytest.fixture
def tiny():
    """Instance x: a is the only resolved candidate; the EF verifier likes it; LatentSift does not."""
    ids = ("x/a", "x/b", "x/c", "x/d")
    labels = dict(zip(ids, (1, 0, 0, 0)))
    records = {t: CandidateRecord(t, "x", labels[t]) for t in ids}
    n_in = dict(zip(ids, (1000, 2000, 3000, 4000)))
    efv = verdicts(dict(zip(ids, (0.9, 0.8, 0.7, 0.1))), n_in)
    ls = dict(zip(ids, (0.1, 0.5, 0.6, 0.7)))  # ranks a lowest
    return [PoolSpec("x", ids)], records, efv, ls


def test_best_at_k_retention_and_tokens_by_hand(tiny):
    pools, records, efv, ls = tiny
    s = evaluate_run(pools, {"ef": efv, "latentsift": ls, "none": None}, records,
                     EvaluateSettings(ks=[2, 4], n_boot=50), final_verifier=efv)
    best = s["best_at_k"]
    # K=2: 6 pairs, 3 contain a; Stage 1 keeps both; the EF verifier picks a whenever drawn.
    for f in ("ef", "latentsift", "none"):
        assert best["filters"][f][2]["mean"] == pytest.approx(0.5)
    assert best["oracle_pass"][2]["mean"] == pytest.approx(0.5)
    assert best["random"][2]["mean"] == pytest.approx(0.25)
    # K=4: keep 3. EF keeps a,b,c -> picks a; LatentSift keeps b,c,d -> loses a.
    assert best["filters"]["ef"][4]["mean"] == 1.0 and best["filters"]["latentsift"][4]["mean"] == 0.0
    assert s["retention"]["ef"][4]["mean"] == 1.0 and s["retention"]["latentsift"][4]["mean"] == 0.0
    assert s["retention"]["none"][4]["mean"] == 1.0
    tok = s["tokens"]["workflows"]
    # Original: all 4 calls (10,000 + 4 output tokens). LatentSift: Stage-4 calls on b, c, d.
    assert tok["ef"][4]["ef"]["mean"] == 10_004 and tok["latentsift"][4]["ef"]["mean"] == 9_003
    # K=2: original pays both drawn (mean pair cost = 2 x 2,500 + 2); LatentSift the same two calls.
    assert tok["ef"][2]["ef"]["mean"] == pytest.approx(5_002)
    assert s["tokens"]["savings"]["latentsift"][4]["ef"]["mean"] == pytest.approx(1 - 9_003 / 10_004)
    assert s["pools"]["draws"][4] == {"exact": 1, "sampled": 0, "n_draws": 1}


def _random_pool(rng, iid, n):
    ids = tuple(f"{iid}/{j}" for j in range(n))
    records = {t: CandidateRecord(t, iid, int(rng.random() < 0.4),
                                  None if rng.random() < 0.3 else float(rng.integers(0, 3)),
                                  float(rng.integers(0, 2)) if n % 2 == 0 else None) for t in ids}
    return PoolSpec(iid, ids, 777.0), records


def test_best_at_k_equals_direct_enumeration_and_replays_sampled_draws():
    rng = np.random.default_rng(1)
    pools, records = [], {}
    for i, n in enumerate((6, 7, 8)):
        p, r = _random_pool(rng, f"inst{i}", n)
        pools.append(p)
        records.update(r)
    ids = [t for p in pools for t in p.traj_ids]
    final = verdicts({t: float(rng.integers(0, 4)) / 4 for t in ids}, {t: int(rng.integers(10, 99)) for t in ids})
    filt = {t: float(rng.integers(0, 3)) for t in ids}  # many ties at the cut
    for exact, n_draws in ((True, 200), (False, 37)):
        s = evaluate_run(pools, {"f": filt}, records,
                         EvaluateSettings(ks=[3, 5], n_draws=n_draws, exact=exact, seed=4, n_boot=20),
                         final_verifier=final)
        for k in (3, 5):
            per_inst, tokens, reach = [], [], []
            for p in pools:
                if exact:
                    subs = list(itertools.combinations(range(p.n), k))
                    assert len(subs) == comb(p.n, k) <= 200
                else:
                    subs, _ = draw_subsets(p.n, k, n_draws, instance_seed(4, k, p.instance_id), exact=False)
                outs = [run_cascade([p.traj_ids[i] for i in sub], filt, records, final_verifier=final,
                                    testgen_tokens=p.testgen_tokens, seed=4,
                                    pool_has_gen_tests=any(records[t].gen_test is not None for t in p.traj_ids))
                        for sub in subs]
                per_inst.append(np.mean([o.value for o in outs]))
                tokens.append(np.mean([o.total_tokens for o in outs]))
                reach.append(np.mean([o.stage3_reached for o in outs]))
            assert s["best_at_k"]["filters"]["f"][k]["mean"] == pytest.approx(np.mean(per_inst), abs=1e-12)
            assert s["tokens"]["workflows"]["f"][k]["total"]["mean"] == pytest.approx(np.mean(tokens), abs=1e-9)
            assert s["tokens"]["workflows"]["f"][k]["stage3_rate"]["mean"] == pytest.approx(np.mean(reach))


def test_bootstrap_intervals_are_seeded_and_bracket_the_mean():
    rng = np.random.default_rng(2)
    pools, records = [], {}
    for i in range(30):
        p, r = _random_pool(rng, f"i{i:02d}", 5)
        pools.append(PoolSpec(p.instance_id, p.traj_ids, None))
        records.update(r)
    ids = list(records)
    final = verdicts({t: float(rng.random()) for t in ids}, {t: 50 for t in ids})
    filt = {t: float(rng.random()) for t in ids}
    a = evaluate_run(pools, {"f": filt}, records, EvaluateSettings(ks=[4], n_boot=300, seed=9), final_verifier=final)
    b = evaluate_run(pools, {"f": filt}, records, EvaluateSettings(ks=[4], n_boot=300, seed=9), final_verifier=final)
    assert a.to_json() == b.to_json()
    c = a["best_at_k"]["filters"]["f"][4]
    assert c["lo"] < c["mean"] < c["hi"]
    r = a["retention"]["f"][4]
    assert r["lo"] <= r["mean"] <= r["hi"]


def test_k_larger_than_a_pool_is_an_error_or_dropped(tiny):
    pools, records, efv, ls = tiny
    small = PoolSpec("y", ("y/a", "y/b"))
    records = dict(records) | {"y/a": CandidateRecord("y/a", "y", 1), "y/b": CandidateRecord("y/b", "y", 0)}
    efv = dict(efv) | verdicts({"y/a": 0.2, "y/b": 0.3}, {"y/a": 5, "y/b": 5})
    ls = dict(ls) | {"y/a": 0.0, "y/b": 1.0}
    with pytest.raises(LatentSiftError, match=r"K=\[4\] is larger than some pools"):
        evaluate_run(pools + [small], {"ls": ls}, records, EvaluateSettings(ks=[2, 4]), final_verifier=efv)
    s = evaluate_run(pools + [small], {"ls": ls}, records, EvaluateSettings(ks=[2, 4], small_pools="drop", n_boot=10),
                     final_verifier=efv)
    assert s["pools"]["n_instances_by_k"] == {2: 2, 4: 1}
    with pytest.raises(LatentSiftError, match="larger than every pool"):
        evaluate_run(pools, {"ls": tiny[3]}, tiny[1], EvaluateSettings(ks=[5], small_pools="drop"),
                     final_verifier=tiny[2])


def test_unknown_or_missing_scores_are_errors(tiny):
    pools, records, efv, ls = tiny
    with pytest.raises(LatentSiftError, match="in no pool"):
        evaluate_run(pools, {"ls": ls | {"z/zz": 1.0}}, records, final_verifier=efv)
    with pytest.raises(LatentSiftError, match="has no score for 1 candidate"):
        evaluate_run(pools, {"ls": {k: v for k, v in ls.items() if k != "x/b"}}, records, final_verifier=efv)
    with pytest.raises(LatentSiftError, match="final_verifier"):
        evaluate_run(pools, {"ls": ls}, records)


def test_pool_file_round_trip_and_strict_parsing(tmp_path, tiny):
    pools, records, efv, ls = tiny
    path = save_pool_file(pools, records, tmp_path / "pools.jsonl")
    p2, r2 = load_pool_file(path)
    assert p2 == pools and r2 == records
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x", "candidates": [{"traj_id": "x/a", "label": 1}]}\n'
                   '{"instance_id": "y", "candidates": [{"traj_id": "y/a", "label": null}]}\n')
    with pytest.raises(LatentSiftError, match=r"bad.jsonl:2: candidates\[0\]: candidate 'y/a' has no label"):
        load_pool_file(bad)
    bad.write_text('{"instance_id": "y", "candidates": [{"traj_id": "y/a", "label": 1, "regresion": 3}]}\n')
    with pytest.raises(LatentSiftError, match="unknown field"):
        load_pool_file(bad)


def test_score_files_reject_unknown_candidate_ids(tmp_path, tiny):
    pools, records, efv, ls = tiny
    save_scores(ls, tmp_path / "ls", name="latentsift", components={"q_cot": {"x/a": 0.5}})
    s = load_scores(tmp_path / "ls", known_ids=records)
    assert s.kind == "filter" and s.name == "latentsift" and s.scores == ls and s.components == {"q_cot": {"x/a": 0.5}}
    (tmp_path / "other.jsonl").write_text('{"traj_id": "x/a", "score": 1}\n{"traj_id": "x/zz", "score": 2}\n')
    with pytest.raises(LatentSiftError, match=r"other.jsonl:2: unknown candidate id 'x/zz'"):
        load_scores(tmp_path / "other.jsonl", known_ids=records)
    failing = dict(efv) | {"x/b": VerifierFailure("x/b", "timeout after 1 s", attempts=4)}
    save_results(failing, tmp_path / "ef", name="smol")
    e = load_scores(tmp_path / "ef", known_ids=records)
    assert e.kind == "ef" and e.scores["x/b"].score is None and e.scores["x/a"] == efv["x/a"]


def test_pools_from_real_trajectories_keep_unknown_regression_counts_unknown():
    from latentsift.trajectories.importers import import_paths

    res = import_paths([f"{DATA}/r2egym/acr-run-1.jsonl.gz"], labels=f"{DATA}/candidates.csv")
    trajs = [t for t in res.trajectories if t.instance_id.startswith("astropy")]
    pools, records = pools_from_trajectories(trajs)
    assert len(pools) == len({t.instance_id for t in trajs})
    by = {t.traj_id: t for t in trajs}
    for t, r in records.items():
        assert r.label == by[t].label
        assert r.regression == (None if "p2p_passed" not in by[t].tests else float(by[t].tests["p2p_passed"]))
    assert any(r.regression is None for r in records.values())  # no graded log -> unknown, not 0


def test_cli_evaluate_writes_the_report(tmp_path, tiny):
    from typer.testing import CliRunner

    from latentsift.cli import app

    pools, records, efv, ls = tiny
    save_pool_file(pools, records, tmp_path / "pools.jsonl")
    save_scores(ls, tmp_path / "ls", name="latentsift", components={"q_fn": ls})
    save_results(efv, tmp_path / "ef", name="smol")
    res = CliRunner().invoke(app, ["evaluate", str(tmp_path / "pools.jsonl"), "--scores",
                                   str(tmp_path / "ls"), "--scores", str(tmp_path / "ef"), "--out",
                                   str(tmp_path / "rep"), "--k", "2", "--k", "4", "--bootstrap", "20",
                                   "--no-filter"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert set(summary) >= {"settings", "pools", "retention", "best_at_k", "tokens", "ablations"}
    assert summary["best_at_k"]["filters"]["smol"]["4"]["mean"] == 1.0
    assert summary["settings"]["filter_kinds"] == {"latentsift": "table", "smol": "ef", "none": "none"}
    assert (tmp_path / "rep" / "report.md").is_file() and (tmp_path / "rep" / "best_at_k_tokens.png").is_file()


def test_one_resampler_gives_indices_and_their_weights():
    idx = bootstrap_indices(5, 40, np.random.default_rng(3))
    w = bootstrap_weights(5, 40, np.random.default_rng(3))  # the same draws, as multiplicities
    assert w.shape == (40, 5) and np.all(w.sum(axis=1) == 5)
    assert np.array_equal(w, np.stack([np.bincount(r, minlength=5) for r in idx]).astype(np.float64))


def test_jsonable_writes_nan_as_null_and_inf_only_when_asked():
    x = {"a": (np.float32(1.5), np.int64(2), np.bool_(True)), 3: [float("nan"), float("inf")]}
    assert jsonable(x) == {"a": [1.5, 2, True], "3": [None, float("inf")]}
    assert jsonable(x, finite=True)["3"] == [None, None]
    assert json.dumps(jsonable(x, finite=True), allow_nan=False)

