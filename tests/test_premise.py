"""The premise test on one policy's pools (``latentsift premise``, ``protocol.premise``) and the transfer of a
bank between two policies' pools with the shift guard's flags (``latentsift transfer --group-by instance``).

Synthetic states in real state stores for the structure (fast), and the packaged SmolLM2 on the tiny run's
pools for real states: two span settings of the same trajectories stand in for own and proxy.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import refused
from latentsift.cli import app
from latentsift.metrics.diagnostics import within_pool_auc
from latentsift.protocol.premise import PREMISE_REFERENCES, PREMISE_SCORES
from latentsift.sift.rules import EXAMPLES_PASSED, PURE_LENGTH
from latentsift._jobs.premise import premise
from latentsift.states.extract import extract_pools
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


def test_premise_section_compares_the_four_scores_with_the_seven_references(synthetic_premise):
    d, s, md = synthetic_premise
    pre = s["runs"]["own"]["premise"]
    assert pre["scores"] == list(PREMISE_SCORES) and pre["references"] == list(PREMISE_REFERENCES)
    assert pre["missing_scores"] == {} and pre["auc"]["missing_references"] == {}
    m = pre["multiplicity"]
    assert m["n_auc_intervals"] == 4 * 8 and m["bonferroni_level"] == pytest.approx(1 - 0.05 / 32)
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


def test_own_vs_proxy_pairs_the_same_candidates(synthetic_premise):
    d, s, md = synthetic_premise
    cmp = s["own_vs_proxy"]
    assert set(cmp["filters"]) == set(PREMISE_SCORES) and cmp["n_candidates"] == 128 and cmp["n_instances"] == 16
    for n, row in cmp["filters"].items():
        own = s["runs"]["own"]["premise"]["auc"]["scores"][n]["auc"]["auc"]
        proxy = s["runs"]["proxy"]["premise"]["auc"]["scores"][n]["auc"]["auc"]
        assert row["a"] == pytest.approx(own) and row["b"] == pytest.approx(proxy)
        assert row["estimate"] == pytest.approx(own - proxy)
        assert row["adjusted"]["level"] == pytest.approx(1 - 0.05 / 4)
    assert "## Own states" in md and "## Proxy states" in md and "## Own states against the proxy encoder" in md
    assert md.index("Rules (stated before the numbers)") < md.index("### Within-pool AUC")
    assert "### Best@K through the cascade" in md and "Final verifier: no verifier results given" in md
    own_md = (d / "out" / "own" / "report" / "report.md").read_text()
    assert "## The premise: own states against length" in own_md


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
def test_premise_on_real_states_of_two_span_settings(tiny_run, policy, tmp_path, one_torch_thread):
    """The tiny run's pools of one agent, its SmolLM2 states (spans of 8 tokens) as 'own' and a replay with
    spans of 4 tokens as 'proxy': the same candidates, the same folds, paired."""
    run, tiny = tiny_run["out"], tiny_run["settings"]
    trajs = load_jsonl(run / "pools.jsonl")
    agent = sorted({t.agent for t in trajs})[0]
    one = [t for t in trajs if t.agent == agent]
    save_jsonl(one, tmp_path / "pools.jsonl")
    extract_pools(policy, one, tmp_path / "proxy", max_span_tokens=4, max_prompt_tokens=tiny["max_prompt_tokens"])
    k = max(len([t for t in one if t.instance_id == i]) for i in {t.instance_id for t in one})
    out = premise(tmp_path / "pools.jsonl", run / "states", tmp_path / "out", proxy_states=tmp_path / "proxy",
                  ks=(k,), n_folds=2, n_draws=5, n_boot=50, scorer_epochs=tiny["scorer_epochs"], log=lambda m: None)
    s = json.loads((out / "summary.json").read_text())
    assert s["runs"]["own"]["composition"]["agents"] == [agent]
    assert s["runs"]["own"]["composition"]["group_by"] == "instance"
    own_fp, proxy_fp = s["runs"]["own"]["fingerprint"], s["runs"]["proxy"]["fingerprint"]
    assert own_fp["architecture"] == proxy_fp["architecture"]  # one model, two span settings
    cmp = s["own_vs_proxy"]
    assert cmp["n_candidates"] == len(one)
    for n, row in cmp["filters"].items():
        assert row["estimate"] == pytest.approx(row["a"] - row["b"])
    # the scores differ between the two stores (other spans, other states), the length rules do not
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
