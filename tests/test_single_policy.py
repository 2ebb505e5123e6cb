"""One policy, one repository (or none: HumanEval-like tasks), folds by task: what a team has.

``crossval --group-by instance`` on such data: the inner cross-validation of the stacked variants
splits the bank by instance too (so ``stack:length`` is fitted, not replaced), a reference that
cannot be fitted is reported as missing with its reason, and the report's words follow the data
(one agent's pools, a one-agent bank, the instance-held-out reference). Synthetic states written to
a real state store (``synthetic.write_single_policy``); the real ``crossval`` reads them.
"""
from __future__ import annotations

import json

import pytest

from latentsift.protocol import crossval
from synthetic import write_single_policy

CV = dict(group_by="instance", n_folds=2, n_draws=5, n_boot=50, scorer_epochs=2, log=lambda m: None)
WRONG = ("mixed agents", "two-agent", "repository-held-out", "inner repository folds")


@pytest.fixture(scope="module")
def one_policy(tmp_path_factory):
    d = tmp_path_factory.mktemp("one-policy")
    pools, states = write_single_policy(d / "data")
    report = crossval(pools, states, d / "cv", ks=(2, 4), **CV)
    return json.loads((report / "summary.json").read_text()), (report / "report.md").read_text()


def test_inner_cross_validation_splits_by_instance_and_fits_stack_length(one_policy):
    s, _ = one_policy
    folds = s["settings"]["meta"]["folds"]
    for f in folds:  # the bank's inner folds by instance: the choice has its evidence, no fallback
        assert f["variants"]["chosen_default"] != "latentsift (fallback)", f["variants"]
        assert "variant:stack:length" not in f["variants"].get("missing", {})
        assert set(f["variants"]["inner_cv_within_pool_auc"]) >= {"stack:length", "paper-distance"}
    auc = s["decision"]["auc"]
    assert "variant:stack:length" in auc["references"] and auc["missing_references"] == {}
    row = auc["scores"]["latentsift"]["vs"]["variant:stack:length"]
    # a fitted length stack orders candidates by length, not as the paper's method does: a real comparison
    assert (row["estimate"], row["lo"], row["hi"]) != (0.0, 0.0, 0.0)
    assert s["decision"]["multiplicity"]["n_auc_intervals"] == len(auc["scores"]) * 4


def test_the_words_follow_one_agent_one_repository_and_folds_by_instance(one_policy):
    s, md = one_policy
    assert s["composition"] == {"agents": ["policy-a"], "n_agents": 1, "n_repositories": 1, "n_instances": 16,
                                "group_by": "instance", "n_fold_groups": 16}
    verdict = "\n".join(s["verdict"])
    for w in WRONG:
        assert w not in verdict and w not in md, w
    assert "16 pools of one agent (policy-a)" in s["verdict"][0]
    assert "single-agent pools" not in s["verdict"][0]  # one agent: no second, identical set of pools
    assert s["verdict"][-1].startswith("- Shift guard (distance check, instance-held-out reference): "
                                       "one-agent (policy-a) bank false alarms ")
    assert s["single_agent"] == {"note": "one agent (policy-a) wrote every candidate: every pool is a single-agent "
                                         "pool, so the main tables are the single-agent tables"}
    assert "inner instance folds" in md and "scored by a bank without its instance" in md
    assert "One repository: there is no other repository to leave out" in md
    assert "held-out folds, same agent |" in md
    assert "Missing reference" not in md


def test_a_reference_that_cannot_be_fitted_is_reported_missing_not_replaced(tmp_path):
    """One task with both outcomes: no bank fold has the mixed pools a stacked fusion needs."""
    pools, states = write_single_policy(tmp_path / "data", n_instances=12, k=3, mixed=1)
    report = crossval(pools, states, tmp_path / "cv", ks=(2, 3), **CV)
    s = json.loads((report / "summary.json").read_text())
    md = (report / "report.md").read_text()
    missing = s["decision"]["auc"]["missing_references"]
    assert list(missing) == ["variant:stack:length"]
    assert "inner cross-validation impossible" in missing["variant:stack:length"]
    assert "variant:stack:length" not in s["decision"]["auc"]["references"]
    assert all("variant:stack:length" not in row["vs"] for row in s["decision"]["auc"]["scores"].values())
    # left out of every table, never the paper's method under its name
    assert "variant:stack:length" not in s["retention"] and "variant:stack:length" not in s["settings"]["filters"]
    assert s["settings"]["meta"]["folds"][0]["variants"]["chosen_default"] == "latentsift (fallback)"
    assert "Missing reference: variant:stack:length (fold " in s["verdict"][0]
    assert "vs variant:stack:length" not in "\n".join(s["verdict"])
    assert "Missing reference: variant:stack:length" in md and "no comparison with it is made" in md
    assert "missing" in s["decision"]["rules"]
