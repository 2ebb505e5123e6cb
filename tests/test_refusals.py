"""Refusals on the filter, fit, premise and operating-point surfaces (issue 51): each bad combination of
options or hand-edited file is refused with one ``error:`` line (exit code 2) naming the option or the file,
before any work and with nothing written; the documented usages that failed now run.

``sifted``: synthetic states of overlapping classes (``test_operating_point._noisy_inputs``) and a sifter
with its operating point written by 'fit --target-recall' (about 15 s).
"""
from __future__ import annotations

import json

import pytest

from conftest import refused
from test_operating import _cli
from test_operating_point import _noisy_inputs


@pytest.fixture(scope="module")
def sifted(tmp_path_factory):
    d = tmp_path_factory.mktemp("sifted")
    _noisy_inputs(d)
    r = _cli("fit", d / "bank.jsonl", "--states", d / "states", "--out", d / "sifter", "--scorer-epochs", "3",
             "--target-recall", "0.9", "--calibration", d / "cal.jsonl")
    assert r.exit_code == 0, r.output
    return d


def _filter(d, *args):
    return _cli("filter", d / "pools.jsonl", "--states", d / "states", "--sifter", d / "sifter", "--on-shift", "warn",
                "--show", "0", *args)


def _untouched(d, before):
    """Nothing written into ``d`` by a refused command."""
    assert sorted(p.name for p in d.iterdir()) == before


# --------------------------------------------------------------------------- keep rules
def test_gap_recall_keep_rule_runs_as_documented(sifted, tmp_path):
    """'--keep-rule gap-recall --target-recall R --calibration CAL' fits the gap rule and applies it: the kept
    sets are those of every candidate within the fitted threshold of its pool's best score."""
    out = tmp_path / "gap.json"
    r = _filter(sifted, "--keep-rule", "gap-recall", "--target-recall", "0.9", "--calibration", sifted / "cal.jsonl",
                "--out", out)
    assert r.exit_code == 0, r.output
    assert "(keep rule gap-recall)" in r.output
    run = json.loads(out.read_text())
    op = run["operating_point"]
    assert op["rule"] == "gap-recall" and op["threshold"] is not None and op["threshold"] <= 0
    for pool, row in zip(run["pools"], op["pools"]):
        s = [c["s"] for c in pool["candidates"]]
        kept = {c["traj_id"] for c in pool["candidates"] if c["retained"]}
        within = {c["traj_id"] for c in pool["candidates"] if c["s"] - max(s) >= op["threshold"]}
        best = max(pool["candidates"], key=lambda c: c["s"])["traj_id"]
        if row["shift"] != "flagged":  # a flagged pool keeps all (--on-shift keep-all is not set here: warn)
            assert kept == within | {best}, (pool["instance_id"], kept, within)
    # the rank rule on the same calibration keeps other sets: the option is not ignored
    r = _filter(sifted, "--target-recall", "0.9", "--calibration", sifted / "cal.jsonl", "--out",
                tmp_path / "rank.json")
    assert r.exit_code == 0, r.output
    rank = json.loads((tmp_path / "rank.json").read_text())["operating_point"]
    assert rank["rule"] == "target-recall" and rank["threshold"] != op["threshold"]


