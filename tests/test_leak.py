"""The leak guard per pool (``--on-leak error|skip|allow``): pools whose instance the bank holds.

Reuses the session's tiny end-to-end run (conftest ``tiny_run``): a sifter fitted on AutoCodeRover's
trajectories of one django instance and of the pytest instance scores SWE-agent's pools of every
django instance, so exactly one pool overlaps the bank.
"""
import json
from types import SimpleNamespace as NS

import pytest
from typer.testing import CliRunner

from latentsift._core.validation import LatentSiftError
from conftest import refused  # tests/conftest.py
from latentsift.cli import app
from latentsift.deploy.leak import check_leaks, shared_repos
from latentsift.protocol import CrossvalSettings, crossval, leaking_pools
from latentsift._jobs.sifter import fit_sifter
from latentsift.deploy.sifter import Sifter
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def overlap(tiny_run, tmp_path_factory, one_torch_thread):
    run = tiny_run["out"]
    d = tmp_path_factory.mktemp("leak")
    trajs = load_jsonl(run / "pools.jsonl")
    django = sorted({t.instance_id for t in trajs if t.repo == "django/django"})
    assert len(django) >= 2
    leaked = django[0]
    bank = [t for t in trajs if t.agent == "acr" and (t.instance_id == leaked or t.repo != "django/django")]
    save_jsonl(bank, d / "bank.jsonl")
    save_jsonl([t for t in trajs if t.agent == "sweagent" and t.repo == "django/django"], d / "pools.jsonl")
    fit_sifter(d / "bank.jsonl", run / "states", d / "sifter", scorer_epochs=2, log=lambda m: None)
    return d, run / "states", leaked, django


def _filter(d, states, *extra):
    return CliRunner().invoke(app, ["filter", str(d / "pools.jsonl"), "--states", str(states), *extra])


def test_check_leaks_names_the_overlapping_pool(overlap):
    d, states, leaked, django = overlap
    from latentsift.trajectories.trajectory import load_pools
    bank = Sifter.load(d / "sifter").bank
    (x,) = check_leaks(load_pools(d / "pools.jsonl"), bank)
    assert x.instance_id == leaked and x.overlapping_instances == [leaked]
    assert x.bank_trajectories == sorted(t for t, i in bank.instances_.items() if i == leaked)


def test_sifter_modes(overlap):
    d, states, leaked, django = overlap
    sifter = ["--sifter", str(d / "sifter")]
    r = _filter(d, states, *sifter, "--out", str(d / "allow.json"))  # default with --sifter: allow
    assert r.exit_code == 0, r.output
    assert f"leak (allow): {leaked}" in r.output
    allow = json.loads((d / "allow.json").read_text())
    assert [p["instance_id"] for p in allow["pools"]] == django
    assert allow["leak"]["on_leak"] == "allow" and [p["instance_id"] for p in allow["leak"]["pools"]] == [leaked]
    r = _filter(d, states, *sifter, "--out", str(d / "skip.json"), "--on-leak", "skip")
    assert r.exit_code == 0, r.output
    skip = json.loads((d / "skip.json").read_text())
    assert [p["instance_id"] for p in skip["pools"]] == django[1:]  # the other pools are written
    assert skip["leak"]["pools"][0]["action"].startswith("pool skipped")
    # the clean pools are scored the same whatever happens to the overlapping one
    by = {p["instance_id"]: p for p in allow["pools"]}
    for p in skip["pools"]:
        assert [c["s"] for c in p["candidates"]] == [c["s"] for c in by[p["instance_id"]]["candidates"]]
    r = _filter(d, states, *sifter, "--out", str(d / "err.json"), "--on-leak", "error")
    refused(r, leaked)
    assert not (d / "err.json").exists()


def test_bank_modes(overlap):
    d, states, leaked, django = overlap
    bank = ["--bank", str(d / "sifter" / "bank"), "--scorer", str(d / "sifter" / "scorer")]
    r = _filter(d, states, *bank, "--out", str(d / "b_err.json"))  # default with --bank: error
    refused(r, "--on-leak skip", leaked)
    assert not (d / "b_err.json").exists()
    r = _filter(d, states, *bank, "--out", str(d / "b_skip.json"), "--on-leak", "skip")
    assert r.exit_code == 0, r.output
    skip = json.loads((d / "b_skip.json").read_text())
    assert [p["instance_id"] for p in skip["pools"]] == django[1:]
    assert [p["instance_id"] for p in skip["leak"]["pools"]] == [leaked]
    r = _filter(d, states, *bank, "--out", str(d / "b_allow.json"), "--on-leak", "allow")
    assert r.exit_code == 0, r.output
    allow = json.loads((d / "b_allow.json").read_text())
    assert [p["instance_id"] for p in allow["pools"]] == django


def test_crossval_modes(overlap, tiny_run, tmp_path):
    """Folds by agent: a pool with candidates of both agents would sit in a bank that scores it."""
    d, states, leaked, django = overlap
    trajs = load_jsonl(tiny_run["out"] / "pools.jsonl")
    # every pool of one agent only, except `leaked`, which keeps both agents' candidates
    keep = [t for t in trajs if t.instance_id == leaked or (t.agent == "acr") == (django.index(t.instance_id) % 2 == 0
                                                                                   if t.instance_id in django else True)]
    save_jsonl(keep, tmp_path / "pools.jsonl")
    assert [x["instance_id"] for x in leaking_pools(keep, "agent")] == [leaked]
    kw = dict(group_by="agent", n_folds=2, ks=(2,), n_draws=5, n_boot=20, scorer_epochs=2, variants=False,
              agent_transfer=False, log=lambda m: None)
    with pytest.raises(LatentSiftError, match="several agents"):
        crossval(tmp_path / "pools.jsonl", states, tmp_path / "err", **kw)
    assert not (tmp_path / "err").exists()
    with pytest.raises(LatentSiftError, match="leakage"):
        CrossvalSettings(pools="p", states="s", out="o", on_leak="allow")
    report = crossval(tmp_path / "pools.jsonl", states, tmp_path / "skip", on_leak="skip", **kw)
    summary = json.loads((report / "summary.json").read_text())
    leak = summary["settings"]["meta"]["leak"]
    assert leak["on_leak"] == "skip" and [x["instance_id"] for x in leak["pools"]] == [leaked]


def test_shared_repos_names_only_known_repositories():
    """An unknown repository ("") on both sides is no overlap (the quickstart's pools printed "share ['']")."""
    pools = [NS(candidates=[NS(repo=""), NS(repo="django/django")]), NS(candidates=[NS(repo="astropy/astropy")])]
    assert shared_repos(pools, NS(repo_names_=["", "django/django", "pytest-dev/pytest"])) == ["django/django"]
    assert shared_repos(pools[:1], NS(repo_names_=[""])) == []
