"""Banks that transfer: one sifter from several runs and stores, a bank per agent, the bank chosen per pool.

Reuses the session's tiny end-to-end run (conftest ``tiny_run``): states of AutoCodeRover and SWE-agent
candidates on django (banks) and pytest (pools). The two agents are written to two pools files and
two state stores (the second holds the SWE-agent states copied from the run's store).
"""
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from latentsift._core.validation import FingerprintMismatch, LatentSiftError
from conftest import refused  # tests/conftest.py
from latentsift.cli import app
from latentsift.deploy.library import library_groups, open_stores
from latentsift._jobs.sifter import fit_sifter
from latentsift.deploy.sifter import Sifter
from latentsift.states.store import StateStore
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl
from latentsift.protocol.transfer import eval_sets

pytestmark = pytest.mark.model


def _copy_store(src: StateStore, dst, ids, *, fingerprint=None, settings=None) -> StateStore:
    out = StateStore(dst).create(fingerprint or src.fingerprint, settings or src.settings)
    states = src.load(ids)
    out.write([states[i] for i in ids], [src.instance_of(i) for i in ids])
    return out


@pytest.fixture(scope="module")
def two_runs(tiny_run, tmp_path_factory, one_torch_thread):
    run = tiny_run["out"]
    d = tmp_path_factory.mktemp("library")
    trajs = load_jsonl(run / "pools.jsonl")
    bank = [t for t in trajs if t.repo == "django/django"]
    save_jsonl([t for t in bank if t.agent == "acr"], d / "acr.jsonl")
    save_jsonl([t for t in bank if t.agent == "sweagent"], d / "swe.jsonl")
    for a in ("acr", "sweagent"):
        save_jsonl([t for t in trajs if t.repo != "django/django" and t.agent == a], d / f"{a}_pools.jsonl")
    store = StateStore(run / "states").open()
    swe_ids = sorted(t.traj_id for t in bank if t.agent == "sweagent")
    _copy_store(store, d / "swe_states", swe_ids)
    fit_sifter([d / "acr.jsonl", d / "swe.jsonl"], [run / "states", d / "swe_states"], d / "sifter",
               scorer_epochs=2, per_agent=True, log=lambda m: None)
    return d, run / "states", store, swe_ids


def test_fit_over_two_pool_files_and_two_stores_writes_one_sifter(two_runs):
    d, _, _, swe_ids = two_runs
    s = Sifter.load(d / "sifter")
    n_acr = len(load_jsonl(d / "acr.jsonl"))
    assert s.seen_["agents"] == ["acr", "sweagent"] and s.seen_["n_trajectories"] == n_acr + len(swe_ids)
    assert len(s.bank.traj_ids_) == n_acr + len(swe_ids)
    # the bank library: one sub-bank per agent (their scaffolds coincide with the agents here)
    assert [x.name for x in s.library_] == ["agent:acr", "agent:sweagent"]
    assert sorted(s.library_[1].bank.traj_ids_) == swe_ids and s.library_[1].agents == ["sweagent"]
    man = json.loads((d / "sifter" / "sifter.json").read_text())
    assert [e["name"] for e in man["library"]] == ["agent:acr", "agent:sweagent"]
    assert all((d / "sifter" / e["parts"]["bank"]).is_dir() for e in man["library"])
    assert man["library"][0]["shift_reference"]["agents"] == ["acr"]


def test_a_store_of_another_model_or_other_settings_is_refused_before_any_work(two_runs, tmp_path):
    d, states, store, swe_ids = two_runs
    other_model = _copy_store(store, tmp_path / "m", swe_ids[:1],
                              fingerprint=dataclasses.replace(store.fingerprint, weights_sha="0" * 16))
    other_spans = _copy_store(store, tmp_path / "s", swe_ids[:1], settings=store.settings | {"max_span_tokens": 99})
    for bad, err, what in ((other_model, FingerprintMismatch, "another model (weights_sha"),
                           (other_spans, LatentSiftError, "other settings (max_span_tokens=")):
        with pytest.raises(err, match=what.replace("(", r"\(")):
            fit_sifter([d / "acr.jsonl", d / "swe.jsonl"], [states, bad.path], tmp_path / "never", log=lambda m: None)
        assert not (tmp_path / "never").exists()
    r = CliRunner().invoke(app, ["fit", str(d / "acr.jsonl"), "--states", str(states), "--states",
                                 str(other_spans.path), "--out", str(tmp_path / "never")])
    refused(r, "max_span_tokens=")
    assert not (tmp_path / "never").exists()
    with pytest.raises(LatentSiftError, match="other settings"):
        open_stores([states, other_spans.path], "fit")


