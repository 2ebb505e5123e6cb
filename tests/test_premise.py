"""The premise test on one policy's pools (``latentsift premise``, ``protocol.premise``) and the transfer of a
bank between two policies' pools with the shift guard's flags (``latentsift transfer --group-by instance``).

Synthetic states in real state stores for the structure (fast), and the packaged SmolLM2 on the tiny run's
pools for real states: two dtypes of the same trajectories' replay stand in for own and proxy (their spans
cut alike: a proxy of other span settings is refused).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import refused
from latentsift.cli import app
from latentsift._core.validation import LatentSiftError
from latentsift.metrics.diagnostics import within_pool_auc
from latentsift.protocol.claims import (CALL_LENGTH_RULES, CLAIM_REFERENCES, KEEP_ALL, load_claim_inputs,
                                        premise_claims, run_claims)
from latentsift.protocol.premise import OPERATING_FILE, PREMISE_REFERENCES, PREMISE_SCORES, SCORES_FILE
from latentsift.sift.ablations import BRANCH_LEARNED
from latentsift.sift.rules import EXAMPLES_PASSED, PAPER, PURE_LENGTH, REFERENCE
from latentsift._jobs.premise import premise
from latentsift.states.extract import extract_pools
from latentsift.states.model import load_policy
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl
from synthetic import PROXY_FP, write_single_policy

FAST = ["--folds", "2", "--draws", "5", "--bootstrap", "50", "--scorer-epochs", "2"]


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def synthetic_premise(tmp_path_factory):
    """K = 8 candidates of 16 tasks, one policy; a proxy store of the same candidates with other states."""
    d = tmp_path_factory.mktemp("premise")
    pools, own = write_single_policy(d / "own", k=8, examples=True, rollout_records=True)
    _, proxy = write_single_policy(d / "proxy", k=8, seed=7, fingerprint=PROXY_FP)
    r = _cli("premise", pools, "--states", own, "--proxy-states", proxy, "--out", d / "out", *FAST)
    assert r.exit_code == 0, r.output
    return d, json.loads((d / "out" / "summary.json").read_text()), (d / "out" / "report.md").read_text()


def test_premise_section_compares_the_five_scores_with_the_seven_references(synthetic_premise):
    """The paper's method, its branches, the probe and the recommendation (issue 67) against the references."""
    d, s, md = synthetic_premise
    pre = s["runs"]["own"]["premise"]
    assert pre["scores"] == list(PREMISE_SCORES) and pre["references"] == list(PREMISE_REFERENCES)
    assert pre["missing_scores"] == {} and pre["auc"]["missing_references"] == {}
    m = pre["multiplicity"]
    assert len(PREMISE_SCORES) == 5 and PREMISE_SCORES[-1] == "recommended"
    assert m["n_auc_intervals"] == 5 * 8 and m["bonferroni_level"] == pytest.approx(1 - 0.05 / 40)
    for n in PREMISE_SCORES:
        row = pre["auc"]["scores"][n]
        assert set(row["vs"]) == set(PREMISE_REFERENCES)
        for d_ in row["vs"].values():  # the Bonferroni interval is wider than the 95% one
            assert d_["adjusted"]["lo"] <= d_["lo"] and d_["adjusted"]["hi"] >= d_["hi"]
        assert "minus_half" in row["length_removed"]
    # the same numbers as the run's own decision table where the two overlap (one computation, two families)
    dec = json.loads((d / "out" / "own" / "report" / "summary.json").read_text())["decision"]["auc"]
    assert pre["auc"]["scores"]["latentsift"]["auc"] == dec["scores"]["latentsift"]["auc"]
    assert pre["auc"]["scores"]["latentsift"]["vs"]["shortest_chars"]["estimate"] == \
        dec["scores"]["latentsift"]["vs"]["shortest_chars"]["estimate"]
    # K = 16 exceeds the pools of 8: retention at 4 and 8 only; verifier calls at R = 0.9 and 0.95
    assert pre["ks"] == ["4", "8"] and set(pre["retention"]["latentsift"]) == {"4", "8"}
    assert set(pre["verifier_calls"]["latentsift"]) == {"0.9", "0.95"}
    assert set(pre["best_at_k"]) == set(pre["retention"]) | {"oracle Pass@K"}
    assert pre["final_verifier"].startswith("no verifier results given")
    # Stage 3 from the candidates' examples (here exactly their labels): random keeps 4 of 8 and Stage 3 then
    # picks a passing survivor whenever one is kept (1 - 1/70 of the time), instead of a uniform pick (1/2)
    assert pre["stage3"] == "examples_passed" and s["settings"]["gen_test_key"] == "examples_passed"
    assert pre["best_at_k"]["random"]["8"]["mean"] > 0.9
    assert "Stage 3 (generated tests): the candidates' tests['examples_passed']" in md
    # the synthetic states separate the outcomes and length does not: own states beat length by the rule
    assert pre["own_states_beat_length"] == "yes"
    assert s["runs"]["own"]["composition"]["agents"] == ["policy-a"]


