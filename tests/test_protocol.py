"""crossval = reproduce's protocol on any labelled pools; fit + filter --sifter; bad input.

Reuses the session's tiny end-to-end run (conftest ``tiny_run``): its pools, states and verifier
results, so nothing is extracted again.
"""
import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from latentsift._core.validation import LatentSiftError
from latentsift.bank.bank import Bank
from latentsift.cli import app
from latentsift.protocol import crossval
from latentsift.sift.scorer import LinearScorer
from latentsift.sift.sift import LatentSift
from latentsift._jobs.sifter import fit_sifter
from latentsift.deploy.sifter import Sifter
from latentsift.states.store import StateStore
from latentsift.trajectories.trajectory import group_pools, load_jsonl, save_jsonl

pytestmark = pytest.mark.model
CV = dict(n_folds=2, ks=(2, 3), n_draws=10, seed=0, n_boot=50, scorer_epochs=2, variants=False)


@pytest.fixture(scope="module")
def cv(tiny_run, tmp_path_factory, one_torch_thread):
    """The CLI on the tiny run's pools, states and verifier results, with the tiny run's settings."""
    run = tiny_run["out"]
    out = tmp_path_factory.mktemp("cv") / "run"
    r = CliRunner().invoke(app, ["crossval", str(run / "pools.jsonl"), "--states", str(run / "states"), "--out",
                                 str(out), "--group-by", "repo", "--folds", "2", "--k", "2", "--k", "3", "--draws", "10",
                                 "--seed", "0", "--verifier", str(run / "verifier"), "--bootstrap", "50",
                                 "--scorer-epochs", "2", "--no-variants"],
                            env={"LATENTSIFT_PROGRESS_INTERVAL": "0"})  # every progress line, however quick
    assert r.exit_code == 0, r.output
    return out, json.loads((out / "report" / "summary.json").read_text()), r.output


def test_crossval_gives_the_stage1_numbers_of_reproduce(tiny_run, cv):
    out, got, _ = cv
    rep = json.loads(tiny_run["summary"])
    filters = [f for f in rep["retention"] if not f.startswith("sweep:")]
    assert {"latentsift", "ef_verifier", "shortest_chars", "random"} <= set(filters)
    assert any(f.startswith("transfer:") for f in filters)  # agent transfer in both
    for f in filters:
        assert got["retention"][f] == rep["retention"][f], f
        assert got["best_at_k"]["filters"][f] == rep["best_at_k"]["filters"][f], f
        assert got["selection"]["retention_difference"][f] == rep["selection"]["retention_difference"][f], f
    assert got["settings"]["meta"]["folds"] == rep["settings"]["meta"]["folds"]
    assert got["selection"]["agent_transfer"] == rep["selection"]["agent_transfer"]
    assert json.loads((out / "manifest.json").read_text())["command"] == "latentsift crossval"
    assert "## Agent transfer" in (out / "report" / "report.md").read_text()


def test_stage1_says_each_fold_as_it_ends(cv):
    """Stage 1 runs minutes a fold on a large run: one line a fold tells the user it moves, in order, before
    the stage's total time."""
    _, _, output = cv
    lines = output.splitlines()
    folds = [i for i, ln in enumerate(lines) if ln.startswith("[stage1] ") and " folds " in ln]
    total = [i for i, ln in enumerate(lines) if re.fullmatch(r"\[stage1\] [0-9.]+ s", ln)]
    assert [lines[i].split()[1] for i in folds] == ["0/2", "1/2", "2/2"] and len(total) == 1 and folds[-1] < total[0]


