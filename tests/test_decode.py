"""The rollout's decode layout (``latentsift.states.decode``) on the packaged SmolLM2-135M in float32: the
weights' values never change and come back as stored; a small real rollout run twice in a row gives the
same bytes (tokens and states); a folder records its layout and is resumed in it, one made before it was
recorded in the stored layout; folders of two layouts do not join one dataset."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import latentsift.rollout.folder as folder
from latentsift._core.validation import LatentSiftError
from latentsift.rollout.agent import RolloutSettings
from latentsift.rollout.folder import MANIFEST, STATES_DIR, TRAJECTORIES, export_dataset, run_rollouts
from latentsift.states.decode import (DECODE_LAYOUTS, IN_OUT_LAYOUT, PACKED_LAYOUT, STORED_LAYOUT, decode_layout_for,
                                      decode_weights)
from latentsift.states.store import StateStore

SETTINGS = RolloutSettings(k=3, max_turns=1, max_new_tokens=24, seed=5)

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.model]


def _run(policy, tasks, env, out, **kw):
    return run_rollouts(policy, tasks, out, SETTINGS, run_examples=env[0], judge=env[1], run="t",
                        store_dtype="float32", **kw)


def _state_bytes(out):
    states = StateStore(out / STATES_DIR).open().load(dtype="float32")
    return {k: (s.layers.tobytes(), s.step.tobytes(), s.channel.tobytes()) for k, s in states.items()}


@pytest.mark.parametrize("layout", [IN_OUT_LAYOUT, PACKED_LAYOUT])
def test_the_layout_keeps_the_values_and_is_undone(policy32, layout):
    if layout == PACKED_LAYOUT and not torch._C.has_mkl:
        pytest.skip("this torch has no MKL")
    lin = policy32.layers[0].mlp.up_proj
    head = policy32.model.get_output_embeddings()
    before = {n: p.detach().clone() for n, p in policy32.model.named_parameters()}
    x = torch.randn(SETTINGS.k, 1, policy32.d_model, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref_lin, ref_head = lin(x), head(x[:, 0])
        with decode_weights(policy32, layout, SETTINGS.k):
            assert lin.weight.t().is_contiguous() and not lin.weight.is_contiguous()   # (in, out) in memory
            assert ("forward" in head.__dict__) == (layout == PACKED_LAYOUT)
            got_lin, got_head = lin(x), head(x[:, 0])
            assert torch.equal(head(x[:2, 0]), head(x[:2, 0]))   # another row count: the stored weight
        after_lin, after_head = lin(x), head(x[:, 0])
    # the same products up to rounding inside; exactly the stored ones again after
    torch.testing.assert_close(got_lin, ref_lin, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_head, ref_head, rtol=1e-5, atol=1e-4)
    assert torch.equal(after_lin, ref_lin) and torch.equal(after_head, ref_head)
    assert lin.weight.is_contiguous() and "forward" not in head.__dict__
    assert all(torch.equal(p, before[n]) for n, p in policy32.model.named_parameters())


def test_a_bad_layout_is_refused(policy32):
    with pytest.raises(ValueError, match="'layout' parameter of decode_weights"):
        with decode_weights(policy32, "packed", 4):
            pass
    assert decode_layout_for(policy32) in DECODE_LAYOUTS
    from latentsift.states.model import load_policy
    bf16 = load_policy(dtype="bfloat16")
    assert decode_layout_for(bf16) == STORED_LAYOUT          # bfloat16 GEMMs: not measured, left as stored
    with pytest.raises(LatentSiftError, match="needs a CPU, float32 weights"):   # resumed in another dtype
        with decode_weights(bf16, IN_OUT_LAYOUT, 4):
            pass


def test_a_real_run_twice_in_a_row_gives_the_same_bytes(policy32, tasks, env, tmp_path, monkeypatch):
    """Same seed, same machine: the same sampled tokens and the same stored states, in the layout a new run
    takes (recorded in its manifest)."""
    used = []
    real = folder.decode_weights
    monkeypatch.setattr(folder, "decode_weights", lambda p, lay, rows: used.append((lay, rows)) or real(p, lay, rows))
    a, b = tmp_path / "a", tmp_path / "b"
    ra, rb = _run(policy32, tasks, env, a), _run(policy32, tasks, env, b)
    assert used == [(decode_layout_for(policy32), SETTINGS.k)] * 2
    assert ra.n_generated == rb.n_generated > 0
    assert json.loads((a / MANIFEST).read_text())["decode_layout"] == decode_layout_for(policy32)
    assert (a / TRAJECTORIES).read_bytes() == (b / TRAJECTORIES).read_bytes()
    assert _state_bytes(a) == _state_bytes(b)
    assert all(w.is_contiguous() for w in policy32.model.parameters())   # the stored layout again after


def test_an_old_folder_resumes_in_the_stored_layout(policy32, tasks, env, tmp_path, monkeypatch):
    """A folder whose manifest records no layout (made before it was recorded) runs its remaining tasks in
    the stored layout; a folder of another layout does not join its dataset."""
    used = []
    real = folder.decode_weights
    monkeypatch.setattr(folder, "decode_weights", lambda p, lay, rows: used.append(lay) or real(p, lay, rows))
    old = tmp_path / "old"
    monkeypatch.setattr(folder, "decode_layout_for", lambda p: STORED_LAYOUT)
    _run(policy32, tasks[:1], env, old)
    monkeypatch.undo()
    monkeypatch.setattr(folder, "decode_weights", lambda p, lay, rows: used.append(lay) or real(p, lay, rows))
    man = json.loads((old / MANIFEST).read_text())
    assert man.pop("decode_layout") == STORED_LAYOUT
    (old / MANIFEST).write_text(json.dumps(man))              # as a folder written before the field existed
    report = _run(policy32, tasks, env, old)                   # resumed: the second task runs now
    assert report.n_skipped == 1 and report.n_run == 1
    assert used == [STORED_LAYOUT, STORED_LAYOUT]
    assert "decode_layout" not in json.loads((old / MANIFEST).read_text())   # the folder's record is kept
    new = tmp_path / "new"
    _run(policy32, tasks[1:], env, new)                         # another task, the same settings, the new layout
    if decode_layout_for(policy32) != STORED_LAYOUT:
        with pytest.raises(LatentSiftError, match="another decode layout"):
            export_dataset([old, new], tmp_path / "data")
    np.testing.assert_equal(sorted(_state_bytes(old)), sorted(f"t/{t.task_id}/s{i:02d}" for t in tasks
                                                               for i in range(SETTINGS.k)))