@pytest.mark.parametrize("args, words", [
    (["--keep-rule", "gap-recall"], ("--keep-rule gap-recall", "pass --target-recall R")),
    (["--keep-rule", "gap-recall", "--calibration", "CAL"], ("--keep-rule gap-recall", "pass --target-recall R")),
    (["--keep-rule", "fixed", "--target-recall", "0.9"], ("--keep-rule fixed does not target a recall",)),
    (["--keep-rule", "fixed", "--target-recall", "0.9", "--calibration", "CAL"], ("--keep-rule fixed",)),
    (["--keep-rule", "gap-recall", "--target-recall", "0.9", "--confidence", "0.9", "--calibration", "CAL"],
     ("--keep-rule gap-recall has no --confidence",)),
    (["--keep-rule", "confident-recall", "--target-recall", "0.9", "--calibration", "CAL"], ("needs --confidence",)),
    (["--keep-rule", "gap-recall", "--target-recall", "0.9"], ("operating point", "is the keep rule target-recall",
                                                              "not --keep-rule gap-recall")),
    (["--keep-rule", "nosuch"], ("--keep-rule", "nosuch")),
    (["--min-keep", "0", "--frac", "0"], ("--min-keep must be a positive integer", "Got 0")),
    (["--frac", "5"], ("--frac must be a number from 0 to 1", "Got 5")),
    (["--target-recall", "0.9", "--frac", "0.3"], ("--frac is not a setting of the keep rule target-recall",)),
    (["--keep-rule", "gap-recall", "--target-recall", "0.9", "--calibration", "CAL", "--frac", "0.3"],
     ("--frac is not a setting of the keep rule gap-recall",)),
    (["--target-recall", "0.9", "--calibration", "CAL", "--min-keep", "3", "--max-keep", "2"],
     ("--min-keep 3 exceeds --max-keep 2",)),
    (["--target-recall", "0.9", "--min-keep", "3"], ("was fitted with --min-keep 1, not 3",)),
])
def test_contradictory_keep_options_are_refused_before_any_work(sifted, tmp_path, args, words):
    args = [sifted / "cal.jsonl" if a == "CAL" else a for a in args]
    before = sorted(p.name for p in sifted.iterdir())
    r = _filter(sifted, *args, "--out", tmp_path / "f.json")
    refused(r, *words)
    assert "sifter.json" not in r.output      # the options are at fault, never the intact file
    assert "RecallKeep" not in r.output and "Sifter" not in r.output
    assert not (tmp_path / "f.json").exists()
    _untouched(sifted, before)


def test_a_plugin_keep_rule_gets_only_the_options_it_takes(sifted, tmp_path):
    """The rule behind the cases above: a registered keep rule is refused the retention options its constructor
    does not take (--min-keep, --frac) and, when it learns from labelled pools, a missing --calibration."""
    import numpy as np
    from latentsift._core.registry import registry_add, registry_remove
    from latentsift.sift.keep import KeepRule

    class TopOne(KeepRule):
        name = "top-one-test"

        def keep(self, scores, traj_ids):
            return np.arange(len(traj_ids)) == int(np.argmax(scores))

    class Learned(TopOne):
        name = "learned-test"

        def fit(self, pools):
            return self

    base = ["filter", sifted / "pools.jsonl", "--method", "shortest-chars", "--out", tmp_path / "f.json"]
    registry_add("keep_rule", TopOne.name, TopOne)
    registry_add("keep_rule", Learned.name, Learned)
    try:
        refused(_cli(*base, "--keep-rule", TopOne.name, "--min-keep", "2"), "--min-keep is not a setting",
                TopOne.name)
        refused(_cli(*base, "--keep-rule", TopOne.name, "--frac", "0.3"), "--frac is not a setting")
        refused(_cli(*base, "--keep-rule", Learned.name), f"--keep-rule {Learned.name} is fitted on labelled pools",
                "--calibration")
        assert not (tmp_path / "f.json").exists()
        r = _cli(*base, "--keep-rule", TopOne.name)
        assert r.exit_code == 0, r.output
        run = json.loads((tmp_path / "f.json").read_text())
        assert run["keep_rule"]["rule"] == TopOne.name and all(p["n_keep"] == 1 for p in run["pools"])
    finally:
        registry_remove("keep_rule", TopOne.name)
        registry_remove("keep_rule", Learned.name)


