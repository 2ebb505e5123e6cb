"""The learned branch: the gated head's equations, training, determinism, persistence."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from latentsift import FingerprintMismatch, LatentSiftError, NotFittedError
from latentsift.states.model import Fingerprint
from latentsift.sift.scorer import LinearScorer, fit_once, gated_logits, span_outputs
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID

L, D = 3, 8
FP = Fingerprint("TestArch", L, D, "tok", "tpl", "w", "float32")


def make(tid, rng, y, *, n_steps=4, signal=1.0):
    """cot/obs/fn spans per step; the label moves the model-authored spans along a fixed direction."""
    steps, chans = [], []
    for t in range(n_steps):
        for c in ("cot", "obs", "fn"):
            steps.append(t)
            chans.append(CHANNEL_ID[c])
    layers = rng.standard_normal((len(steps), L, D)).astype(np.float32)
    direction = np.linspace(-1, 1, L * D).reshape(L, D).astype(np.float32)
    model = np.array(chans) != CHANNEL_ID["obs"]
    layers[model] += np.float32(signal * (1 if y else -1)) * direction
    layers[~model] += np.float32(5.0 * (1 if y else -1)) * direction  # observations must be ignored
    return TrajectoryStates(tid, layers, np.array(steps, np.int32), np.array(chans, np.int8), n_tokens=50)


def dataset(n=60, seed=0, signal=1.0):
    rng = np.random.default_rng(seed)
    states = [make(f"t{i:03d}", rng, i % 3 == 0, n_steps=2 + i % 5, signal=signal) for i in range(n)]
    labels = {s.traj_id: int(i % 3 == 0) for i, s in enumerate(states)}
    return states, labels


def reference_q(W, b, s: TrajectoryStates) -> float:
    """Eq. linear-head/linear-scorer with the concatenated vector formed explicitly (test only)."""
    u = s.layers[s.channel != CHANNEL_ID["obs"]].astype(np.float64)
    Wc = np.concatenate([W[l].T for l in range(W.shape[0])], axis=1)  # (2, L*d)
    out = u.reshape(len(u), -1) @ Wc.T + b
    a = 1 / (1 + np.exp(-out[:, 0]))
    return float((a * out[:, 1]).sum() / max(a.sum(), 1e-8))


def test_head_equals_the_concatenated_formula():
    rng = np.random.default_rng(0)
    states, _ = dataset(8)
    W = rng.standard_normal((L, D, 2)).astype(np.float32) * 0.1
    b = np.array([0.3, -0.2], np.float32)
    u = torch.from_numpy(np.concatenate([s.scorer_states() for s in states]))
    owner = torch.from_numpy(np.repeat(np.arange(8), [s.scorer_mask().sum() for s in states]))
    q = gated_logits(span_outputs(u, torch.from_numpy(W), torch.from_numpy(b)), owner, 8).numpy()
    np.testing.assert_allclose(q, [reference_q(W, b, s) for s in states], rtol=1e-5, atol=1e-5)
    # no model-authored span: the numerator is empty, q = 0 / 1e-8 = 0
    assert gated_logits(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), 1).item() == 0.0


def test_fit_learns_and_keeps_the_best_validation_checkpoint():
    states, labels = dataset()
    sc = LinearScorer(lr=3e-3, max_epochs=15).fit(states, labels, fingerprint=FP)
    h = sc.history_
    assert [e["epoch"] for e in h] == list(range(16))
    val = [e["val_loss"] for e in h[1:]]
    assert sc.best_epoch_ == 1 + int(np.argmin(val))
    assert h[-1]["train_loss"] < 0.5 * h[0]["train_loss"]
    assert len(sc.val_ids_) == 12 and len(sc.train_ids_) == 48 and not set(sc.val_ids_) & set(sc.train_ids_)
    q = sc.decision_function(states)
    y = np.array([labels[s.traj_id] for s in states])
    assert q[y == 1].min() > q[y == 0].max()  # separable by construction
    np.testing.assert_allclose(q, [reference_q(sc.W_, sc.b_, s) for s in states], rtol=1e-4, atol=1e-4)


def test_zero_init_starts_at_the_base_rate_and_defaults_follow_the_paper():
    states, labels = dataset()
    sc = LinearScorer(max_epochs=2).fit(states, labels)
    p = np.mean([labels[t] for t in sc.train_ids_])
    base = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    assert sc.history_[0]["train_loss"] == pytest.approx(base, rel=1e-5)
    assert sc.get_params() | {"max_epochs": 40} == {"lr": 3e-6, "weight_decay": 1e-5, "accumulation": 16,
                                                     "max_epochs": 40, "val_frac": 0.2, "seed": 0,
                                                     "init": "zeros", "patience": None, "train_loss": True}


def test_training_is_deterministic_and_order_independent():
    states, labels = dataset()
    a = LinearScorer(lr=1e-3, max_epochs=4, init="torch").fit(states, labels)
    b = LinearScorer(lr=1e-3, max_epochs=4, init="torch").fit(list(reversed(states)), labels)
    np.testing.assert_array_equal(a.W_, b.W_)
    np.testing.assert_array_equal(a.b_, b.b_)
    assert [e["val_loss"] for e in a.history_] == [e["val_loss"] for e in b.history_]
    c = LinearScorer(lr=1e-3, max_epochs=4, init="torch", seed=1).fit(states, labels)
    assert not np.array_equal(a.W_, c.W_)


def test_fit_once_returns_the_fit_of_identical_inputs_and_refits_other_ones():
    """A run's memo of fits (``fit_once``): an identical call (settings given in full or by their defaults, groups,
    fingerprint) is the first fit, whose weights a fresh fit has bit for bit; other settings, labels or states of
    other token counts (another representation of the same model) are fitted anew."""
    states, labels = dataset()
    by_id = {s.traj_id: s for s in states}
    groups = {t: f"g{i % 4}" for i, t in enumerate(sorted(labels))}
    fits: dict = {}
    params = {"lr": 1e-3, "max_epochs": 3, "train_loss": False}
    a = fit_once(fits, params, by_id, labels, fingerprint=FP, groups=groups)
    assert fit_once(fits, LinearScorer(**params).get_params(), by_id, dict(reversed(labels.items())),
                    fingerprint=FP.to_dict(), groups=groups) is a
    fresh = LinearScorer(**params).fit(states, labels, fingerprint=FP, groups=groups)
    np.testing.assert_array_equal(a.W_, fresh.W_)
    np.testing.assert_array_equal(a.b_, fresh.b_)
    other_states = {t: TrajectoryStates(t, s.layers + 1, s.step, s.channel, n_tokens=s.n_tokens + 1)
                    for t, s in by_id.items()}
    flipped = dict(labels, t000=1 - labels["t000"])
    others = [fit_once(fits, params | {"seed": 1}, by_id, labels, fingerprint=FP, groups=groups),
              fit_once(fits, params, by_id, flipped, fingerprint=FP, groups=groups),
              fit_once(fits, params, by_id, labels, fingerprint=FP),
              fit_once(fits, params, other_states, labels, fingerprint=FP, groups=groups)]
    assert all(o is not a for o in others) and len(fits) == 5
    assert not np.array_equal(others[-1].W_, a.W_)
    assert fit_once(None, params, by_id, labels, fingerprint=FP, groups=groups) is not a


def test_without_the_training_loss_the_fit_is_the_same(tmp_path):
    """``train_loss=False`` (the protocol's fits) skips the training set's loss pass; the weights,
    the validation losses and the kept epoch are the same, the history's train_loss is None."""
    states, labels = dataset()
    a = LinearScorer(lr=1e-3, max_epochs=4, init="torch").fit(states, labels)
    b = LinearScorer(lr=1e-3, max_epochs=4, init="torch", train_loss=False).fit(states, labels)
    np.testing.assert_array_equal(a.W_, b.W_)
    assert [e["val_loss"] for e in a.history_] == [e["val_loss"] for e in b.history_]
    assert a.best_epoch_ == b.best_epoch_ and all(e["train_loss"] > 0 for e in a.history_)
    assert all(e["train_loss"] is None for e in b.history_)
    b.save(tmp_path / "s")  # its curve has the validation line only
    back = LinearScorer.load(tmp_path / "s")
    assert back.get_params()["train_loss"] is False and back.history_ == b.history_
    with pytest.raises(LatentSiftError, match="'train_loss' parameter"):
        LinearScorer(train_loss="no").fit(states, labels)


def test_save_load_plot(tmp_path):
    states, labels = dataset()
    sc = LinearScorer(lr=1e-3, max_epochs=3).fit(states, labels, fingerprint=FP)
    sc.save(tmp_path / "s", source={"bank": "b"})
    meta = json.loads((tmp_path / "s" / "scorer.json").read_text())
    assert meta["settings"]["lr"] == 1e-3 and len(meta["history"]) == 4 and meta["source"] == {"bank": "b"}
    png = (tmp_path / "s" / "training_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    back = LinearScorer.load(tmp_path / "s")
    np.testing.assert_array_equal(back.decision_function(states), sc.decision_function(states))
    assert back.fingerprint_ == FP and back.best_epoch_ == sc.best_epoch_
    back.check_fingerprint(FP)
    with pytest.raises(FingerprintMismatch):
        back.check_fingerprint(Fingerprint("TestArch", L, D, "tok", "tpl", "w2", "float32"))
    (tmp_path / "s" / "scorer.safetensors").write_bytes(b"x" + (tmp_path / "s" / "scorer.safetensors").read_bytes())
    with pytest.raises(LatentSiftError, match="checksum"):
        LinearScorer.load(tmp_path / "s")


def test_errors():
    states, labels = dataset(10)
    with pytest.raises(NotFittedError):
        LinearScorer().decision_function(states)
    with pytest.raises(LatentSiftError, match="'lr' parameter of LinearScorer must be a positive float"):
        LinearScorer(lr=0).fit(states, labels)
    with pytest.raises(LatentSiftError, match="'val_frac' parameter"):
        LinearScorer(val_frac=1.0).fit(states, labels)
    with pytest.raises(LatentSiftError, match="no label for"):
        LinearScorer().fit(states, {})
    with pytest.raises(LatentSiftError, match="must hold 0 or 1"):
        LinearScorer().fit(states, {s.traj_id: 2 for s in states})
    sc = LinearScorer(max_epochs=1).fit(states, labels)
    s = states[0]
    other = TrajectoryStates("x", s.layers[:, :2], s.step, s.channel)
    with pytest.raises(LatentSiftError, match="another model or layer selection"):
        sc.decision_function([other])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_packed_span_states_are_each_trajectorys_model_authored_spans_in_order(dtype):
    from latentsift.sift.scorer import _Packed
    from latentsift.states.states import TrajectoryStates
    from latentsift.trajectories.trajectory import CHANNEL_ID

    rng = np.random.default_rng(4)
    sts = []
    for i, n in enumerate([5, 1, 0, 7]):
        chans = rng.choice([CHANNEL_ID["cot"], CHANNEL_ID["obs"], CHANNEL_ID["fn"]], n).astype(np.int8)
        if i == 1:
            chans[:] = CHANNEL_ID["obs"]  # no model-authored span at all
        layers = rng.standard_normal((n, 3, 4)).astype(dtype)
        sts.append(TrajectoryStates(f"t{i}", layers, np.arange(n, dtype=np.int32), chans, n_tokens=10))
    p = _Packed(sts)
    want = np.concatenate([s.layers[s.channel != CHANNEL_ID["obs"]].astype(np.float32) for s in sts])
    assert p.u.dtype == torch.float32 and np.array_equal(p.u.numpy(), want)
    assert p.sizes.tolist() == [int((s.channel != CHANNEL_ID["obs"]).sum()) for s in sts]
    assert p.offsets.tolist() == [0, *np.cumsum(p.sizes).tolist()]


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_products_and_weight_gradient_equal_autograd_bit_for_bit(workers):
    """Training computes the head's products and their weight gradient in one-thread workers and lets
    autograd do the rest; the result must be autograd's through span_outputs, bit for bit, for a
    contiguous run, scattered trajectories and one trajectory (the sizes of the packaged model)."""
    from latentsift._core.threads import fixed_threads, one_thread_pool
    from latentsift.sift.scorer import _Packed
    from latentsift.sift.head_products import _products, _weight_grad

    rng = np.random.default_rng(7)
    Lm, Dm = 30, 576
    sts = []
    for i in range(24):
        n = 3 + i % 9
        chans = np.array([CHANNEL_ID[c] for c in ("cot", "obs", "fn")] * n, np.int8)
        layers = (3 * rng.standard_normal((3 * n, Lm, Dm))).astype(np.float32)
        sts.append(TrajectoryStates(f"t{i:02d}", layers, np.repeat(np.arange(n, dtype=np.int32), 3), chans))
    W0 = torch.from_numpy((1e-3 * rng.standard_normal((Lm, Dm, 2))).astype(np.float32))
    b0 = torch.tensor([0.1, -0.2])
    y = torch.from_numpy((np.arange(24) % 2).astype(np.float32))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    with fixed_threads(), one_thread_pool(workers) as pool:
        packed = _Packed(sts, pool)
        for idx in (np.arange(4, 20), np.array([0, 3, 5, 6, 11, 17, 18, 23]), np.array([9])):
            W, b = torch.nn.Parameter(W0.clone()), torch.nn.Parameter(b0.clone())
            out, own = packed.outputs(idx, W, b)
            bce(gated_logits(out, own, len(idx)), y[idx]).backward()
            blocks = packed.blocks(idx)
            b2 = torch.nn.Parameter(b0.clone())
            prod = _products(W0.permute(2, 0, 1).reshape(2, Lm * Dm), blocks, pool).requires_grad_()
            bce(gated_logits(prod + b2, packed.owner(idx), len(idx)), y[idx]).backward()
            grad = _weight_grad(prod.grad, blocks, pool).view(2, Lm, Dm).permute(1, 2, 0)
            assert torch.equal(prod.detach() + b0, out.detach())
            assert torch.equal(grad, W.grad) and torch.equal(b2.grad, b.grad)


def test_weight_gradient_orientation_keeps_autograd_bits_beyond_the_probe():
    """The weight gradient's faster orientation is used only where the probe found it equal to the
    product's backward; on shapes the probe never tried (other span counts and widths, scaled data)
    the chosen orientation must still give autograd's bits through the head's own product (on AVX2
    kernels the probe keeps autograd's orientation)."""
    from latentsift._core.threads import fixed_threads
    from latentsift.sift.head_products import GRAD_PROBE_SHAPES, _block_product, _flat_weights, _grad_term, _rows_exact

    gen = torch.Generator().manual_seed(11)
    rows = _rows_exact()
    shapes = [(n, layers) for n in (2, 5, 33, 64, 129, 300, 511, 777) for layers in (1, 4, 30)]
    assert not {(n, 576 * layers) for n, layers in shapes} & set(GRAD_PROBE_SHAPES)
    with fixed_threads():
        for n, layers in shapes:
            x = torch.randn(n, layers, 576, generator=gen) * torch.rand(n, 1, 1, generator=gen) * 10
            g = torch.randn(n, 2, generator=gen) * 1e-3
            W = torch.zeros(layers, 576, 2, requires_grad=True)
            _block_product(_flat_weights(W), x).backward(g)
            want = W.grad.permute(2, 0, 1).reshape(2, -1)
            assert torch.equal(_grad_term(x.reshape(n, -1), g, rows), want), (n, layers, rows)
