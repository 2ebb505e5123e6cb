"""The committed own-policy dataset (``data/own-policy/``): its labels come from executing the hidden tests.

A sample of each policy's committed candidates, passed and failed alike, is executed again in the sandbox
against HumanEval's hidden tests and must get the label the rollout recorded; the seeds, the policy
fingerprint and the pool sizes are those the dataset's manifest states.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from latentsift.states.rollout import sample_seeds, sample_traj_ids
from latentsift.trajectories.execution import label_many
from latentsift.trajectories.tasks import load_tasks
from latentsift.trajectories.trajectory import load_jsonl

DATA = Path(__file__).resolve().parents[1] / "data" / "own-policy"
POLICIES = sorted(p.parent.name for p in DATA.glob("*/trajectories.jsonl.gz"))
PER_LABEL = 6          # candidates re-executed per label and policy


def test_the_dataset_is_committed():
    assert POLICIES, f"no own-policy dataset under {DATA}"


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in load_tasks()}


@pytest.mark.parametrize("name", POLICIES)
def test_committed_pools_match_their_manifest(name, tasks):
    man = json.loads((DATA / name / "manifest.json").read_text())
    trajs = load_jsonl(DATA / name / "trajectories.jsonl.gz")
    k, seed, run = man["settings"]["k"], man["settings"]["seed"], man["run"]
    per_task = Counter(t.instance_id for t in trajs)
    assert set(per_task.values()) == {k} and len(per_task) == man["n_tasks"] and len(trajs) == man["n_samples"]
    assert sum(t.label for t in trajs) == man["n_passed"]
    for task_id in per_task:
        assert task_id in tasks
        pool = [t for t in trajs if t.instance_id == task_id]
        assert [t.traj_id for t in pool] == sample_traj_ids(run, task_id, k)
        assert [t.meta["seed"] for t in pool] == sample_seeds(seed, task_id, k)
        assert {t.meta["policy"] for t in pool} == {man["fingerprint"]["digest"]}
        assert all(t.tests["hidden_passed"] == t.label and set(t.tests) <= {"hidden_passed", "examples_passed"}
                   for t in pool)


@pytest.mark.parametrize("name", POLICIES)
def test_a_sample_of_committed_candidates_gets_the_same_labels_again(name, tasks):
    trajs = [t for t in load_jsonl(DATA / name / "trajectories.jsonl.gz") if t.patch.strip()]
    rng = np.random.default_rng(0)
    sample = []
    for lab in (0, 1):
        group = [t for t in trajs if t.label == lab]
        sample += [group[i] for i in rng.choice(len(group), min(PER_LABEL, len(group)), replace=False)]
    assert {t.label for t in sample} == {0, 1}       # both labels are checked
    results = label_many([(tasks[t.instance_id], t.patch) for t in sample])
    assert [int(r.passed) for r in results] == [t.label for t in sample]