def test_fit_on_some_folds_then_filter_with_the_sifter_keeps_the_crossval_fold(tiny_run, cv, tmp_path):
    out, got, _ = cv
    run = tiny_run["out"]
    trajs = load_jsonl(run / "pools.jsonl")
    for k, fold in enumerate(got["settings"]["meta"]["folds"]):
        bank = [t for t in trajs if t.repo in fold["bank_repos"]]
        held = [t for t in trajs if t.repo in fold["eval_repos"]]
        save_jsonl(bank, tmp_path / f"bank{k}.jsonl")
        save_jsonl(held, tmp_path / f"held{k}.jsonl")
        r = CliRunner().invoke(app, ["fit", str(tmp_path / f"bank{k}.jsonl"), "--states", str(run / "states"),
                                     "--out", str(tmp_path / f"sifter{k}"), "--scorer-epochs", "2"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(app, ["filter", str(tmp_path / f"held{k}.jsonl"), "--states", str(run / "states"),
                                     "--sifter", str(tmp_path / f"sifter{k}"), "--out", str(tmp_path / f"f{k}.json")])
        assert r.exit_code == 0, r.output
        res = json.loads((tmp_path / f"f{k}.json").read_text())
        # the matching fold of crossval: its cached bank and scorer on the same held-out pools
        fold_dir = out / "folds" / f"fold-{k}" / "paper"
        filt = LatentSift(Bank.load(fold_dir / "bank"), LinearScorer.load(fold_dir / "scorer"), seed=0)
        want = filt.score_pools(group_pools(held), StateStore(run / "states").open())
        assert {p["instance_id"]: p["retained"] for p in res["pools"]} == {p.instance_id: p.retained for p in want}
        assert [c["s"] for p in res["pools"] for c in p["candidates"]] == pytest.approx(
            [c.s for p in want for c in p.candidates])
        choice = res["configuration"]["config"]["choice"]
        assert choice["chosen"] == "latentsift" and choice["auto"] is False   # fit's default method, as asked
        assert res["configuration"]["seen"]["repos"] == fold["bank_repos"]
    s = Sifter.load(tmp_path / "sifter0")
    assert s.seen_["agents"] == ["acr", "sweagent"] and s.bank.repo_names_ == got["settings"]["meta"]["folds"][0][
        "bank_repos"]


def _write(trajs, path):
    save_jsonl(trajs, path)
    return path


def test_bad_input_is_refused_before_anything_is_written(tiny_run, tmp_path, one_torch_thread):
    run = tiny_run["out"]
    states = run / "states"
    trajs = load_jsonl(run / "pools.jsonl")
    out = tmp_path / "out"
    # pools without labels
    unl = [t for t in load_jsonl(run / "pools.jsonl")]
    unl[0].reward = None
    p = _write(unl, tmp_path / "unlabelled.jsonl")
    with pytest.raises(LatentSiftError, match="have no label"):
        crossval(p, states, out, log=lambda m: None, **CV)
    with pytest.raises(LatentSiftError, match="have no label"):
        fit_sifter(p, states, tmp_path / "sifter", scorer_epochs=2)
    # states missing for some candidates
    extra = load_jsonl(run / "pools.jsonl")
    extra[0].traj_id = "unseen-run/" + extra[0].instance_id
    p = _write(trajs + [extra[0]], tmp_path / "missing.jsonl")
    with pytest.raises(LatentSiftError, match="has no states for 1 of"):
        crossval(p, states, out, log=lambda m: None, **CV)
    with pytest.raises(LatentSiftError, match="has no states for 1 of"):
        fit_sifter(p, states, tmp_path / "sifter", scorer_epochs=2)
    # a fold whose bank has one class only: no resolved trajectory in pytest-dev's repository
    one = load_jsonl(run / "pools.jsonl")
    for t in one:
        if t.repo == "pytest-dev/pytest":
            t.reward = 0.0
    p = _write(one, tmp_path / "oneclass.jsonl")
    with pytest.raises(LatentSiftError, match=r"fold \d's bank .* has no resolved \(label 1\) trajectory"):
        crossval(p, states, out, log=lambda m: None, **CV)
    # folds by agent would split pools (both agents share every instance here)
    with pytest.raises(LatentSiftError, match="holds candidates of several agents"):
        crossval(run / "pools.jsonl", states, out, log=lambda m: None, **CV | {"group_by": "agent"})
    assert not out.exists() and not (tmp_path / "sifter").exists()
    # a sifter fitted on another model's states
    django = [t for t in trajs if t.repo == "django/django"]
    fit_sifter(_write(django, tmp_path / "django.jsonl"), states, tmp_path / "sifter", scorer_epochs=2, log=lambda m: None)
    other = tmp_path / "other-sifter"
    shutil.copytree(tmp_path / "sifter", other)
    man = json.loads((other / "sifter.json").read_text())
    man["fingerprint"]["dtype"] = "float16" if man["fingerprint"]["dtype"] != "float16" else "float32"
    (other / "sifter.json").write_text(json.dumps(man))
    held = _write([t for t in trajs if t.repo != "django/django"], tmp_path / "held.jsonl")
    r = CliRunner().invoke(app, ["filter", str(held), "--states", str(states), "--sifter", str(other),
                                 "--out", str(tmp_path / "f.json")])
    assert r.exit_code == 2 and "fit a sifter on states of this model" in r.output  # a message, no traceback
    assert not (tmp_path / "f.json").exists()
    # filter --sifter on pools whose states are missing
    r = CliRunner().invoke(app, ["filter", str(tmp_path / "missing.jsonl"), "--states", str(states), "--sifter",
                                 str(tmp_path / "sifter"), "--out", str(tmp_path / "f.json")])
    assert r.exit_code == 2 and "no states for 1 candidates" in r.output  # a message, no traceback
    assert not (tmp_path / "f.json").exists()