def test_premise_tables_carry_pure_length_and_the_examples(synthetic_premise):
    """Length in the rollout scaffold is partly an execution signal: every premise table shows the pure length
    references (the submitted code's characters, the tokens generated) and the examples' pass share."""
    d, s, md = synthetic_premise
    pre = s["runs"]["own"]["premise"]
    new = [*PURE_LENGTH, EXAMPLES_PASSED]
    assert set(new) <= set(pre["references"]) and set(new) <= set(pre["retention"]) <= set(pre["best_at_k"])
    assert set(new) <= set(pre["verifier_calls"])
    aucs = pre["auc"]["reference_aucs"]
    assert aucs[EXAMPLES_PASSED]["auc"] == 1.0  # here the examples are the labels
    trajs = load_jsonl(d / "own" / "pools.jsonl")  # each reference is the rule it names (within-pool AUC)
    table = {"inst": np.array([t.instance_id for t in trajs]), "y": np.array([int(t.label) for t in trajs])}
    for key, raw in ((PURE_LENGTH[0], [-len(t.patch) for t in trajs]),
                     (PURE_LENGTH[1], [-sum(x.meta["tokens"] for x in t.steps) for t in trajs])):
        assert aucs[key]["auc"] == pytest.approx(within_pool_auc(table["inst"], table["y"], np.array(raw, float)).auc)
    assert set(pre["verdicts"]) == {"beats_length", "beats_pure_length", "beats_examples"}
    adj = pre["auc"]["scores"]["latentsift"]["vs"][EXAMPLES_PASSED]["adjusted"]  # a perfect reference: never beaten
    assert pre["verdicts"]["beats_examples"]["latentsift"] == ("no" if adj["hi"] < 0 else "undetermined")
    for label in ("shortest code (chars)", "fewest generated tokens", "docstring examples passed (share)"):
        assert f"minus {label}" in md and f"| {label} |" in md  # the AUC table's column, a retention row
    assert "Own states beat pure length (shortest code, fewest generated tokens): **" in md
    # the learned branch's early-stopping split keeps every task on one side (folds by instance)
    for path in (d / "out" / "own" / "folds").glob("fold-*/paper/scorer/scorer.json"):
        sc = json.loads(path.read_text())
        task = lambda t: t.split("/", 1)[1].rsplit("/", 1)[0]  # noqa: E731  "policy-a/HumanEval/3/5" -> "HumanEval/3"
        assert sc["val_ids"] and not {task(t) for t in sc["train_ids"]} & {task(t) for t in sc["val_ids"]}


