"""``latentsift rollout``: the packaged SmolLM2-135M as a small agent on two HumanEval tasks, K = 2,
two turns, states captured online.

float32, so that online capture (decode steps, batched with padding) and replay (one prefill) agree
to the float32 tolerance of tests/test_states.py (measured ~5e-7 relative).
"""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from latentsift._core.io import WriterLock
from latentsift._core.validation import LatentSiftError
from latentsift.rollout.folder import STATES_DIR, TASKS_DIR, TRAJECTORIES, run_rollouts, task_file
from latentsift.cli import app
from latentsift.states.channel import render
from latentsift.states.online import Sampling, sample_token
from latentsift.rollout.agent import RolloutSettings, parse_reply, sample_seeds
from latentsift.states.states import replay
from latentsift.states.store import StateStore
from latentsift.trajectories.trajectory import load_jsonl

F32_TOL = 1e-4
SETTINGS = RolloutSettings(k=2, max_turns=2, max_new_tokens=24, seed=3)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def full_run(policy32, tasks, env, tmp_path_factory):
    out = tmp_path_factory.mktemp("rollout") / "run"
    report = run_rollouts(policy32, tasks, out, SETTINGS, run_examples=env[0], judge=env[1], run="t",
                          store_dtype="float32")
    return out, report


def _rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.model
def test_every_step_has_states_and_online_equals_replay(full_run, policy32, tasks, env):
    out, report = full_run
    trajs = load_jsonl(out / TRAJECTORIES)
    assert report.n_run == 2 and report.n_samples == 4 and len(trajs) == 4
    assert [t.instance_id for t in trajs] == [tasks[0].task_id] * 2 + [tasks[1].task_id] * 2
    store = StateStore(out / STATES_DIR).open()
    assert sorted(store.traj_ids()) == sorted(t.traj_id for t in trajs)
    states = store.load(dtype="float32")
    assert any(t.n_steps == 2 for t in trajs)             # some sample revised after the tool's report
    for t in trajs:
        assert t.meta["seed"] in sample_seeds(SETTINGS.seed, t.instance_id, SETTINGS.k)
        assert t.meta["policy"] == policy32.fingerprint.digest
        assert t.label is not None and t.tests["hidden_passed"] == t.label
        task = next(x for x in tasks if x.task_id == t.instance_id)
        if t.patch.strip():   # Stage 3's score: the submitted code's share of the docstring's examples, re-run here
            rep = env[0](task, [t.patch])[0]
            assert t.tests.get("examples_passed") == (rep.n_passed / rep.n_total if rep.n_total else None)
        # the label is the hidden tests' verdict on the submitted code, re-executed here
        assert env[1](next(x for x in tasks if x.task_id == t.instance_id), [t.patch])[0] == bool(t.label) \
            or not t.patch.strip()
        s = states[t.traj_id]
        assert set(s.step.tolist()) == set(range(t.n_steps))  # every step has states
        for i, step in enumerate(t.steps[:-1]):
            assert step.obs and step.meta["action"] == "run_examples"
            assert 1 in s.channel[s.step == i]                   # the observation the policy read
        assert t.steps[-1].meta["action"] == "submit" and not t.steps[-1].obs
        rep = replay(policy32, render(t, policy32.tokenizer))
        np.testing.assert_array_equal(s.step, rep.step)
        np.testing.assert_array_equal(s.channel, rep.channel)
        assert _rel(s.layers, rep.layers).max() <= F32_TOL
    assert store.settings["max_span_tokens"] is None and store.settings["capture"] == "online"
    assert report.n_generated > 0 and report.n_forward > report.n_generated


class _Killed(Exception):
    pass


@pytest.mark.model
def test_a_killed_run_resumes_without_duplicates_and_same_bytes(full_run, policy32, tasks, env, tmp_path):
    out = tmp_path / "run"

    def kill(task_id):
        raise _Killed(task_id)

    with pytest.raises(_Killed):
        run_rollouts(policy32, tasks, out, SETTINGS, run_examples=env[0], judge=env[1], run="t", on_task=kill,
                     store_dtype="float32")
    assert len(list((out / TASKS_DIR).iterdir())) == 1 and len(StateStore(out / STATES_DIR).open()) == 2
    # nothing finished is lost: the killed run's trajectory file holds the task it finished
    assert [t.instance_id for t in load_jsonl(out / TRAJECTORIES)] == [tasks[0].task_id] * 2
    with WriterLock(out / ".lock"), pytest.raises(LatentSiftError, match="Another process is writing"):
        run_rollouts(policy32, tasks, out, SETTINGS, run_examples=env[0], judge=env[1], run="t")
    report = run_rollouts(policy32, tasks, out, SETTINGS, run_examples=env[0], judge=env[1], run="t",
                          store_dtype="float32")
    assert report.n_skipped == 1 and report.n_run == 1
    ref, _ = full_run
    # same seeds, same model, same batch: the same bytes as the uninterrupted run
    assert (out / TRAJECTORIES).read_bytes() == (ref / TRAJECTORIES).read_bytes()
    for t in tasks:
        name = task_file(t.task_id)
        assert (out / TASKS_DIR / name).read_bytes() == (ref / TASKS_DIR / name).read_bytes()
    store = StateStore(out / STATES_DIR).open()
    assert len(store.traj_ids()) == len(set(store.traj_ids())) == 4
    a, b = store.load(), StateStore(ref / STATES_DIR).open().load()
    assert all(np.array_equal(a[k].layers, b[k].layers) for k in b)
    # a rerun does nothing; other settings are refused
    assert run_rollouts(policy32, tasks, out, SETTINGS, run_examples=env[0], judge=env[1], run="t",
                        store_dtype="float32").n_run == 0
    with pytest.raises(LatentSiftError, match="made with --seed 3; this call has 4; use the same"):
        run_rollouts(policy32, tasks, out, RolloutSettings(k=2, max_turns=2, max_new_tokens=24, seed=4),
                     run_examples=env[0], judge=env[1], run="t", store_dtype="float32")


