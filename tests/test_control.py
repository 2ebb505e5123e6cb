"""The planted sensitivity control: the outcome written into the text must be seen by the paper's method.

Reuses the session's tiny end-to-end run (conftest ``tiny_run``): its pools are planted, extracted
with the tiny span settings, and cross-validated beside the original pools.
"""
import json

import pytest

from latentsift._core.validation import LatentSiftError
from latentsift.protocol.control import PLANTED, plant_outcome, plant_pools
from latentsift.protocol import crossval
from latentsift.states.extract import extract_pools
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl

pytestmark = pytest.mark.model


def test_plant_outcome_copies_and_writes_the_label(tiny_run):
    trajs = load_jsonl(tiny_run["out"] / "pools.jsonl")
    t = trajs[0]
    before = t.to_dict()
    p = plant_outcome(t)
    assert t.to_dict() == before  # the input is untouched
    text = PLANTED[int(t.label)]
    assert all(s.obs.startswith(text) for s in p.steps if s.obs)
    assert [s.obs[len(text):] for s in p.steps if s.obs] == [s.obs for s in t.steps if s.obs]
    last = plant_outcome(t, steps="last")
    assert sum(s.obs.startswith(text) for s in last.steps) == 1
    t.reward = None
    with pytest.raises(LatentSiftError, match="no label"):
        plant_outcome(t)


def test_the_paper_method_sees_a_planted_outcome(tiny_run, policy, tmp_path, one_torch_thread):
    run, tiny = tiny_run["out"], tiny_run["settings"]
    trajs = load_jsonl(run / "pools.jsonl")
    save_jsonl(plant_pools(trajs), tmp_path / "planted.jsonl")
    extract_pools(policy, load_jsonl(tmp_path / "planted.jsonl"), tmp_path / "states",
                  max_span_tokens=tiny["max_span_tokens"], max_prompt_tokens=tiny["max_prompt_tokens"])
    kw = dict(n_folds=tiny["n_folds"], ks=(2,), n_draws=10, n_boot=50, scorer_epochs=tiny["scorer_epochs"],
              variants=False, agent_transfer=False, log=lambda m: None)
    # the original pools' scores are the tiny run's own: its Stage 1 is this protocol on the same folds, banks
    # and seeded scorer (the Ks, the verifier and agent transfer change no score), so it is not run again
    summaries = {"original": json.loads(tiny_run["summary"]),
                 "planted": json.loads((crossval(tmp_path / "planted.jsonl", tmp_path / "states", tmp_path / "planted",
                                                 **kw) / "summary.json").read_text())}
    auc = {}
    for name, summary in summaries.items():
        scores = summary["selection"]["diagnostics"]["scores"]
        auc[name] = {f: scores[f]["auc"]["auc"] for f in ("latentsift", "shortest_chars", "branch:distance")}
    # the paper's method ranks planted resolved candidates above planted unresolved ones more often
    assert auc["planted"]["latentsift"] > auc["original"]["latentsift"]
    assert auc["planted"]["branch:distance"] > auc["original"]["branch:distance"]
    # the planted sentences have the same form for both outcomes: the length rule barely moves
    assert abs(auc["planted"]["shortest_chars"] - auc["original"]["shortest_chars"]) < 0.1
