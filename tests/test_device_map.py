"""A policy split across devices (``load_policy(device_map=...)``, ``extract --device-map``): on a CPU the
split is forced with a memory limit, so that accelerate keeps the first layers on the CPU and offloads the
rest to the disk (their weights read in as each layer runs); the states equal the unsplit model's."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from latentsift.cli import app
from latentsift.states.channel import render
from latentsift.states.extract import LocalExtractionBackend, extract_pools
from latentsift.states.model import load_policy
from latentsift.states.states import replay
from latentsift.states.store import StateStore

from conftest import refused

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trajs(data_dir):
    from latentsift.trajectories.importers import import_paths

    return import_paths(data_dir / "r2egym" / "acr-run-1.jsonl.gz").trajectories[:2]


@pytest.mark.model
def test_a_model_split_over_cpu_and_disk_gives_the_unsplit_states(trajs, tmp_path):
    whole = load_policy(dtype="float32")
    split = load_policy(dtype="float32", device_map="auto", max_memory={"cpu": "300MB"})
    placed = split.model.hf_device_map
    assert set(placed.values()) == {"cpu", "disk"}, placed          # the limit forced a split
    assert placed["model.layers.0"] == "cpu" and placed[f"model.layers.{split.n_layers - 1}"] == "disk"
    assert split.fingerprint == whole.fingerprint and str(split.device) == "cpu"
    r = render(trajs[0], whole.tokenizer, max_span_tokens=8, max_prompt_tokens=16)
    a, b = replay(split, r), replay(whole, r)
    assert a.n_spans > 3
    np.testing.assert_array_equal(a.layers, b.layers)                 # float32, same kernels: the same bytes
    # the store path, on the other trajectory: extract through the split model, read back, equal to the
    # unsplit model's store
    kw = dict(max_span_tokens=8, max_prompt_tokens=16, store_dtype="float32")
    extract_pools(LocalExtractionBackend(split), trajs[1:], tmp_path / "split", **kw)
    extract_pools(whole, trajs[1:], tmp_path / "whole", **kw)
    got, want = StateStore(tmp_path / "split").open().load(), StateStore(tmp_path / "whole").open().load()
    assert sorted(got) == sorted(want) == [trajs[1].traj_id]
    for tid in want:
        np.testing.assert_array_equal(got[tid].layers, want[tid].layers)


def test_extract_refuses_a_bad_device_map_before_loading(tmp_path):
    pools = tmp_path / "pools.jsonl"
    pools.write_text("")
    runner = CliRunner()
    r = runner.invoke(app, ["extract", str(pools), "--out", str(tmp_path / "s"), "--device-map", "everywhere"])
    refused(r, "--device-map", "auto")
    r = runner.invoke(app, ["extract", str(pools), "--out", str(tmp_path / "s"), "--device-map", "auto",
                            "--device", "cpu"])
    refused(r, "--device-map auto", "--device cpu")