def test_parse_reply_splits_reasoning_code_and_fences():
    text = "Plan: add.\n```python\ndef f(a, b):\n    return a + b\n```\nDone."
    cot, fn, parts = parse_reply(text)
    assert fn == "def f(a, b):\n    return a + b" and cot == "Plan: add.\n\nDone."
    assert sum(p[1] if p[0] != "markup" else len(p[1]) for p in parts) == len(text)
    assert parse_reply("no code")[:2] == ("no code", "")
    cut = parse_reply("x\n```python\ndef f():\n    ret")            # cut by the token limit: unclosed block
    assert cut[1] == "def f():\n    ret" and cut[0] == "x\n"


def test_sampling_is_seeded_per_sample():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    s = Sampling(temperature=0.8, top_p=0.9)
    draw = lambda seed: [sample_token(logits, s, g) for g in [torch.Generator().manual_seed(seed)] for _ in range(20)]
    assert draw(1) == draw(1) and draw(1) != draw(2)
    assert sample_token(logits, Sampling(temperature=0), None) == int(torch.argmax(logits))
    # the nucleus (found with topk, grown as needed) is the full sort's: the smallest top set of mass >= top_p
    flat = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 0.1    # a wide nucleus (> 64)
    sizes = []
    for lg, p in ((logits, 0.1), (flat, 0.5)):
        sp = torch.sort(torch.softmax(lg / 0.8, -1), descending=True).values
        size = int((torch.cumsum(sp, 0) - sp < p).sum())
        nucleus = set(torch.argsort(lg, descending=True)[:size].tolist())
        sizes.append(size)
        got = {sample_token(lg, Sampling(0.8, p), torch.Generator().manual_seed(i)) for i in range(300)}
        assert got <= nucleus and len(got) > 1
    assert min(sizes) < 64 < max(sizes)    # found in the first top-64, and after growing it
    assert sample_seeds(0, "HumanEval/0", 3) == sample_seeds(0, "HumanEval/0", 3)
    assert len(set(sample_seeds(0, "HumanEval/0", 3) + sample_seeds(0, "HumanEval/1", 3))) == 6


def _one_error(output: str, text: str) -> bool:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    return len(errors) == 1 and text in errors[0] and "Traceback" not in output


