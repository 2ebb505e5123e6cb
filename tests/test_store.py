"""State store: round trip, checksums, settings/model checks, atomicity, kill + resume."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from latentsift._core.validation import FingerprintMismatch, LatentSiftError
from latentsift.states.model import DEFAULT_GGUF_FILE, Fingerprint
from latentsift.states.states import TrajectoryStates
from latentsift.states.extract import ExtractionBackend, Extracted, extract_pools, extract_settings, resolve_layers
from latentsift.states.store import StateStore, encode_shard

FP = Fingerprint("TinyLM", n_layers=3, d_model=8, tokenizer_sha="t", template_sha="c", weights_sha="w",
                 dtype="float32")
SETTINGS = {"max_span_tokens": None, "max_prompt_tokens": None, "max_tokens": None, "context": 64,
            "layers": [1, 2, 3], "store_dtype": "float16"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _states(traj_id: str, n_spans: int, seed: int) -> TrajectoryStates:
    rng = np.random.default_rng(seed)
    return TrajectoryStates(traj_id=traj_id, layers=rng.normal(size=(n_spans, 3, 8)).astype(np.float32) * 10,
                            step=np.arange(n_spans, dtype=np.int32) // 3,
                            channel=(np.arange(n_spans) % 3).astype(np.int8), n_tokens=17 * n_spans)


def _fill(path: Path) -> StateStore:
    store = StateStore(path).create(FP, SETTINGS)
    store.write([_states("a/1", 4, 0), _states("a/2", 0, 1)], ["i1", "i1"])
    store.write([_states("b/1", 7, 2)], ["i2"])
    return store


def test_round_trip_and_index(tmp_path):
    _fill(tmp_path / "s")
    store = StateStore(tmp_path / "s").open()
    assert store.traj_ids() == ["a/1", "a/2", "b/1"] and len(store) == 3
    assert store.has("b/1") and not store.has("c/1")
    assert store.fingerprint == FP and store.settings == SETTINGS and store.layer_ids is None
    loaded = store.load()
    for tid, n, seed in (("a/1", 4, 0), ("a/2", 0, 1), ("b/1", 7, 2)):
        ref = _states(tid, n, seed)
        got = loaded[tid]
        assert got.layers.dtype == np.float32 and got.layers.shape == (n, 3, 8)
        np.testing.assert_array_equal(got.layers, ref.layers.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(got.step, ref.step)
        np.testing.assert_array_equal(got.channel, ref.channel)
        assert got.n_tokens == ref.n_tokens
    assert list(store.load(["b/1", "a/1"])) == ["b/1", "a/1"]
    assert store.load(["a/1"], dtype="float16")["a/1"].layers.dtype == np.float16
    # the Parquet index: one row per span
    table = pq.read_table(tmp_path / "s" / "index.parquet")
    assert table.num_rows == 11
    assert table.column_names == ["traj_id", "instance_id", "step", "channel", "shard", "row", "n_tokens"]
    rows = table.to_pylist()
    assert rows[0] == {"traj_id": "a/1", "instance_id": "i1", "step": 0, "channel": 0,
                       "shard": "shard-00000.safetensors", "row": 0, "n_tokens": 68}
    assert rows[4]["shard"] == "shard-00001.safetensors" and rows[4]["row"] == 0
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["fingerprint"]["digest"] == FP.digest and manifest["version"] == 1
    assert store.verify() == 2


def test_layer_major_states_round_trip(tmp_path):
    # replay accumulates (n_layers, n_spans, d_model) and hands out a transposed view: a single
    # trajectory's concatenation keeps that memory order, and safetensors writes memory as it lies
    ref = _states("t/1", 5, 3)
    view = np.ascontiguousarray(ref.layers.transpose(1, 0, 2)).transpose(1, 0, 2)
    assert not view.flags["C_CONTIGUOUS"]
    store = StateStore(tmp_path / "s").create(FP, SETTINGS)
    store.write([TrajectoryStates(traj_id="t/1", layers=view, step=ref.step, channel=ref.channel,
                                  n_tokens=ref.n_tokens)], ["i"])
    got = StateStore(tmp_path / "s").open().load()["t/1"].layers
    np.testing.assert_array_equal(got, ref.layers.astype(np.float16).astype(np.float32))


def test_corrupted_shard_is_detected(tmp_path):
    _fill(tmp_path / "s")
    shard = tmp_path / "s" / "shards" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    store = StateStore(tmp_path / "s").open()
    store.load(["a/1"])          # the intact shard still loads
    with pytest.raises(LatentSiftError, match=r"shard-00001\.safetensors is corrupted: sha256"):
        store.load()
    shard.unlink()
    with pytest.raises(LatentSiftError, match="is missing"):
        StateStore(tmp_path / "s").open().load(["b/1"])


def test_a_store_that_recorded_the_renderers_old_path_is_resumed(tmp_path):
    """A store records its renderer by module path; those written before the renderers moved recorded
    ``latentsift.channel.<name>``, which still names the same renderer (not another)."""
    from latentsift.states.channel import RENDER, RENDER_PER_STEP, renderer_id, renderer_of, render
    from latentsift.states.store import check_recorded_settings
    assert renderer_id(RENDER) == "latentsift.states.channel.render" and renderer_of(renderer_id(RENDER)) is render
    old = StateStore(tmp_path / "s").create(FP, {**SETTINGS, "renderer": "latentsift.channel.render"})
    assert renderer_of(old.settings["renderer"]) is render
    StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "renderer": renderer_id(RENDER)})
    check_recorded_settings({**SETTINGS, "renderer": renderer_id(RENDER)}, old, "A bank")
    with pytest.raises(LatentSiftError, match="renderer='latentsift.channel.render' \\(now 'latentsift.states"):
        StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "renderer": renderer_id(RENDER_PER_STEP)})
    with pytest.raises(LatentSiftError, match="renderer 'my.module.nope' is not registered"):
        renderer_of("my.module.nope")


def test_other_model_or_settings_is_an_error(tmp_path):
    _fill(tmp_path / "s")
    other = Fingerprint(**{**FP.__dict__, "weights_sha": "v"})
    with pytest.raises(FingerprintMismatch, match="weights_sha"):
        StateStore(tmp_path / "s").open_or_create(other, SETTINGS)
    with pytest.raises(LatentSiftError, match="max_span_tokens=None \\(now 64\\)"):
        StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "max_span_tokens": 64})
    # settings that do not change values (chunk size, shard size) may differ
    StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "chunk_tokens": 7})
    # a store written before 'patch_step_tokens' existed holds the default (None), nothing else
    StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "patch_step_tokens": None})
    with pytest.raises(LatentSiftError, match="patch_step_tokens=None \\(now 512\\)"):
        StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "patch_step_tokens": 512})
    with pytest.raises(LatentSiftError, match="already holds a state store"):
        StateStore(tmp_path / "s").create(FP, SETTINGS)
    with pytest.raises(LatentSiftError, match="not a state store"):
        StateStore(tmp_path / "nothing").open()


KERNELS = {"torch": "2.13.0+cpu", "device": "cpu", "forward_threads": 1, "cpu_capability": "AVX512",
           "avx512_bf16": True, "amx": False, "env": {}}


def test_a_resumed_store_refuses_another_dtype_or_other_kernels(tmp_path):
    StateStore(tmp_path / "s").create(FP, {**SETTINGS, "kernels": KERNELS, "dtype_reason": "set explicitly"})
    bf16 = Fingerprint(**{**FP.__dict__, "dtype": "bfloat16"})
    with pytest.raises(FingerprintMismatch) as e:  # the dtype is part of the fingerprint
        StateStore(tmp_path / "s").open_or_create(bf16, {**SETTINGS, "kernels": KERNELS, "dtype_reason": "AMX present"})
    assert str(e.value) == (f"The store {tmp_path / 's'} holds float32 states; this run computes bfloat16 "
                            "(AMX present). Pass --dtype float32 to resume it, or another --out.")
    for change, said in (({"cpu_capability": "AVX2"}, "cpu_capability='AVX512' (now 'AVX2')"),
                         ({"env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}, "env={} (now {'ONEDNN_MAX_CPU_ISA': 'AVX2'})"),
                         ({"torch": "2.14.0+cpu", "amx": True}, "amx=False (now True), torch='2.13.0+cpu' (now "
                                                                 "'2.14.0+cpu')")):
        with pytest.raises(LatentSiftError) as e:
            StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "kernels": KERNELS | change})
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"The store {tmp_path / 's'} was written with other kernels: ")
        assert said in msg and "would not be byte-identical" in msg
    # the same kernels (the dtype's reason may read differently: "cached in" on a later process) resume
    StateStore(tmp_path / "s").open_or_create(FP, {**SETTINGS, "kernels": dict(KERNELS), "dtype_reason": "other"})
    # a store written before the kernels were recorded is not checked for them
    _fill(tmp_path / "old")
    StateStore(tmp_path / "old").open_or_create(FP, {**SETTINGS, "kernels": KERNELS})


def test_write_rejects_duplicates_bad_shapes_and_non_finite(tmp_path):
    store = _fill(tmp_path / "s")
    with pytest.raises(LatentSiftError, match="already in the store"):
        store.write([_states("a/1", 2, 9)], ["i1"])
    with pytest.raises(LatentSiftError, match="shape"):
        store.write([TrajectoryStates("c/1", np.zeros((2, 2, 8), np.float32), np.zeros(2, np.int32),
                                      np.zeros(2, np.int8))], ["i3"])
    bad = _states("c/1", 2, 3)
    bad.layers[1, 0, 0] = np.nan
    with pytest.raises(LatentSiftError, match="NaN"):
        store.write([bad], ["i3"])
    big = _states("c/1", 2, 3)
    big.layers[0, 0, 0] = 1e6
    with pytest.raises(LatentSiftError, match="float16 range"):
        store.write([big], ["i3"])
    with pytest.raises(LatentSiftError, match="instance_ids"):
        store.write([_states("c/1", 2, 3)], [])
    assert StateStore(tmp_path / "s").open().traj_ids() == ["a/1", "a/2", "b/1"]


def test_kill_between_shard_and_index_leaves_consistent_store(tmp_path, monkeypatch):
    store = _fill(tmp_path / "s")

    def killed(self):
        raise KeyboardInterrupt("killed after the shard rename, before the index rename")

    monkeypatch.setattr(StateStore, "_write_index", killed)
    with pytest.raises(KeyboardInterrupt):
        store.write([_states("c/1", 3, 5)], ["i3"])
    monkeypatch.undo()
    orphan = tmp_path / "s" / "shards" / "shard-00002.safetensors"
    assert orphan.is_file()
    (tmp_path / "s" / "index.parquet.tmp123.456").write_bytes(b"half-written")
    reopened = StateStore(tmp_path / "s").open()
    assert not orphan.exists() and not (tmp_path / "s" / "index.parquet.tmp123.456").exists()
    assert reopened.traj_ids() == ["a/1", "a/2", "b/1"] and not reopened.has("c/1")
    assert reopened.write([_states("c/1", 3, 5)], ["i3"]) == "shard-00002.safetensors"
    assert reopened.verify() == 3


def test_layer_settings():
    assert resolve_layers("all", 4) == [1, 2, 3, 4]
    assert resolve_layers("final", 4) == [4]
    assert resolve_layers([4, 2], 4) == [2, 4]
    for bad in ([1, 2], [0, 4], "some"):
        with pytest.raises(LatentSiftError, match="'layers' parameter"):
            resolve_layers(bad, 4)


def test_writer_lock(tmp_path):
    store = _fill(tmp_path / "s")
    with store.lock():
        with pytest.raises(LatentSiftError, match="Another process"):
            with StateStore(tmp_path / "s").lock():
                pass
    with store.lock():
        pass


# ---------------------------------------------------------------------------------------------- model
EXTRACT_ARGS = {"max_span_tokens": 6, "max_prompt_tokens": 8, "shard_size": 2}

CHILD = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.set_num_threads(1)      # as the parent test: results must match bit for bit
    from latentsift.states.model import load_policy
    from latentsift.states.extract import extract_pools
    from latentsift.trajectories.trajectory import load_jsonl
    kill_after = int(sys.argv[3])
    def progress(p):
        if kill_after and p.done == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)      # die in the middle of a shard
    extract_pools(load_policy(), load_jsonl(sys.argv[1]), sys.argv[2], progress=progress, **{args})
""").replace("{args}", repr(EXTRACT_ARGS))