def test_a_free_reference_whose_record_is_absent_is_named_missing(tmp_path):
    pools, states = write_single_policy(tmp_path / "p", n_instances=8, k=4, examples=True)
    r = _cli("premise", pools, "--states", states, "--out", tmp_path / "out", *FAST)
    assert r.exit_code == 0, r.output
    pre = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]["own"]["premise"]
    gone = pre["auc"]["missing_references"]
    assert "no candidate has a patch" in gone[PURE_LENGTH[0]] and "generated-token count" in gone[PURE_LENGTH[1]]
    assert EXAMPLES_PASSED in pre["references"] and PURE_LENGTH[0] not in pre["retention"]
    assert pre["verdicts"]["beats_pure_length"]["latentsift"] == "undetermined"
    # the claims name the absent reference with its reason (never replaced), and (c) its absent proxy
    claims = json.loads((tmp_path / "out" / "summary.json").read_text())["claims"]
    for c in ("a", "b"):
        assert claims[c]["outcome"] in ("undetermined", "not confirmed")
        assert "generated-token count" in claims[c]["missing"][PURE_LENGTH[1]]
        assert PURE_LENGTH[1] not in claims[c]["intervals"]
    assert claims["c"]["outcome"] == "undetermined" and "--proxy-states" in claims["c"]["missing"]["proxy"]
    for t in claims["d"]["targets"].values():  # (d) cannot be confirmed while a length rule is missing
        assert set(t["cheapest"]["missing"]) == set(PURE_LENGTH)
        assert all(row["outcome"] != "confirmed" for row in t["scores"].values())


def test_own_vs_proxy_pairs_the_same_candidates(synthetic_premise):
    d, s, md = synthetic_premise
    cmp = s["own_vs_proxy"]
    assert set(cmp["filters"]) == set(PREMISE_SCORES) and cmp["n_candidates"] == 128 and cmp["n_instances"] == 16
    for n, row in cmp["filters"].items():
        own = s["runs"]["own"]["premise"]["auc"]["scores"][n]["auc"]["auc"]
        proxy = s["runs"]["proxy"]["premise"]["auc"]["scores"][n]["auc"]["auc"]
        assert row["a"] == pytest.approx(own) and row["b"] == pytest.approx(proxy)
        assert row["estimate"] == pytest.approx(own - proxy)
        assert row["adjusted"]["level"] == pytest.approx(1 - 0.05 / len(PREMISE_SCORES))
    assert "## Own states" in md and "## Proxy states" in md and "## Own states against the proxy encoder" in md
    assert md.index("Rules (stated before the numbers)") < md.index("### Within-pool AUC")
    assert "### Best@K through the cascade" in md and "Final verifier: no verifier results given" in md
    own_md = (d / "out" / "own" / "report" / "report.md").read_text()
    assert "## The premise: own states against length" in own_md


def test_the_operating_record_is_saved_and_matches_the_summary(synthetic_premise):
    """premise/operating.json: per filter and pool the recall-targeted rule's calls and hits at R = 0.9, 0.95; its
    means are the summary's operating points, for the four state scores and the five length rules of claim (d)."""
    d, s, _ = synthetic_premise
    rec = json.loads((d / "out" / "own" / OPERATING_FILE).read_text())
    summary = json.loads((d / "out" / "own" / "report" / "summary.json").read_text())
    op = summary["operating_points"]["filters"]
    assert rec["format"] == "latentsift-premise-operating" and rec["targets"] == ["0.9", "0.95"]
    assert sorted(rec["instance_id"]) == sorted(f"HumanEval/{i}" for i in range(16)) and set(rec["fold"]) == {0, 1}
    assert rec["n_candidates"] == [8] * 16 and all(rec["has_resolved"])
    assert set(PREMISE_SCORES) | set(CALL_LENGTH_RULES) <= set(rec["filters"]) == set(op)
    pos = np.array(rec["has_resolved"])
    for name, by in rec["filters"].items():
        for r, row in by.items():
            want = op[name]["targets"][r]
            assert np.mean(row["calls"]) == pytest.approx(want["verifier_calls"]["mean"])
            assert np.mean(np.array(row["hit"])[pos]) == pytest.approx(want["realized_recall"]["pooled"]["mean"])
            assert row["n_folds_keep_all"] == want["n_folds_keep_all"]