def test_cli_errors_are_one_line(tmp_path, tasks):
    good = tmp_path / "tasks.jsonl"
    good.write_text(json.dumps({"task_id": "T/0", "prompt": tasks[0].prompt, "entry_point": tasks[0].entry_point,
                                "test": tasks[0].test}) + "\n")
    runner = CliRunner()
    res = runner.invoke(app, ["rollout", str(good), "--out", str(tmp_path / "o"), "--model", str(tmp_path / "no.gguf")])
    assert res.exit_code == 2 and _one_error(res.output, "does not exist")
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(json.dumps({"task_id": "T/1", "prompt": "def f():\n"}) + "\n")
    res = runner.invoke(app, ["rollout", str(bad), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and _one_error(res.output, "bad.jsonl.gz")
    res = runner.invoke(app, ["rollout", str(good), "--out", str(tmp_path / "o3"), "--samples", "0"])
    assert res.exit_code == 2 and "--samples" in res.output
    res = runner.invoke(app, ["rollout", str(good), "--out", str(tmp_path / "o4"), "--shard", "3/2"])
    assert res.exit_code == 2 and _one_error(res.output, "--shard must be I/N")


@pytest.mark.model
def test_shard_folders_export_as_one_dataset(full_run, tasks, tmp_path):
    """Two folders that ran other tasks of the same settings (--shard 1/2, 2/2) export as the one folder
    that ran them all: the same bytes; overlapping or unlike folders are refused."""
    import shutil

    from latentsift._core.io import WriterLock
    from latentsift.rollout.folder import LOCK, MANIFEST, export_dataset

    ref, _ = full_run
    with WriterLock(ref / LOCK, what=ref):  # a rollout still writing the folder: refused, nothing written
        with pytest.raises(LatentSiftError, match="still being written by another process"):
            export_dataset(ref, tmp_path / "running")
    assert not (tmp_path / "running").exists()
    whole = export_dataset(ref, tmp_path / "whole")
    assert whole["n_tasks"] == 2 and whole["n_samples"] == 4 and whole["format"] == "latentsift-rollout-dataset"
    shards = []
    for i, t in enumerate(tasks):       # shard i holds task i only (as --shard i+1/2 runs them)
        d = tmp_path / f"shard{i}"
        shutil.copytree(ref, d, ignore=shutil.ignore_patterns(STATES_DIR))
        for other in tasks:
            if other is not t:
                (d / TASKS_DIR / task_file(other.task_id)).unlink()
        shards.append(d)
    export_dataset(shards[::-1], tmp_path / "merged")
    for name in (TRAJECTORIES, MANIFEST):
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    # a folder that ran another's remaining tasks from a task file of another name joins too (tasks are
    # matched by their samples, ordered by id, not by the file's name); the dataset names both files
    man = json.loads((shards[0] / MANIFEST).read_text())
    (shards[0] / MANIFEST).write_text(json.dumps(man | {"tasks": "rest.jsonl"}))
    tail = export_dataset(shards[::-1], tmp_path / "tail")
    assert (tmp_path / "tail" / TRAJECTORIES).read_bytes() == (tmp_path / "whole" / TRAJECTORIES).read_bytes()
    assert tail["tasks"] == sorted([man["tasks"], "rest.jsonl"]) and tail["n_samples"] == whole["n_samples"]
    (shards[0] / MANIFEST).write_text(json.dumps(man))
    # a task run in two folders alike counts once; run differently, it is refused
    export_dataset([shards[0], ref], tmp_path / "overlap")
    assert (tmp_path / "overlap" / TRAJECTORIES).read_bytes() == (tmp_path / "whole" / TRAJECTORIES).read_bytes()
    part = shards[0] / TASKS_DIR / task_file(tasks[0].task_id)
    with gzip.open(part, "rt") as f:
        rows = [json.loads(line) for line in f]
    rows[0]["reward"] = 1.0 - rows[0]["reward"]          # one sample labelled otherwise
    with gzip.open(part, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(LatentSiftError, match="different samples"):
        export_dataset([shards[0], ref], tmp_path / "differ")
    man = json.loads((shards[1] / MANIFEST).read_text())
    (shards[1] / MANIFEST).write_text(json.dumps(man | {"threads": 2}))
    with pytest.raises(LatentSiftError, match="another threads"):
        export_dataset(shards, tmp_path / "unlike")
    with pytest.raises(LatentSiftError, match="input"):   # never written inside its inputs
        export_dataset(shards[0], shards[0] / "data")


@pytest.mark.model
def test_a_run_killed_with_sigkill_resumes_to_the_same_bytes(full_run, tasks, tmp_path):
    """The real thing: ``latentsift rollout`` in its own process, SIGKILLed once its first task is saved (most
    likely while it generates the second), then run again: the same trajectory bytes as the uninterrupted
    run of the same settings, every sample stored once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    ref, _ = full_run
    task_file_ = tmp_path / "two.jsonl"
    task_file_.write_text("".join(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "entry_point": t.entry_point,
                                              "test": t.test}) + "\n" for t in tasks))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "latentsift.cli", "rollout", str(task_file_), "--out", str(out), "--run", "t",
           "--samples", str(SETTINGS.k), "--turns", str(SETTINGS.max_turns), "--max-new-tokens", str(SETTINGS.max_new_tokens),
           "--seed", str(SETTINGS.seed), "--dtype", "float32", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = out / TASKS_DIR / task_file(tasks[0].task_id)
    deadline = time.monotonic() + 600
    while not first.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert first.is_file()
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    for t in tasks:
        name = task_file(t.task_id)
        assert (out / TASKS_DIR / name).read_bytes() == (ref / TASKS_DIR / name).read_bytes()
    assert load_jsonl(out / TRAJECTORIES) == load_jsonl(ref / TRAJECTORIES)
    ids = StateStore(out / STATES_DIR).open().traj_ids()
    assert sorted(ids) == sorted(set(ids)) == sorted(t.traj_id for t in load_jsonl(ref / TRAJECTORIES))


def test_task_ids_sort_with_numbers_as_numbers():
    from latentsift.rollout.folder import natural_key

    ids = ["HumanEval/10", "HumanEval/2", "Mbpp/1", "HumanEval/100", "b", "a10", "a9", "HumanEval/0"]
    assert sorted(ids, key=natural_key) == ["HumanEval/0", "HumanEval/2", "HumanEval/10", "HumanEval/100",
                                            "Mbpp/1", "a9", "a10", "b"]