# --------------------------------------------------------------------------- a hand-edited operating_point.json
def _edited(sifted, tmp_path, edit):
    """A copy of the sifter whose operating_point.json went through ``edit(record)``; its path."""
    import shutil
    sifter = tmp_path / "sifter"
    shutil.copytree(sifted / "sifter", sifter)
    rec = json.loads((sifter / "operating_point.json").read_text())
    edit(rec)
    (sifter / "operating_point.json").write_text(json.dumps(rec))
    return sifter


def _cal(rec):
    return rec["rule"]["calibration"]


@pytest.mark.parametrize("edit, words", [
    (lambda r: _cal(r).update(x=[], y=[]), "field 'rule.calibration.x'"),
    (lambda r: _cal(r).update(y=_cal(r)["y"][:-1]), "field 'rule.calibration.y' must hold one value per value of 'x'"),
    (lambda r: r["rule"].update(threshold=None), "field 'rule.threshold' must be a number"),
    (lambda r: r["rule"].update(threshold=1e300), "field 'rule.threshold': 1e+300 lies outside the calibration scores"),
    (lambda r: r["rule"].update(threshold=r["rule"]["threshold"] + 0.2), "field 'rule.p_threshold'"),
    (lambda r: r["rule"].update(threshold_meaning="keep less"), "field 'rule.threshold_meaning'"),
    (lambda r: r["rule"].update(n_calibration_pools=3, n_lost_allowed=0), "fewer than the 9"),
    (lambda r: r["rule"].update(n_lost_allowed=0), "field 'rule.n_lost_allowed'"),
    (lambda r: r["calibration_pools"].update(pool_sizes=[6, 4]), "field 'calibration_pools.pool_sizes'"),
    (lambda r: r.update(calibration_instances=[]), "field 'calibration_instances'"),   # the leak check's list
])
def test_a_hand_edited_operating_point_is_refused_in_one_line(sifted, tmp_path, edit, words):
    """What is tested: an operating_point.json edited by hand (an empty or unequal calibration map, a null
    or huge threshold, counts no fit gives, no calibration instance for filter to refuse pools of) is
    refused by 'filter' with one line naming the file and the field, instead of a numpy traceback or every
    pool kept at one and marked guaranteed."""
    sifter = _edited(sifted, tmp_path, edit)
    r = _cli("filter", sifted / "pools.jsonl", "--states", sifted / "states", "--sifter", sifter, "--target-recall",
             "0.9", "--out", tmp_path / "f.json")
    refused(r, f"{sifter / 'operating_point.json'}:", words, "edited or damaged")
    assert not (tmp_path / "f.json").exists()


