import dataclasses
import json
from pathlib import Path

import pytest

from conftest import at_threads  # tests/conftest.py
from latentsift._core.validation import LatentSiftError
from latentsift.report.report import render_markdown
from latentsift.protocol import per_agent_retention, retention_differences
from latentsift.protocol.reproduction import LEAKY_RUNS, ReproduceSettings, check_data_dir, reproduce, select_trajectories
from latentsift.trajectories.trajectory import Trajectory


@pytest.fixture(scope="module")
def shared(shared_import):
    return shared_import.trajectories   # conftest: the whole shared dataset, imported once a session


def test_default_selection_drops_leaky_runs_and_keeps_every_solvable_instance(shared, data_dir):
    s = ReproduceSettings(data=str(data_dir), out="unused")
    kept, info = select_trajectories(shared, s)
    assert not {t.run for t in kept} & set(LEAKY_RUNS)
    assert info["runs_left_out"] == sorted(LEAKY_RUNS)
    solvable = {t.instance_id for t in shared if t.run not in LEAKY_RUNS and t.label == 1}
    assert len(solvable) == 87 == info["n_solvable"]  # dataset README: 87 resolved by >= 1 of the 6 runs
    inst = {t.instance_id for t in kept}
    assert solvable <= inst and len(inst) == 87 + s.n_unresolved
    # the unresolved sample is a hash of the ids, so it is the same on every run
    again, _ = select_trajectories(list(reversed(shared)), s)
    assert {t.traj_id for t in again} == {t.traj_id for t in kept}
    leaky, info2 = select_trajectories(shared, ReproduceSettings(data=str(data_dir), out="x", include_leaky=True))
    assert set(LEAKY_RUNS) <= {t.run for t in leaky} and "warning" in info2


def test_missing_dataset_says_what_to_do(tmp_path):
    with pytest.raises(LatentSiftError, match="put the shared folder beside this checkout"):
        check_data_dir(tmp_path / "nope")


def _ledger():
    rows = []
    # two instances; 'a' keeps the solution where the reference loses it in instance 1
    for f, rs in (("ref", (1.0, 0.0)), ("a", (1.0, 1.0)), ("same", (1.0, 0.0))):
        for i, (inst, p) in enumerate((("i0", 1.0), ("i1", 1.0))):
            rows.append({"instance_id": inst, "k": 4, "filter": f, "retained_solvable": rs[i], "pass": p})
    rows.append({"instance_id": "i2", "k": 4, "filter": "ref", "retained_solvable": 0.0, "pass": 0.0})
    rows.append({"instance_id": "i2", "k": 4, "filter": "a", "retained_solvable": 0.0, "pass": 0.0})
    rows.append({"instance_id": "i2", "k": 4, "filter": "same", "retained_solvable": 0.0, "pass": 0.0})
    return rows


def test_retention_differences_are_paired_pooled_ratios():
    d = retention_differences(_ledger(), "ref", [4], n_boot=200, seed=0)
    assert d["a"]["4"]["estimate"] == pytest.approx(0.5)  # 2/2 - 1/2
    assert d["same"]["4"]["estimate"] == 0 and d["same"]["4"]["lo"] == 0 and d["same"]["4"]["hi"] == 0
    assert d["a"]["4"]["lo"] <= 0.5 <= d["a"]["4"]["hi"]


def test_per_agent_retention_groups_by_who_solved():
    trajs = [Trajectory("r/i0", "i0", "x", "", [], reward=1.0, agent="acr"),
             Trajectory("s/i1", "i1", "x", "", [], reward=1.0, agent="sweagent"),
             Trajectory("r/i1", "i1", "x", "", [], reward=0.0, agent="acr")]
    out = per_agent_retention(_ledger(), trajs, [4])
    assert out["ref"]["acr"]["4"] == {"retention": 1.0, "n_instances": 1}
    assert out["ref"]["sweagent"]["4"] == {"retention": 0.0, "n_instances": 1}


@pytest.mark.model
def test_tiny_reproduce_end_to_end_is_deterministic(tiny_run):
    """A 4-instance run through every stage with the packaged model (conftest ``tiny_run``, two threads); a
    rerun at one torch and one BLAS thread reuses the caches and writes a byte-identical summary.json."""
    report, first, s, out = tiny_run["report"], tiny_run["summary"], tiny_run["settings"], tiny_run["out"]
    data = json.loads(first)
    assert {"settings", "pools", "retention", "best_at_k", "tokens", "ablations", "selection"} <= set(data)
    assert data["pools"]["n_instances"] == 4
    # every candidate got a verdict within the prompt budget, so the original workflow is charged tokens
    fv = data["diagnostics"]["final_verifier"]
    assert fv["n_results"] == data["pools"]["n_candidates"] and fv["n_failed"] == 0 and fv["mean_tokens"] > 300
    # the sweep's representation has its own store (longer patch-writing step) and its own rows
    assert {"sweep:patch-64", "sweep:patch-64:default"} <= set(data["retention"])
    assert (out / "sweep" / "patch-64" / "states" / "manifest.json").is_file()
    assert data["selection"]["sweep"]["patch-64"]["settings"] == {"patch_step_tokens": 64}
    assert data["settings"]["meta"]["leaky_runs"].startswith("acr-val-only and acr-val-sbfl are left out")
    md = (report / "report.md").read_text()
    assert "## Selection quality beyond length" in md and "## Ablations" in md
    # agent transfer: both agents of the shared data, a row (with its interval) or the reason for none
    tr = data["selection"]["agent_transfer"]
    assert len(tr["agents"]) == 2 and set(tr["filters"]) | set(tr["unavailable"]) == set(tr["agents"])
    assert "## Agent transfer" in md
    for a, f in tr["filters"].items():
        assert f in data["retention"] and {"lo", "hi"} <= set(data["retention"][f]["3"])
        assert f"{a} only" in md
    for png in ("score_distributions.png", "best_at_k_tokens.png"):
        assert (report / png).stat().st_size > 10_000
    with at_threads(1):  # the first run was at two threads: the thread count must not change a number
        report2 = reproduce(ReproduceSettings(**s), log=lambda m: None)
    assert (report2 / "summary.json").read_text() == first
    assert render_markdown(json.loads(first), figures=None).count("LatentSift (paper)") >= 3


def test_sweep_settings_name_known_representations(data_dir):
    from latentsift.protocol.reproduction import SWEEP, ReproduceRun
    s = ReproduceSettings(data=str(data_dir), out="x", sweep=("all",))
    assert s.sweep == SWEEP and s.to_dict()["sweep"] == list(SWEEP)
    specs = ReproduceRun(ReproduceSettings(data=str(data_dir), out="x", sweep=("patch", "span"), sweep_span_tokens=96,
                                 sweep_patch_tokens=200)
                ).sweep_specs()
    assert specs == {"patch-200": {"patch_step_tokens": 200}, "span-96": {"max_span_tokens": 96}}
    with pytest.raises(LatentSiftError, match="'sweep' parameter of reproduce"):
        ReproduceSettings(data=str(data_dir), out="x", sweep=("bert",))


@pytest.mark.model
def test_a_verifier_that_scores_nothing_stops_the_run(data_dir, tmp_path, policy, one_torch_thread):
    from latentsift.protocol.reproduction import ReproduceRun
    run = ReproduceRun(ReproduceSettings(data=str(data_dir), out=str(tmp_path), max_instances=1, n_unresolved=0,
                                verifier_max_tokens=64), log=lambda m: None)
    trajs, _ = run.import_pools()
    with pytest.raises(LatentSiftError, match="scored none of the .* Raise --verifier-max-tokens"):
        run.verify(policy, trajs[:2])


def test_the_protocol_settings_are_shared_and_checked_once(data_dir):
    from latentsift.protocol import CrossvalSettings, ProtocolSettings
    shared = ProtocolSettings.defaults()
    assert {k: ReproduceSettings.defaults()[k] for k in shared} == shared
    assert {k: CrossvalSettings.defaults()[k] for k in shared} == shared
    for bad in ({"n_draws": 0}, {"n_boot": -1}, {"scorer_epochs": 0}, {"ks": ()}, {"ks": (0,)},
                {"curve_fractions": (0.0,)}, {"guard_false_alarm": 1.0}, {"group_by": "org"}):
        with pytest.raises(LatentSiftError):
            ReproduceSettings(data=str(data_dir), out="x", **bad)
        with pytest.raises(LatentSiftError):
            CrossvalSettings(pools="p", states="s", out="o", **bad)
    s = ReproduceSettings(data=str(data_dir), out="x", ks=[2, 3])
    d = s.to_dict()
    assert d["ks"] == [2, 3] and list(d)[:5] == ["data", "out", "runs", "include_leaky", "instances"]
    assert set(d) == {f.name for f in dataclasses.fields(ReproduceSettings)}


def test_a_finished_run_opens_with_its_cached_folds(tiny_run):
    from latentsift.protocol.reproduction import open_run_dir
    run, trajs, store = open_run_dir(tiny_run["out"])
    assert run.settings.to_dict() == json.loads((tiny_run["out"] / "manifest.json").read_text())["settings"]
    folds = run.folds(trajs)
    bank, scorer, pools = run.cached_fold(trajs, folds, 0)
    held_out = {c.traj_id for p in pools for c in p.candidates}
    assert pools and held_out and store.has(next(iter(held_out)))
    assert not held_out & set(bank.traj_ids_) and scorer is not None
