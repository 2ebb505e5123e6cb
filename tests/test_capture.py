"""Capture inside a batched transformers ``generate`` (``states.capture.BatchRecorder``): K samples in one
left-padded batch, finished samples fed pads and leaving the batch, states equal to a replay of the same
tokens (float32, 1e-4 relative), written to a state store; and the shipped example runs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from latentsift._core.validation import LatentSiftError
from latentsift.states import BatchRecorder, StateStore, load_policy, replay
from latentsift.states.states import has_hooks

ROOT = Path(__file__).resolve().parents[1]
F32_TOL = 1e-4

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def policy32():
    return load_policy(dtype="float32")


def _rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def _agrees_with_replay(policy, rec, r):
    online, again = rec.states(r), replay(policy, rec.rendering(r))
    np.testing.assert_array_equal(online.step, again.step)
    np.testing.assert_array_equal(online.channel, again.channel)
    assert online.n_spans > 0 and _rel(online.layers, again.layers).max() <= F32_TOL
    return online


def _enc(policy, text):
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


PROMPTS = ["<|im_start|>user\nFix add() in math.py.<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>system\nYou are a careful coding agent.<|im_end|>\n<|im_start|>user\nWhy does "
           "test_greet fail? It expects 'Hello, Ann!'.<|im_end|>\n<|im_start|>assistant\n"]


def test_the_example_captures_four_samples_into_a_store(policy32, tmp_path):
    spec = importlib.util.spec_from_file_location("capture_generate", ROOT / "examples" / "capture_generate.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    lines = []
    got = example.main(tmp_path / "run", max_new_tokens=6, policy=policy32, log=lines.append)
    rec, store = got["recorder"], StateStore(tmp_path / "run" / "states").open()
    assert rec.k == 4 and got["worst"] <= F32_TOL
    assert str(tmp_path / "run" / "states") in lines[-1]
    assert lines[0].startswith("turn 0: samples [0, 1, 2, 3]") and lines[1].startswith("turn 1: samples [1, 3]")
    loaded = store.load()
    assert sorted(loaded) == sorted(rec.traj_ids) and store.settings["capture"] == "online"
    assert [store.instance_of(t) for t in rec.traj_ids] == ["toy__add", "toy__add", "toy__greet", "toy__greet"]
    for r in range(rec.k):
        online = _agrees_with_replay(policy32, rec, r)
        assert rec.rendering(r).n_steps == example.TURNS[r]                  # samples 0 and 2 left after one turn
        assert _rel(loaded[rec.traj_ids[r]].layers, online.layers).max() <= 1e-3   # the store's float16
    assert not has_hooks(policy32)


def test_a_sample_that_stops_is_fed_pads_that_are_never_pooled(policy32):
    """Greedy, so the tokens are known: the stop id is a token sample 0 writes early and sample 1 never,
    so sample 0 stops while sample 1 goes on and generate feeds sample 0 pads; both samples' states equal
    a replay."""
    prompts = [_enc(policy32, p) for p in PROMPTS]
    assert len(prompts[0]) != len(prompts[1])                                # left padding
    free = BatchRecorder(policy32, ["a", "b"])
    for r, p in enumerate(prompts):
        free.extend(r, p)
    with torch.inference_mode():
        out = policy32.model.generate(**free.inputs(), max_new_tokens=8, do_sample=False, pad_token_id=free.pad_id)
    first = out[:, free._width:].tolist()
    j = next(j for j in range(2, 6) if first[0][j] not in first[0][:j] + first[1][:7])
    stop = first[0][j]                                                        # only sample 0 writes it, at j
    rec = BatchRecorder(policy32, ["a", "b"], stop_ids=[stop])
    for r, p in enumerate(prompts):
        rec.extend(r, p[:4], -1, "excluded")
        rec.extend(r, p[4:-3], 0, "obs")                                      # any labels: replay gets the same
        rec.extend(r, p[-3:])
    with rec, torch.inference_mode():
        batch = rec.inputs()
        assert (batch["attention_mask"] == 0).any()
        out = policy32.model.generate(**batch, max_new_tokens=8, do_sample=False, eos_token_id=stop,
                                      pad_token_id=rec.pad_id)
        new = rec.new_tokens(out)
        assert len(new[0]) == j + 1 and new[0][-1] == stop
        assert len(new[1]) == out.shape[1] - batch["input_ids"].shape[1] == 8
        assert len(rec._seen[0]) == len(prompts[0]) + 7                       # pads run after its stop ...
        obs = _enc(policy32, "<|im_end|>\n<|im_start|>user\nok<|im_end|>\n")
        kept = [new[0][:-1], new[1]]       # sample 0's stop token is not kept: it and the pads after it go
        for r in range(2):
            half = len(kept[r]) // 2
            rec.extend(r, kept[r], 1, ["cot"] * half + ["fn"] * (len(kept[r]) - half))
            rec.extend(r, obs, 1, "obs")
        with pytest.raises(LatentSiftError, match="flush"):
            rec.states(1)
        rec.flush()
    assert len(rec._seen[0]) == len(rec._ids[0])                              # ... dropped: the observation differs
    for r in range(2):
        st = _agrees_with_replay(policy32, rec, r)
        assert st.n_tokens == len(prompts[r]) + len(kept[r]) + len(obs) and set(st.channel) == {0, 1, 2}
    assert not has_hooks(policy32)


def test_the_recorder_refuses_what_it_cannot_attribute(policy32):
    rec = BatchRecorder(policy32, ["a", "b"])
    rec.extend(0, [1, 2, 3], 0, "cot")
    rec.extend(1, [4, 5], 0, "cot")
    with rec, torch.inference_mode():
        batch = rec.inputs()
        with pytest.raises(LatentSiftError, match="2 samples"):
            policy32.base(input_ids=batch["input_ids"][:1])
        with pytest.raises(LatentSiftError, match="position_ids"):
            policy32.base(**batch)                                            # padded, positions by column
    assert not has_hooks(policy32)
    with pytest.raises(LatentSiftError, match="flush"):
        rec.states(0)
    with pytest.raises(LatentSiftError, match="'channel'"):
        rec.extend(0, [6], 1, "thoughts")
    with pytest.raises(LatentSiftError, match="'traj_ids'"):
        BatchRecorder(policy32, ["a", "a"])
