"""Every measured score deployable (``latentsift.deploy.methods``) and the one recommendation (``fit --method
auto``): synthetic labelled runs of four repositories with the outcome planted in the lengths only, or in the
states only (``synthetic.labelled_runs``)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from latentsift import Sifter
from latentsift._core.validation import FingerprintMismatch
from latentsift.cli import app
from latentsift.deploy.methods import AUTO_CANDIDATES, get_method, methods
from latentsift.trajectories.trajectory import group_pools

from synthetic import FP, PROXY_FP, labelled_runs, write_runs


def _renamed(trajs, states, tag="new-"):
    """New pools (other instances) of the same making: what a sifter filters."""
    out = [t.__class__(**{**t.__dict__, "traj_id": tag + t.traj_id, "instance_id": tag + t.instance_id})
           for t in trajs]
    return out, {tag + k: v.__class__(tag + k, v.layers, v.step, v.channel, v.n_tokens) for k, v in states.items()}


@pytest.fixture(scope="module")
def length_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("length")
    trajs, states = labelled_runs(signal="length")
    new = _renamed(*labelled_runs(signal="length", seed=3, n_repos=2))
    return write_runs(root / "runs", trajs, states), write_runs(root / "new", *new), root


def test_every_crossval_score_of_the_candidates_is_a_deployable_method():
    names = {m.name for m in methods()}
    assert set(AUTO_CANDIDATES) <= names
    assert {"shortest-chars", "fewest-steps", "variant:stack:states+length"} <= names
    assert not get_method("shortest-chars").needs_states and get_method("variant:probe").needs_states
    assert not get_method("variant:stack:length").needs_states


def test_auto_picks_a_free_rule_where_length_ranks_best_and_filter_runs_without_states(length_runs):
    (pools, states), (new_pools, _), root = length_runs
    r = CliRunner().invoke(app, ["fit", str(pools), "--states", str(states), "--method", "auto",
                                 "--scorer-epochs", "3", "--out", str(root / "sifter")])
    assert r.exit_code == 0, r.output
    config = json.loads((root / "sifter" / "sifter.json").read_text())["config"]
    assert get_method(config["method"]).family == "rule" and not config["method_info"]["needs_states"]
    assert config["choice"]["auto"] and set(config["choice"]["candidates"]) >= set(AUTO_CANDIDATES)
    assert config["choice"]["candidates"][config["method"]] >= max(v for v in config["choice"]["candidates"].values()
                                                                   if v is not None) - 0.0005
    r = CliRunner().invoke(app, ["filter", str(new_pools), "--sifter", str(root / "sifter"), "--out",
                                 str(root / "f.json"), "--show", "0"])
    assert r.exit_code == 0, r.output
    assert f"Method: {config['method']} (chosen by --method auto: highest" in r.output
    out = json.loads((root / "f.json").read_text())
    assert out["inputs"]["states_dir"] is None and out["n_pools"] == 12
    # the shortest candidates are the resolved ones: every kept candidate of a pool of 4 (3 kept) holds both
    assert all(c["raw"] is not None for p in out["pools"] for c in p["candidates"])


def test_a_state_method_without_states_is_one_line(length_runs):
    (pools, _), _, root = length_runs
    r = CliRunner().invoke(app, ["fit", str(pools), "--method", "variant:probe", "--out", str(root / "no")])
    assert r.exit_code == 2 and "pass --states" in r.output and not (root / "no").exists()


def test_auto_picks_a_state_score_where_the_states_carry_the_outcome():
    trajs, states = labelled_runs(signal="states")
    s = Sifter(method="auto", scorer_epochs=5).fit(trajs, states, fingerprint=FP)
    assert get_method(s.config_["method"]).needs_states, s.config_["choice"]
    ev = s.config_["choice"]["candidates"]
    assert ev[s.config_["method"]] > max(ev["shortest-chars"], ev["fewest-steps"]) + 0.2


@pytest.mark.parametrize("method", ["variant:probe", "variant:stack:states+length", "variant:fusion:fitted"])
def test_a_saved_sifter_scores_as_it_did_before_saving(tmp_path, method):
    trajs, states = labelled_runs(signal="states")
    new, new_states = _renamed(*labelled_runs(signal="states", seed=5, n_repos=2))
    s = Sifter(method=method, scorer_epochs=3).fit(trajs, states, fingerprint=FP)
    before = [r.to_dict() for r in s.score_pools(group_pools(new), new_states, fingerprint=FP)]
    loaded = Sifter.load(s.save(tmp_path / "sifter"), fingerprint=FP)
    assert loaded.config_["method"] == method and loaded.get_params() == s.get_params()
    assert [r.to_dict() for r in loaded.score_pools(group_pools(new), new_states, fingerprint=FP)] == before
    assert all(len({c["s"] for c in p["candidates"]}) == len(p["candidates"]) for p in before)  # no tie in a pool
    with pytest.raises(FingerprintMismatch):  # a bank of its states carries the model: another model's are refused
        Sifter.load(tmp_path / "sifter", fingerprint=PROXY_FP)


def test_the_nested_recommendation_never_reads_the_scored_fold(tmp_path):
    """crossval's "recommended" row: fold 0's choice and scores are the same when fold 0's labels are flipped,
    and its choice is the same when made without fold 0's states."""
    from types import SimpleNamespace

    from latentsift import crossval
    from latentsift.protocol.variants import recommended_filter
    from latentsift.trajectories.trajectory import save_jsonl

    trajs, states = labelled_runs(signal="states")
    pools, store = write_runs(tmp_path / "a", trajs, states)
    cv = dict(n_folds=2, ks=(2,), n_draws=3, n_boot=20, scorer_epochs=3, log=lambda m: None)
    runs = {"a": json.loads((crossval(pools, store, tmp_path / "cv-a", **cv) / "summary.json").read_text())}
    eval_repos = set(runs["a"]["settings"]["meta"]["folds"][0]["eval_repos"])
    flipped = [t.__class__(**{**t.__dict__, "reward": 1.0 - t.reward}) if t.repo in eval_repos else t for t in trajs]
    save_jsonl(flipped, tmp_path / "flipped.jsonl")
    runs["b"] = json.loads((crossval(tmp_path / "flipped.jsonl", store, tmp_path / "cv-b", **cv) / "summary.json")
                           .read_text())
    choice = [{k: v for k, v in r["selection"]["recommended_choice"][0].items() if k != "seconds"}
              for r in runs.values()]
    assert choice[0] == choice[1]
    kept = [json.loads((tmp_path / f"cv-{n}" / "stage1" / "retained.json").read_text())["filters"]["recommended"]
            for n in runs]
    fold0 = {t.instance_id for t in trajs if t.repo in eval_repos}
    assert {i: kept[0][i] for i in fold0} == {i: kept[1][i] for i in fold0}
    # the same choice from the bank's states alone (the scored fold's withheld)
    bank = [t for t in trajs if t.repo not in eval_repos]
    info = runs["a"]["selection"]["default_choice"][0]
    per_instance = {m.key: {i: (None, None) for i in fold0} for m in methods()}
    run = SimpleNamespace(settings=SimpleNamespace(seed=0), log=lambda m: None)
    again = recommended_filter(run, 0, bank, group_pools([t for t in trajs if t.repo in eval_repos]),
                               {t.traj_id: states[t.traj_id] for t in bank}, info, per_instance, lambda *a: None)
    assert again["chosen"] == choice[0]["chosen"]