def test_claims_of_a_premise_run_at_their_family_level(synthetic_premise):
    """The claims (a)-(d): m = 15 intervals at 1 - 0.05/15; the same estimates as the premise tables (another level)."""
    d, s, md = synthetic_premise
    claims, pre = s["claims"], s["runs"]["own"]["premise"]
    assert claims["family"]["m"] == 3 + 3 + 1 + 4 * 2 and claims["family"]["level"] == pytest.approx(1 - 0.05 / 15)
    for c, score in (("a", BRANCH_LEARNED), ("b", PAPER)):
        assert claims[c]["score"] == score and list(claims[c]["intervals"]) == list(CLAIM_REFERENCES)
        for ref, row in claims[c]["intervals"].items():
            table = pre["auc"]["scores"][score]["vs"][ref]
            assert row["estimate"] == pytest.approx(table["estimate"]) and row["level"] == claims["family"]["level"]
            assert row["lo"] <= table["lo"] and row["hi"] >= table["hi"]   # wider than the 95% interval
        assert claims[c]["outcome"] == "confirmed"   # the synthetic states separate the outcomes, length does not
    ovp = s["own_vs_proxy"]["filters"][PAPER]
    assert claims["c"]["interval"]["estimate"] == pytest.approx(ovp["estimate"])
    # here every fold keeps all (2 folds: too few calibration pools for R = 0.9): 8 calls each, the first rule wins
    for r, t in claims["d"]["targets"].items():
        assert t["cheapest"]["rule"] == REFERENCE and t["cheapest"]["verifier_calls"] == 8.0
        for row in t["scores"].values():
            assert row["reaches"] and row["difference"]["mean"] == 0.0 and row["outcome"] == "undetermined"
    assert claims["earlier_finding"] == claims["a"]["outcome"]
    assert "## The confirmation's claims" in md and "Bonferroni level 99.667%" in md
    assert md.count("- (d) R = ") == 8 and "- (a) " in md and "- (c) " in md


def _with_calls(inputs, r, rows):
    """``inputs`` with the operating record at target ``r`` of each named filter replaced: name -> (calls, hit)."""
    op = copy.deepcopy(inputs.operating)
    for name, (calls, hit) in rows.items():
        n = len(op["instance_id"])
        op["filters"][name][r] = {"calls": [float(calls)] * n, "hit": [hit] * n, "n_folds_keep_all": 0}
    return dataclasses.replace(inputs, operating=op)


def test_claim_outcomes_flip_as_the_rules_say(synthetic_premise):
    d = synthetic_premise[0] / "out"
    inputs = load_claim_inputs(d / "own", d / "proxy")
    kw = {"n_boot": 100, "seed": 0}
    assert premise_claims(inputs, **kw)["a"]["outcome"] == "confirmed"
    # a reference removed: (a) undetermined, the reference named with its reason
    gone = dataclasses.replace(inputs, own={k: v for k, v in inputs.own.items() if k != CLAIM_REFERENCES[2]},
                               missing={CLAIM_REFERENCES[2]: "not fitted in every fold"})
    a = premise_claims(gone, **kw)["a"]
    assert a["outcome"] == "undetermined" and a["missing"] == {CLAIM_REFERENCES[2]: "not fitted in every fold"}
    # the learned branch turned against the labels: every interval lies below 0, (a) is not confirmed, with a
    # reference missing too (the claim is "beats each"), and (b) does not move
    worst = dataclasses.replace(gone, own=dict(gone.own) | {BRANCH_LEARNED: -inputs.table["label"].astype(float)})
    got = premise_claims(worst, **kw)
    assert {x["side"] for x in got["a"]["intervals"].values()} == {"lower"} and got["a"]["outcome"] == "not confirmed"
    assert got["earlier_finding"] == "not confirmed" and got["b"] == premise_claims(gone, **kw)["b"]
    # (d) no length rule reaches R: the baseline keeps every candidate (8 calls, recall 1)
    none = {name: (2, False) for name in CALL_LENGTH_RULES}
    cheap = _with_calls(inputs, "0.9", none | {PAPER: (3, True), BRANCH_LEARNED: (3, False)})
    t = premise_claims(cheap, **kw)["d"]["targets"]["0.9"]
    assert t["cheapest"]["rule"] == KEEP_ALL and t["cheapest"]["verifier_calls"] == 8.0
    assert t["scores"][PAPER]["difference"]["mean"] == -5.0 and t["scores"][PAPER]["outcome"] == "confirmed"
    assert not t["scores"][BRANCH_LEARNED]["reaches"] and t["scores"][BRANCH_LEARNED]["outcome"] == "not confirmed"
    # the cheapest rule reaching R, ties to the first of the rules' list; a score dearer than it is not confirmed
    tie = none | {CALL_LENGTH_RULES[3]: (2, True), CALL_LENGTH_RULES[1]: (2, True), CALL_LENGTH_RULES[0]: (4, True)}
    t = premise_claims(_with_calls(inputs, "0.9", tie | {PAPER: (3, True)}), **kw)["d"]["targets"]["0.9"]
    assert t["cheapest"]["rule"] == CALL_LENGTH_RULES[1] and t["scores"][PAPER]["outcome"] == "not confirmed"
    # a length rule missing: the cheapest could be another, so no (d) claim is confirmed
    op = copy.deepcopy(cheap.operating)
    del op["filters"][CALL_LENGTH_RULES[2]]
    t = premise_claims(dataclasses.replace(cheap, operating=op), **kw)["d"]["targets"]["0.9"]
    assert t["scores"][PAPER]["outcome"] == "undetermined" and CALL_LENGTH_RULES[2] in t["scores"][PAPER]["missing"]