@pytest.fixture(scope="module")
def small_pools(tmp_path_factory, data_dir):
    from latentsift.trajectories.importers import import_paths
    from latentsift.trajectories.trajectory import save_jsonl

    trajs = import_paths(data_dir / "r2egym" / "acr-run-1.jsonl.gz").trajectories[:4]
    trajs += import_paths(data_dir / "sweagent" / "cost_2_2.tar.gz").trajectories[:3]
    path = tmp_path_factory.mktemp("pools") / "pools.jsonl"
    save_jsonl(trajs, path)
    return path, trajs


def _contents(path: Path) -> tuple:
    store = StateStore(path).open()
    states = store.load()
    shas = [s["sha256"] for s in store._shards]
    return store.traj_ids(), store.index().to_pylist(), states, shas


@pytest.mark.model
def test_killed_extract_resumes_to_the_same_store(tmp_path, small_pools, policy):
    pools, trajs = small_pools
    report = extract_pools(policy, trajs, tmp_path / "ref", **EXTRACT_ARGS)
    assert report.n_extracted == 7 and report.n_skipped == 0 and len(report.shards) == 4
    again = extract_pools(policy, trajs, tmp_path / "ref", **EXTRACT_ARGS)     # nothing left to do
    assert again.n_extracted == 0 and again.n_skipped == 7

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run = [sys.executable, str(script), str(pools), str(tmp_path / "resumed")]
    killed = subprocess.run(run + ["5"], capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    partial = StateStore(tmp_path / "resumed").open()
    assert partial.traj_ids() == [t.traj_id for t in trajs[:4]]     # two complete shards survived
    done = subprocess.run(run + ["0"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    ids_a, index_a, states_a, shas_a = _contents(tmp_path / "ref")
    ids_b, index_b, states_b, shas_b = _contents(tmp_path / "resumed")
    assert ids_a == ids_b == [t.traj_id for t in trajs]
    assert index_a == index_b
    for tid in ids_a:
        np.testing.assert_array_equal(states_a[tid].layers, states_b[tid].layers)
        np.testing.assert_array_equal(states_a[tid].step, states_b[tid].step)
    assert shas_a == shas_b                     # byte-identical shards
    assert not list((tmp_path / "resumed" / "shards").glob("*.tmp"))


@pytest.mark.model
def test_extract_pools_other_settings_is_an_error(tmp_path, small_pools, policy):
    _, trajs = small_pools
    extract_pools(policy, trajs[:1], tmp_path / "s", **EXTRACT_ARGS)
    with pytest.raises(LatentSiftError, match="other settings"):
        extract_pools(policy, trajs[:2], tmp_path / "s", **{**EXTRACT_ARGS, "max_span_tokens": 5})
    settings = extract_settings(policy, max_span_tokens=6, max_prompt_tokens=8)
    assert StateStore(tmp_path / "s").open().settings["context"] == settings["context"] == policy.context_length


@pytest.mark.model
def test_extract_records_the_kernels_and_refuses_to_resume_under_others(tmp_path, small_pools, policy, monkeypatch):
    """The manifest names what fixes the bytes (torch, ATen's capability, the bf16 units, ISA settings,
    the forward's thread count) and why the dtype was chosen; a resume under another dtype or ISA
    setting refuses with one line and leaves the store as it was."""
    import torch

    _, trajs = small_pools
    extract_pools(policy, trajs[:1], tmp_path / "s", **EXTRACT_ARGS)
    store = StateStore(tmp_path / "s").open()
    k = store.settings["kernels"]
    assert k["torch"] == torch.__version__ and k["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert k["forward_threads"] == 1 and k["device"] == "cpu" and isinstance(k["env"], dict)
    assert store.settings["dtype_reason"] == policy.dtype_choice.reason
    other = "float32" if policy.fingerprint.dtype == "bfloat16" else "bfloat16"
    # a policy of the other dtype (its fingerprint: the store refuses before any forward runs)
    relabelled = dataclasses.replace(policy, fingerprint=dataclasses.replace(policy.fingerprint, dtype=other))
    with pytest.raises(LatentSiftError, match=f"holds {policy.fingerprint.dtype} states; this run computes {other}"):
        extract_pools(relabelled, trajs[:2], tmp_path / "s", **EXTRACT_ARGS)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE" if k["env"].get("MKL_CBWR") != "COMPATIBLE" else "AVX2")
    with pytest.raises(LatentSiftError, match="other kernels: env=.* \\(now .*'MKL_CBWR': '"):
        extract_pools(policy, trajs[:2], tmp_path / "s", **EXTRACT_ARGS)
    assert StateStore(tmp_path / "s").open().traj_ids() == [trajs[0].traj_id]


@pytest.mark.model
def test_extract_cli(tmp_path, small_pools):
    pools, trajs = small_pools
    from typer.testing import CliRunner

    from latentsift.cli import app

    res = CliRunner().invoke(app, ["extract", str(pools), "--out", str(tmp_path / "s"), "--max-instances", "2",
                                   "--max-span-tokens", "6", "--max-prompt-tokens", "8", "--max-tokens", "200",
                                   "--layers", "final"])
    assert res.exit_code == 0, res.output
    store = StateStore(tmp_path / "s").open()
    # dtype "auto" resolved from this machine's hardware, said once, and recorded in the fingerprint
    from latentsift.states.model import cpu_dtype_choice
    choice = cpu_dtype_choice()
    assert store.fingerprint.dtype == choice.dtype
    said = " ".join(res.output.split())  # rich wraps long lines
    assert f"model: {DEFAULT_GGUF_FILE} on cpu, {choice.dtype} ({choice.reason})" in said
    # stdout is not a terminal here: progress comes as plain lines (first and final), with tok/s
    lines = [l for l in res.output.splitlines() if l.startswith("[extract]")]
    assert len(lines) >= 2 and "tok/s" in lines[-1] and "(100.0%)" in lines[-1], res.output
    first_two = sorted({t.instance_id for t in trajs})[:2]
    assert sorted(store.traj_ids()) == sorted(t.traj_id for t in trajs if t.instance_id in first_two)
    states = store.load()
    assert store.layer_ids == (30,)
    for s in states.values():
        assert s.layers.shape[1:] == (1, 576) and s.n_tokens <= 200 and s.layer_ids == (30,)


class _MadeUp(ExtractionBackend):
    """A backend without a model: made-up states, one shard per batch (the driver's contract alone)."""

    def __init__(self, fail_after: int | None = None):
        self.fail_after, self.closed, self.batches = fail_after, False, []

    def start(self, settings_kw):
        return FP, SETTINGS

    def run(self, store_path, todo, shard_size):
        for a in range(0, len(todo), shard_size):
            if self.fail_after is not None and len(self.batches) == self.fail_after:
                raise LatentSiftError("worker lost")
            batch = todo[a:a + shard_size]
            self.batches.append([t.traj_id for t in batch])
            states = [_states(t.traj_id, 2 + i, i) for i, t in enumerate(batch)]
            yield Extracted([t.traj_id for t in batch], tokens=sum(s.n_tokens for s in states),
                            shard=encode_shard(states, [t.instance_id for t in batch], FP, SETTINGS))

    def close(self):
        self.closed = True


def test_the_driver_commits_what_any_backend_yields_and_resumes(tmp_path):
    trajs = [SimpleNamespace(traj_id=f"r/{i}", instance_id=f"i{i // 2}") for i in range(5)]
    seen = []
    failing = _MadeUp(fail_after=1)
    with pytest.raises(LatentSiftError, match="worker lost"):
        extract_pools(failing, trajs, tmp_path / "s", shard_size=2, progress=seen.append)
    assert failing.closed and len(StateStore(tmp_path / "s").open()) == 2  # the committed batch stays
    assert [p.done for p in seen] == [0, 2]
    backend = _MadeUp()
    rep = extract_pools(backend, trajs, tmp_path / "s", shard_size=2)
    assert backend.closed and backend.batches == [["r/2", "r/3"], ["r/4"]]
    assert (rep.n_skipped, rep.n_extracted, rep.shards) == (2, 3, ["shard-00001.safetensors", "shard-00002.safetensors"])
    store = StateStore(tmp_path / "s").open()
    assert store.traj_ids() == [t.traj_id for t in trajs] and store.verify() == 3
    assert store.instance_of("r/4") == "i2" and rep.n_tokens == sum(t["n_tokens"] for t in store.trajectories()[2:])