def test_a_post_hoc_win_at_95_percent_only_does_not_open_the_report():
    from latentsift.report.decision_report import headline

    def vs(lo, hi, alo, ahi):
        return {"estimate": (lo + hi) / 2, "lo": lo, "hi": hi, "outcome": "higher" if lo > 0 else "undetermined",
                "adjusted": {"level": 0.9995, "lo": alo, "hi": ahi}}
    refs = ("shortest_chars", "variant:stack:length", "random")
    scores = {"variant:stack:states+length": {"auc": {"auc": 0.76}, "post_hoc": True,
                                              "vs": {r: vs(0.01, 0.12, -0.03, 0.16) for r in refs}},
              "latentsift": {"auc": {"auc": 0.70}, "post_hoc": False,
                             "vs": {r: vs(-0.02, 0.08, -0.06, 0.12) for r in refs}},
              "recommended": {"auc": {"auc": 0.72}, "post_hoc": False,
                              "vs": {r: vs(0.005, 0.1, -0.04, 0.14) for r in refs}}}
    data = {"settings": {"names": {}}, "decision": {"winner": "variant:stack:states+length", "auc": {
        "scores": scores, "references": list(refs), "missing_references": {}},
        "multiplicity": {"bonferroni_level": 0.9995}}}
    s = headline(data)
    assert not s.startswith("Here a state score beats") and "variant:stack:states+length" not in s
    assert s.startswith("Here no state score is shown to beat the length rules: recommended (AUC 0.720) is above "
                        "shortest_chars and variant:stack:length at 95% but not at the family's Bonferroni level")


def test_a_rule_sifter_takes_every_retention_mode_without_states(length_runs, tmp_path):
    """A free rule's sifter: the fixed rule, a saved recall-targeted operating point and one fitted at filter time,
    and the high-probability mode (refused with too few calibration pools, in one line), all without --states."""
    (pools, _), (new_pools, _), _ = length_runs
    rows = pools.read_text().splitlines()
    fit_part, cal = tmp_path / "fit.jsonl", tmp_path / "cal.jsonl"
    fit_part.write_text("\n".join(r for r in rows if '"repo":"repo0"' in r or '"repo":"repo1"' in r) + "\n")
    cal.write_text("\n".join(r for r in rows if '"repo":"repo2"' in r or '"repo":"repo3"' in r) + "\n")
    runner = CliRunner()
    r = runner.invoke(app, ["fit", str(fit_part), "--method", "fewest-steps", "--out", str(tmp_path / "s"),
                            "--target-recall", "0.9", "--calibration", str(cal)])
    assert r.exit_code == 0 and (tmp_path / "s" / "operating_point.json").is_file(), r.output
    for extra in ([], ["--target-recall", "0.9"], ["--target-recall", "0.9", "--calibration", str(cal)]):
        out = tmp_path / f"f{len(extra)}.json"
        r = runner.invoke(app, ["filter", str(new_pools), "--sifter", str(tmp_path / "s"), "--out", str(out),
                                "--show", "0", *extra])
        assert r.exit_code == 0, (extra, r.output)
        done = json.loads(out.read_text())
        assert done["inputs"]["states_dir"] is None and ("operating_point" in done) == bool(extra)
    r = runner.invoke(app, ["filter", str(new_pools), "--sifter", str(tmp_path / "s"), "--out", str(tmp_path / "c"),
                            "--show", "0", "--target-recall", "0.9", "--confidence", "0.9", "--calibration", str(cal)])
    assert r.exit_code == 2 and "calibration pools" in r.output and not (tmp_path / "c").exists()