def test_claims_refuse_a_proxy_run_of_other_candidates(synthetic_premise, tmp_path):
    d = synthetic_premise[0] / "out"
    shutil.copytree(d / "proxy" / "premise", tmp_path / "proxy" / "premise")
    scores = json.loads((tmp_path / "proxy" / SCORES_FILE).read_text())
    scores["label"][0] = 1 - scores["label"][0]
    (tmp_path / "proxy" / SCORES_FILE).write_text(json.dumps(scores))
    with pytest.raises(LatentSiftError, match="same labelled candidates"):
        run_claims(d / "own", tmp_path / "proxy")
    (tmp_path / "proxy" / OPERATING_FILE).unlink()   # a run before the record was kept: refused, never guessed
    with pytest.raises(LatentSiftError, match="operating.json is missing"):
        run_claims(tmp_path / "proxy")


def test_premise_refuses_a_proxy_whose_spans_are_cut_otherwise(synthetic_premise, tmp_path):
    """Own and proxy stores of the same candidates whose span settings differ: own - proxy would measure the
    spans, not the encoders; one line naming both stores and both settings, nothing written."""
    d = synthetic_premise[0]
    proxy = shutil.copytree(d / "proxy" / "states", tmp_path / "proxy")
    manifest = json.loads((proxy / "manifest.json").read_text())
    manifest["settings"] |= {"max_span_tokens": 4, "renderer": "render_per_step"}
    (proxy / "manifest.json").write_text(json.dumps(manifest))
    r = _cli("premise", d / "own" / "pools.jsonl", "--states", d / "own" / "states", "--proxy-states", proxy,
             "--out", tmp_path / "out", *FAST)
    refused(r, f"--states {d / 'own' / 'states'} and --proxy-states {proxy} cut the spans with other settings "
               "(max_span_tokens=None vs 4, renderer=None vs 'render_per_step')")
    assert not (tmp_path / "out").exists()


def test_premise_refuses_stores_of_other_candidates_and_pools_smaller_than_every_k(synthetic_premise, tmp_path):
    d = synthetic_premise[0]
    pools, _ = write_single_policy(tmp_path / "other", n_instances=16, k=8, prefix="Other")
    r = _cli("premise", d / "own" / "pools.jsonl", "--states", d / "own" / "states", "--proxy-states",
             tmp_path / "other" / "states", "--out", tmp_path / "out", *FAST)
    refused(r, "proxy states", "has no states")
    assert not (tmp_path / "out").exists()  # refused before any run started
    r = _cli("premise", d / "own" / "pools.jsonl", "--states", d / "own" / "states", "--proxy-states",
             tmp_path / "nowhere", "--out", tmp_path / "out", *FAST)
    refused(r, "premise (proxy states): no state store at", "nowhere")
    assert not (tmp_path / "out").exists()
    small, states = write_single_policy(tmp_path / "small", n_instances=8, k=3)
    refused(_cli("premise", small, "--states", states, "--out", tmp_path / "out2", *FAST), "at most 3 candidates")
    assert not (tmp_path / "out2").exists()