def test_nearest_picks_the_pools_own_agent_and_records_it(two_runs):
    d, states, _, _ = two_runs
    for agent in ("acr", "sweagent"):
        out = d / f"{agent}_filter.json"
        r = CliRunner().invoke(app, ["filter", str(d / f"{agent}_pools.jsonl"), "--states", str(states), "--sifter",
                                     str(d / "sifter"), "--bank-choice", "nearest", "--out", str(out)])
        assert r.exit_code == 0, r.output
        f = json.loads(out.read_text())
        choice = f["bank_choice"]
        assert choice["mode"] == "nearest" and [p["instance_id"] for p in choice["pools"]] == \
            [p["instance_id"] for p in f["pools"]]
        for p in choice["pools"]:
            assert p["chosen"] == f"agent:{agent}"
            assert set(p["distances"]) == {"agent:acr", "agent:sweagent"}
            assert p["distances"][p["chosen"]] == min(p["distances"].values())
        # the shift guard judged each pool against the chosen sub-bank
        ref = {b["name"]: b["shift_reference"] for b in choice["sub_banks"]}[f"agent:{agent}"]
        for x in f["shift"]["pools"]:
            assert x["bank"] == f"agent:{agent}" and x["threshold"] == pytest.approx(ref["loo_quantile"])
            assert x["median_nearest_bank_distance"] == pytest.approx(
                next(p for p in choice["pools"] if p["instance_id"] == x["instance_id"])["distances"][x["bank"]])
    r = CliRunner().invoke(app, ["filter", str(d / "acr_pools.jsonl"), "--states", str(states), "--bank-choice",
                                 "nearest", "--out", str(d / "x.json")])
    refused(r, "--sifter")


def test_library_groups_add_a_scaffold_shared_by_agents(tiny_run):
    trajs = load_jsonl(tiny_run["out"] / "pools.jsonl")
    for t in trajs:
        t.meta["scaffold"] = "one-scaffold"
    assert list(library_groups(trajs)) == ["agent:acr", "agent:sweagent", "scaffold:one-scaffold"]


def test_transfer_matrix_on_the_tiny_run(two_runs, tmp_path):
    d, states, _, _ = two_runs
    pools = [d / "acr.jsonl", d / "swe.jsonl", d / "acr_pools.jsonl", d / "sweagent_pools.jsonl"]
    trajs = [t for p in pools for t in load_jsonl(p)]
    sets = eval_sets(trajs)
    assert [s.name for s in sets] == ["acr pools", "sweagent pools", "acr + sweagent pools"]
    # through the command: its progress is one plain line per evaluated set and fold when not on a terminal
    r = CliRunner().invoke(app, ["transfer", *map(str, pools), "--states", str(states), "--out", str(tmp_path / "t"),
                                 "--folds", "2", "--bootstrap", "50", "--draws", "5", "--scorer-epochs", "0"])
    assert r.exit_code == 0, r.output
    assert "[transfer] acr pools: fold 1/2" in r.output and "[transfer] sweagent pools: fold 2/2" in r.output
    out = tmp_path / "t"
    summ = json.loads((out / "summary.json").read_text())
    names = [r["set"]["name"] for r in summ["sets"]]
    assert names == ["acr pools", "sweagent pools"]  # the mixed pools leave no other agent to bank from
    for r in summ["sets"]:
        assert r["bank_agents"] == [a for a in ("acr", "sweagent") if a not in r["set"]["agents"]]
        assert {"all / distance", "nearest / distance", "shortest_chars", "fewest-steps", "random"} <= set(r["auc"])
        # every bank is repository-disjoint from the pools it scored
        assert all(len(f) >= 1 for f in r["folds"])
        # nearest minus all, paired: its point estimate is the difference of the two AUCs in the table
        d = r["nearest_minus_all"]["distance"]
        assert d["estimate"] == pytest.approx(r["auc"]["nearest / distance"]["auc"]["auc"]
                                              - r["auc"]["all / distance"]["auc"]["auc"])
        assert d["lo"] <= d["estimate"] <= d["hi"] and d["outcome"] in ("higher", "lower", "undetermined")
    v = summ["verdict"]
    assert [p["set"] for p in v["paired"]] == names
    assert v["paired_verdict"] in ("nearest", "all", "undetermined")
    assert "## Which bank" in (out / "report.md").read_text()


def test_crossval_takes_several_runs_and_stores(two_runs, tiny_run, tmp_path):
    from latentsift.protocol import crossval

    d, states, _, _ = two_runs
    trajs = load_jsonl(tiny_run["out"] / "pools.jsonl")
    for a in ("acr", "sweagent"):
        save_jsonl([t for t in trajs if t.agent == a], tmp_path / f"{a}.jsonl")
    report = crossval([tmp_path / "acr.jsonl", tmp_path / "sweagent.jsonl"], [states, d / "swe_states"],
                      tmp_path / "cv", n_folds=2, ks=(2,), n_draws=5, n_boot=20, scorer_epochs=2, variants=False,
                      agent_transfer=False, curve_fractions=(1.0,), log=lambda m: None)
    summary = json.loads((report / "summary.json").read_text())
    assert summary["settings"]["meta"]["crossval"]["sources"]["states"] == [str(states), str(d / "swe_states")]
    combined = load_jsonl(tmp_path / "cv" / "pools.jsonl")
    assert sorted(t.traj_id for t in combined) == sorted(t.traj_id for t in trajs)
