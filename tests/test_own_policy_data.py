"""The committed own-policy dataset (``data/own-policy/``): its labels come from executing the hidden tests.

A sample of each policy's committed candidates, passed and failed alike, is executed again in the sandbox
against HumanEval's hidden tests and must get the label the rollout recorded; the seeds, the policy
fingerprint and the pool sizes are those the dataset's manifest states; and the dataset is what
``latentsift rollout export`` makes of its rollout folders (rebuilt from it: the folders are not committed).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from typer.testing import CliRunner

from latentsift.cli import app
from latentsift.rollout.agent import sample_seeds, sample_traj_ids
from latentsift.rollout.execution import label_many
from latentsift.rollout.folder import gzip_bytes, task_file
from latentsift.rollout.tasks import load_tasks
from latentsift.trajectories.trajectory import dumps, load_jsonl

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


@pytest.mark.parametrize("name", POLICIES)
def test_the_dataset_re_exports_byte_for_byte(name, tmp_path):
    """Two shard folders rebuilt from the committed dataset (the odd and the even tasks: each task's file as
    the rollout wrote it, the manifest without the counts) export to the committed trajectories, byte for byte,
    and to its manifest; the datasets were made before a rollout recorded its tasks' digests, which the export
    now copies (an empty table for them; a later dataset's shard folders get their own tasks' digests)."""
    man = json.loads((DATA / name / "manifest.json").read_text())
    digests = man.get("task_digests", {})
    by_task: dict[str, list] = {}
    for t in load_jsonl(DATA / name / "trajectories.jsonl.gz"):
        by_task.setdefault(t.instance_id, []).append(t)
    folders = []
    for i in range(2):
        out = tmp_path / f"run-s{i}"
        (out / "tasks").mkdir(parents=True)
        mine = list(by_task)[i::2]
        (out / "manifest.json").write_text(json.dumps(
            {k: v for k, v in man.items() if not k.startswith("n_")}
            | {"format": "latentsift-rollout", "task_digests": {t: digests[t] for t in mine if t in digests}}))
        for task_id in mine:
            text = "".join(dumps(t) + "\n" for t in by_task[task_id])
            (out / "tasks" / task_file(task_id)).write_bytes(gzip_bytes(text))
        folders.append(out)
    dest = tmp_path / "dataset"
    r = CliRunner().invoke(app, ["rollout", "export", *map(str, folders), "--out", str(dest)])
    assert r.exit_code == 0, r.output
    assert f"{man['n_tasks']} tasks, {man['n_samples']} samples" in r.output
    assert (dest / "trajectories.jsonl.gz").read_bytes() == (DATA / name / "trajectories.jsonl.gz").read_bytes()
    assert json.loads((dest / "manifest.json").read_text()) == man | {"task_digests": man.get("task_digests", {})}