def test_premise_reads_the_stores_of_several_rollout_shards_as_one(synthetic_premise, tmp_path):
    """The own states split over two stores (two rollout shards) give the same premise numbers as one store."""
    from latentsift.states.store import StateStore

    d, s, _ = synthetic_premise
    whole = StateStore(d / "own" / "states").open()
    states = whole.load()
    trajs = load_jsonl(d / "own" / "pools.jsonl")
    shards = []
    for i in range(2):
        part = [t for t in trajs if int(t.instance_id.rsplit("/", 1)[1]) % 2 == i]
        store = StateStore(tmp_path / f"shard{i}").create(whole.fingerprint, whole.settings)
        store.write([states[t.traj_id] for t in part], [t.instance_id for t in part])
        shards.append(tmp_path / f"shard{i}")
    r = _cli("premise", d / "own" / "pools.jsonl", "--states", shards[0], "--states", shards[1], "--out",
             tmp_path / "out", *FAST)
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert got["runs"]["own"]["premise"]["auc"] == s["runs"]["own"]["premise"]["auc"]
    assert got["inputs"]["own_states"] == f"{shards[0]}, {shards[1]}"


def test_transfer_between_two_policies_on_the_same_tasks_reports_the_guard_flags(tmp_path):
    pa, sa = write_single_policy(tmp_path / "a", agent="policy-a")
    pb, sb = write_single_policy(tmp_path / "b", agent="policy-b", seed=3)
    refused(_cli("transfer", pa, pb, "--states", sa, "--states", sb, "--out", tmp_path / "repo", "--folds", "2",
                 "--bootstrap", "50", "--draws", "5", "--scorer-epochs", "2"), "one repository", "--group-by instance")
    r = _cli("transfer", pa, pb, "--states", sa, "--states", sb, "--out", tmp_path / "tr", "--group-by", "instance",
             "--folds", "2", "--bootstrap", "50", "--draws", "5", "--scorer-epochs", "2", "--k", "4")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert s["settings"]["group_by"] == "instance"
    sets = {x["set"]["name"]: x for x in s["sets"]}
    assert set(sets) == {"policy-a pools", "policy-b pools"}
    for name, other in (("policy-a pools", "policy-b"), ("policy-b pools", "policy-a")):
        x = sets[name]
        assert x["bank_agents"] == [other]
        folds = x["folds"]  # folds by task: each task scored once, by a bank without it
        assert sorted(t for f in folds for t in f) == sorted({f"HumanEval/{i}" for i in range(16)})
        g = x["shift_guard"]
        assert g["reference_kind"] == "instance" and g["kind_used"] == ["instance"]
        assert g["name"]["rate"] == 1.0 and g["name"]["n_pools"] == 16  # another policy: never in the bank
        assert 0.0 <= g["distance"]["rate"] <= 1.0 and g["distance"]["n_pools"] == 16
    md = (tmp_path / "tr" / "report.md").read_text()
    assert "instance-disjoint" in md and "Shift guard on the `all` bank (instance-held-out reference" in md