def test_pools_outside_the_calibrated_sizes_are_not_guaranteed(sifted, tmp_path):
    """What is tested: the operating point records the calibration pools' sizes (K = 4 here); a pool of
    K = 8 (two pools merged) is filtered but not guaranteed, and the output says why; the pools of K = 4
    keep their guarantee. A file written before the sizes were recorded guarantees no pool."""
    from latentsift.trajectories.trajectory import load_jsonl, save_jsonl
    rec = json.loads((sifted / "sifter" / "operating_point.json").read_text())
    assert rec["calibration_pools"]["pool_sizes"] == [4, 4]
    trajs = load_jsonl(sifted / "pools.jsonl")
    for t in trajs:  # pools__1 joins pools__0: one pool of K = 8
        if t.instance_id == "pools__1":
            t.instance_id = "pools__0"
    save_jsonl(trajs, tmp_path / "merged.jsonl")
    r = _cli("filter", tmp_path / "merged.jsonl", "--states", sifted / "states", "--sifter", sifted / "sifter",
             "--target-recall", "0.9", "--on-shift", "warn", "--show", "0", "--out", tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    assert "1 pool size K = 8 outside the calibration pools' sizes (4 to 4)" in " ".join(r.output.split())
    rows = {p["instance_id"]: p for p in json.loads((tmp_path / "f.json").read_text())["operating_point"]["pools"]}
    assert rows["pools__0"]["k"] == 8 and not rows["pools__0"]["guaranteed"]
    assert "pool size K = 8 outside the calibration pools' sizes (4 to 4)" in rows["pools__0"]["not_guaranteed"]
    assert all(not any("pool size" in w for w in p["not_guaranteed"]) for i, p in rows.items() if i != "pools__0")
    assert any(p["guaranteed"] for p in rows.values())
    old = _edited(sifted, tmp_path, lambda r: r["calibration_pools"].pop("pool_sizes"))
    r = _cli("filter", sifted / "pools.jsonl", "--states", sifted / "states", "--sifter", old, "--target-recall", "0.9",
             "--on-shift", "warn", "--show", "0", "--out", tmp_path / "g.json")
    assert r.exit_code == 0, r.output
    op = json.loads((tmp_path / "g.json").read_text())["operating_point"]
    assert op["n_guaranteed"] == 0 and all("sizes are unrecorded" in " ".join(p["not_guaranteed"]) for p in op["pools"])


# --------------------------------------------------------------------------- fit --target-recall
def test_fit_refuses_calibration_states_of_other_settings_before_writing_the_sifter(sifted, tmp_path):
    """What is tested: 'fit --target-recall R --calibration CAL --calibration-states S' with S extracted with
    other span settings than --states (or missing the calibration candidates, or CAL unlabelled) is refused
    in one line before the sifter is fitted: no SIFTER_DIR, no lock left."""
    import shutil
    from latentsift.trajectories.trajectory import load_jsonl, save_jsonl
    other = tmp_path / "other-states"
    shutil.copytree(sifted / "states", other)
    man = json.loads((other / "manifest.json").read_text())
    man["settings"]["max_span_tokens"] = 4
    (other / "manifest.json").write_text(json.dumps(man))
    trajs = load_jsonl(sifted / "cal.jsonl")
    trajs[0].reward = None
    save_jsonl(trajs, tmp_path / "unlabelled.jsonl")
    base = ["fit", sifted / "bank.jsonl", "--states", sifted / "states", "--scorer-epochs", "3", "--target-recall",
            "0.9", "--out", tmp_path / "sifter"]
    for extra, words in ((["--calibration", sifted / "cal.jsonl", "--calibration-states", other],
                          ("fit --target-recall", str(other), "max_span_tokens")),
                         (["--calibration", sifted / "cal.jsonl", "--calibration-states", tmp_path / "nowhere"],
                          ("no state store at", "nowhere")),
                         (["--calibration", tmp_path / "unlabelled.jsonl"], ("--calibration", "have no reward"))):
        refused(_cli(*base, *extra), *words)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other-states", "unlabelled.jsonl"]


# --------------------------------------------------------------------------- premise: which store is whose
FAST = ["--folds", "2", "--draws", "5", "--bootstrap", "50", "--scorer-epochs", "2", "--k", "4"]


@pytest.fixture(scope="module")
def policy_pools(tmp_path_factory):
    """One policy's pools recording its fingerprint (meta.policy, as a rollout writes it), its own states, a proxy
    store of the same candidates by another model, and a second own-model store (another folder)."""
    from synthetic import FP, PROXY_FP, write_single_policy
    d = tmp_path_factory.mktemp("policy")
    pools, own = write_single_policy(d / "own", k=4, examples=True, policy=FP.digest)
    _, proxy = write_single_policy(d / "proxy", k=4, seed=7, fingerprint=PROXY_FP)
    _, again = write_single_policy(d / "again", k=4, seed=5)
    return d, pools, own, proxy, again


@pytest.mark.parametrize("case, words", [
    ("swapped", ("--states", "proxy", "not of the policy that wrote the candidates", "look swapped")),
    ("one store as both", ("is given as --states and as --proxy-states",)),
    ("own model as proxy", ("--proxy-states", "holds the policy's own states")),
    ("proxy only", ("--states", "not of the policy that wrote the candidates")),
    ("unknown key", ("--gen-test-key 'nosuchkey'", "'examples_passed'")),
])
def test_premise_refuses_stores_that_are_not_what_they_are_given_as(policy_pools, tmp_path, case, words):
    """What is tested: the candidates record their policy's fingerprint; 'premise' with the stores swapped, one
    store given as both, the policy's own states given as the proxy, or only the proxy's states is refused in one
    line before any run (no OUT), where it ran and reported a flipped or zero own - proxy; an unknown
    --gen-test-key is refused instead of scoring no Stage 3."""
    d, pools, own, proxy, again = policy_pools
    args = {"swapped": ["--states", proxy, "--proxy-states", own],
            "one store as both": ["--states", own, "--proxy-states", own],
            "own model as proxy": ["--states", own, "--proxy-states", again],
            "proxy only": ["--states", proxy],
            "unknown key": ["--states", own, "--gen-test-key", "nosuchkey"]}[case]
    refused(_cli("premise", pools, *args, "--out", tmp_path / "out", *FAST), *words)
    assert not (tmp_path / "out").exists()


def test_premise_accepts_the_policy_states_with_another_model_as_proxy(policy_pools):
    from latentsift.deploy.library import open_stores
    from latentsift.protocol.premise import check_premise_stores
    from latentsift.trajectories.trajectory import load_jsonl
    d, pools, own, proxy, _ = policy_pools
    check_premise_stores(load_jsonl(pools), open_stores([own], "own"), open_stores([proxy], "proxy"))
    check_premise_stores(load_jsonl(pools), open_stores([own], "own"))


def test_premise_takes_a_replay_in_another_dtype_for_the_policy_states(tmp_path):
    """A policy that wrote its candidates in bfloat16, replayed in float32 (a CPU without bf16): the replay holds
    the policy's own states (same weights, tokenizer, template); as proxy it is refused, and another model's
    states as --states still are."""
    import dataclasses
    from synthetic import FP, PROXY_FP, write_single_policy
    other = next(d for d in ("bfloat16", "float32") if d != FP.dtype)
    wrote = dataclasses.replace(FP, dtype=other).digest
    assert wrote != FP.digest and FP.is_model_of(wrote) and not PROXY_FP.is_model_of(wrote)
    pools, own = write_single_policy(tmp_path / "own", k=4, examples=True, policy=wrote)
    _, proxy = write_single_policy(tmp_path / "proxy", k=4, seed=7, fingerprint=PROXY_FP)
    r = _cli("premise", pools, "--states", own, "--proxy-states", proxy, "--out", tmp_path / "out", *FAST)
    assert r.exit_code == 0, r.output
    refused(_cli("premise", pools, "--states", proxy, "--proxy-states", own, "--out", tmp_path / "o2", *FAST),
            "not of the policy that wrote the candidates", "look swapped")


def test_premise_without_a_recorded_policy_refuses_the_same_encoding_as_proxy(tmp_path):
    """Pools that record no policy (imported runs): the proxy must not be the own store's model with the same
    settings (a copy of the own states); a crossval of one task says at least 2 are needed."""
    import shutil
    from synthetic import write_single_policy
    pools, own = write_single_policy(tmp_path / "own", k=4)
    shutil.copytree(own, tmp_path / "copy")
    refused(_cli("premise", pools, "--states", own, "--proxy-states", tmp_path / "copy", "--out", tmp_path / "out",
                 *FAST), "--proxy-states", "same model and settings")
    assert not (tmp_path / "out").exists()
    one, states = write_single_policy(tmp_path / "one", n_instances=1, k=4)
    refused(_cli("crossval", one, "--states", states, "--out", tmp_path / "cv", "--group-by", "instance", "--folds",
                 "2", "--k", "4"), "at least 2 instances", "come from 1 instance")
    assert not (tmp_path / "cv").exists()
    assert "between 2 and 1" not in _cli("crossval", one, "--states", states, "--out", tmp_path / "cv", "--group-by",
                                         "instance", "--k", "4").output


@pytest.mark.parametrize("field, value", [("frac", 5), ("frac", -0.5), ("min_keep", 0), ("fusion_weight", 2.0)])
def test_sifter_json_settings_out_of_range_are_refused(sifted, tmp_path, field, value):
    """What is tested: a sifter.json whose filter settings lie outside the ranges of their options (frac 5,
    min_keep 0 ...) is refused by its schema, naming the file and field, also when the command line would
    override them (the file is checked as saved)."""
    import shutil
    sifter = tmp_path / "sifter"
    shutil.copytree(sifted / "sifter", sifter)
    man = json.loads((sifter / "sifter.json").read_text())
    man["config"]["settings"][field] = value
    (sifter / "sifter.json").write_text(json.dumps(man))
    r = _cli("filter", sifted / "pools.jsonl", "--states", sifted / "states", "--sifter", sifter, "--min-keep", "2",
             "--frac", "0.5", "--out", tmp_path / "f.json")
    refused(r, f"{sifter / 'sifter.json'}: field 'config.settings.{field}'", "edited or damaged")
    assert not (tmp_path / "f.json").exists()


# --------------------------------------------------------------------------- messages name the option
INTERNAL_NAMES = ("LatentSift ", "LatentSift.", "LinearScorer", "RecallKeep", "Sifter", "run_filter", "'n_evidence' "
                  "parameter of LatentSift", "max_epochs")


@pytest.mark.parametrize("args, option", [
    (["filter", "--sifter", "S", "--evidence", "-1"], "--evidence"),
    (["filter", "--method", "shortest-chars", "--evidence", "-1"], "--evidence"),
    (["filter", "--method", "shortest-chars", "--on-shift", "nosuch"], "--on-shift"),
    (["filter", "--sifter", "S", "--on-leak", "nosuch"], "--on-leak"),
    (["filter", "--sifter", "S", "--bank-choice", "nosuch"], "--bank-choice"),
    (["filter", "--bank", "B", "--scorer", "C", "--distance", "nosuch"], "--distance"),
    (["filter", "--bank", "B", "--scorer", "C", "--weighting", "nosuch"], "--weighting"),
    (["filter", "--bank", "B", "--scorer", "C", "--channels", "cot,foo"], "--channels"),
    (["filter", "--bank", "B", "--scorer", "C", "--fusion-weight", "2"], "--fusion-weight"),
    (["fit", "--scorer-epochs", "-1"], "--scorer-epochs"),
    (["fit", "--guard-reference", "nosuch"], "--guard-reference"),
    (["fit", "--target-recall", "0.9", "--calibration", "CAL", "--calibration-method", "nosuch"],
     "fit (--calibration-method)"),
    (["fit", "--target-recall", "0.9", "--calibration", "CAL", "--confidence", "5"], "fit (--confidence)"),
])
def test_refusals_name_the_option_not_the_class(sifted, tmp_path, args, option):
    """What is tested: a bad value of an option of 'filter' or 'fit' is told with the option's name (and the
    command's), never a class or function of the library, before any work, also where the option would go
    unused (--on-shift with a rule filter, --evidence without a bank)."""
    d = sifted
    subs = {"S": d / "sifter", "B": d / "sifter" / "bank", "C": d / "sifter" / "scorer", "CAL": d / "cal.jsonl"}
    args = [subs.get(a, a) for a in args]
    if args[0] == "filter":
        cmd = ["filter", d / "pools.jsonl", "--states", d / "states", "--out", tmp_path / "f.json", *args[1:]]
    else:
        cmd = ["fit", d / "bank.jsonl", "--states", d / "states", "--out", tmp_path / "s", *args[1:]]
    r = _cli(*cmd)
    refused(r, option)
    assert not any(w in r.output for w in INTERNAL_NAMES), r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []
