"""The shift guard's error rates inside the protocol, and the leave-one-repository-out reference.

Reuses the session's tiny end-to-end run (conftest ``tiny_run``: django and pytest, two agents, two
repository folds).
"""
import json

import numpy as np
import pytest

from latentsift.bank.bank import Bank
from latentsift.deploy.shift import Reference, bank_vectors, nearest_other_group
from latentsift.states.store import StateStore
from latentsift.trajectories.trajectory import load_jsonl

pytestmark = pytest.mark.model


def test_summary_holds_false_alarms_and_detection(tiny_run):
    g = json.loads(tiny_run["summary"])["shift_guard"]
    assert g["false_alarm_setting"] == 0.05 and g["reference_kinds"] == ["repository", "instance"]
    per = g["false_alarms"]["per_fold"]
    assert [f["fold"] for f in per] == [0, 1]
    for f in per:
        # each fold's bank is one repository: the repository reference falls back to the instance rule
        assert f["reference_kind_used"] == {"repository": "instance", "instance": "instance"}
        for kind in g["reference_kinds"]:
            for check in ("distance", "name"):
                r = f["false_alarm"][kind][check]
                assert r["n_pools"] == f["n_pools"] and r["lo"] <= r["rate"] <= r["hi"]
            assert f["false_alarm"][kind]["name"]["rate"] == 0.0  # same agents and scaffolds on both sides
    pooled = g["false_alarms"]["pooled"]["repository"]
    assert pooled["distance"]["n_pools"] == sum(f["n_pools"] for f in per)
    assert len(pooled["tradeoff"]) == len(g["quantiles"])
    curve = [x for x in pooled["tradeoff"] if x is not None]
    assert curve == sorted(curve, reverse=True)  # a higher quantile never flags more pools
    at = g["quantiles"].index(1 - g["false_alarm_setting"])  # the curve passes through the stated setting
    assert pooled["tradeoff"][at] == pytest.approx(pooled["distance"]["rate"])
    det = g["detection"]
    assert "acr -> sweagent" in det and set(det) | set(g["detection_unavailable"]) == {"acr -> sweagent",
                                                                                     "sweagent -> acr"}
    for d in det.values():
        assert d["repository"]["name"]["rate"] == 1.0  # the other agent's name is never in the bank
        assert d["repository"]["distance"]["n_pools"] == pooled["distance"]["n_pools"]
        assert d["repository"]["tradeoff"][at] == pytest.approx(d["repository"]["distance"]["rate"])
    md = (tiny_run["report"] / "report.md").read_text()
    assert "## Shift guard: false alarms and detection" in md and "detection: bank of acr" in md
    assert (tiny_run["report"] / "shift_guard.png").is_file()


def test_repository_reference_leaves_out_the_whole_repository(tiny_run):
    run = tiny_run["out"]
    trajs = [t for t in load_jsonl(run / "pools.jsonl") if t.agent == "acr"]
    store = StateStore(run / "states").open()
    states = store.load([t.traj_id for t in trajs])
    bank = Bank().fit(states, {t.traj_id: int(t.label) for t in trajs}, {t.traj_id: t.instance_id for t in trajs},
                      {t.traj_id: t.repo for t in trajs}, store.fingerprint)
    assert len(bank.repo_names_) == 2
    ids, vecs = bank_vectors(bank)
    by_repo = nearest_other_group(ids, vecs, bank.repos_)
    by_inst = nearest_other_group(ids, vecs, bank.instances_)
    assert np.all(by_repo >= by_inst)  # leaving out more of the bank can only move the nearest one away
    repo = Reference.from_bank(bank)
    inst = Reference.from_bank(bank, kind="instance")
    assert repo.kind == "repository" and inst.kind == "instance"
    assert len(repo.pool_medians) == len(inst.pool_medians) == len(bank.instance_ids_)
    assert np.all(np.array(repo.pool_medians) >= np.array(inst.pool_medians))
    assert repo.loo_quantile == pytest.approx(np.quantile(repo.pool_medians, 0.95))


def test_fit_saves_the_stated_false_alarm_rate_and_reference(tiny_run, tmp_path):
    from latentsift._core.validation import LatentSiftError
    from latentsift._jobs.sifter import fit_sifter
    from latentsift.deploy.sifter import Sifter
    from latentsift.trajectories.trajectory import save_jsonl

    run = tiny_run["out"]
    save_jsonl([t for t in load_jsonl(run / "pools.jsonl") if t.agent == "acr"], tmp_path / "acr.jsonl")
    fit_sifter(tmp_path / "acr.jsonl", run / "states", tmp_path / "s", scorer_epochs=2, false_alarm=0.25,
               reference_kind="instance", log=lambda m: None)
    ref = Sifter.load(tmp_path / "s").reference_
    assert ref.kind == "instance" and ref.false_alarm == 0.25
    assert ref.loo_quantile == pytest.approx(np.quantile(ref.pool_medians, 0.75))
    with pytest.raises(LatentSiftError, match="reference"):
        fit_sifter(tmp_path / "acr.jsonl", run / "states", tmp_path / "t", reference_kind="repo")
    assert not (tmp_path / "t").exists()


def test_the_stated_rate_is_checked():
    from latentsift._core.validation import LatentSiftError
    from latentsift.protocol import CrossvalSettings

    with pytest.raises(LatentSiftError, match="guard-false-alarm"):
        CrossvalSettings(pools="p", states="s", out="o", guard_false_alarm=1.5)