@pytest.mark.model
def test_premise_on_real_states_of_two_dtypes(tiny_run, policy, tmp_path, one_torch_thread):
    """The tiny run's pools of one agent, its SmolLM2 states as 'own' and a replay with the same spans in
    another dtype as 'proxy' (another encoder's stand-in: other numerics, another fingerprint): the same
    candidates, the same folds, paired."""
    run, tiny = tiny_run["out"], tiny_run["settings"]
    trajs = load_jsonl(run / "pools.jsonl")
    agent = sorted({t.agent for t in trajs})[0]
    one = [t for t in trajs if t.agent == agent]
    save_jsonl(one, tmp_path / "pools.jsonl")
    other = load_policy(dtype="float32" if policy.fingerprint.dtype != "float32" else "bfloat16")
    extract_pools(other, one, tmp_path / "proxy", max_span_tokens=tiny["max_span_tokens"],
                  max_prompt_tokens=tiny["max_prompt_tokens"])
    k = max(len([t for t in one if t.instance_id == i]) for i in {t.instance_id for t in one})
    out = premise(tmp_path / "pools.jsonl", run / "states", tmp_path / "out", proxy_states=tmp_path / "proxy",
                  ks=(k,), n_folds=2, n_draws=5, n_boot=50, scorer_epochs=tiny["scorer_epochs"], log=lambda m: None)
    s = json.loads((out / "summary.json").read_text())
    assert s["runs"]["own"]["composition"]["agents"] == [agent]
    assert s["runs"]["own"]["composition"]["group_by"] == "instance"
    own_fp, proxy_fp = s["runs"]["own"]["fingerprint"], s["runs"]["proxy"]["fingerprint"]
    assert own_fp["architecture"] == proxy_fp["architecture"]  # one model, two dtypes
    cmp = s["own_vs_proxy"]
    assert cmp["n_candidates"] == len(one)
    for n, row in cmp["filters"].items():
        assert row["estimate"] == pytest.approx(row["a"] - row["b"])
    # the scores differ between the two stores (other states), the length rules do not
    own_scores = json.loads((out / "own" / "premise" / "scores.json").read_text())
    proxy_scores = json.loads((out / "proxy" / "premise" / "scores.json").read_text())
    assert own_scores["traj_id"] == proxy_scores["traj_id"]
    assert own_scores["scores"]["shortest_chars"] == proxy_scores["scores"]["shortest_chars"]
    assert not np.allclose(np.array(own_scores["scores"]["latentsift"], dtype=float),
                           np.array(proxy_scores["scores"]["latentsift"], dtype=float))
    for name in ("own", "proxy"):  # every reference is there or named missing with a reason, never replaced
        pre = s["runs"][name]["premise"]
        assert pre["ks"] == [str(k)] and set(pre["retention"]["latentsift"]) == {str(k)}
        for r in PREMISE_REFERENCES:
            assert (r in pre["references"]) != (r in pre["auc"]["missing_references"])


def test_the_confirmation_target_refuses_until_both_shards_hold_every_task(tmp_path):
    """`make confirm-0.5b` refuses in one line while the shards' folders hold fewer than the 164 tasks, and then
    exports, replays and runs the premise with its claims (the commands echoed by a stand-in for the CLI)."""
    import subprocess
    from pathlib import Path

    root, bin_ = Path(__file__).parents[1], tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "latentsift").write_text('#!/bin/sh\necho latentsift "$@"\n')
    (bin_ / "latentsift").chmod(0o755)
    (tmp_path / "stamp").touch()
    for s in (1, 2):
        (tmp_path / f"c-s{s}" / "tasks").mkdir(parents=True)
    args = ["make", "-s", "-C", str(root), "confirm-0.5b", f"STAMP={tmp_path / 'stamp'}", f"BIN={bin_}",
            f"CONFIRM={tmp_path / 'c'}", f"CONFIRM_DATA={tmp_path / 'data'}"]
    for i in range(163):
        (tmp_path / f"c-s{1 + i % 2}" / "tasks" / f"HumanEval_{i}.jsonl.gz").touch()
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode != 0 and "hold 163 of 164 finished tasks" in r.stderr.splitlines()[0] and not r.stdout
    (tmp_path / "c-s2" / "tasks" / "HumanEval_163.jsonl.gz").touch()
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [x.split()[1] for x in lines] == ["rollout", "extract", "premise"]
    assert lines[2].endswith(f"--states {tmp_path}/c-s1/states --states {tmp_path}/c-s2/states --proxy-states "
                             f"{tmp_path}/c-proxy --out {tmp_path}/c")
