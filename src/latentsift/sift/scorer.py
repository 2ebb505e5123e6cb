"""The learned branch: a gated linear head over all-layer span states (paper section "Linear scorer and signal fusion", appendix "Learned scorer architecture and training").

For each model-authored span j (cot and fn, observations excluded) the head reads the per-layer
mean-pooled states u[j][l], l = 1..L, and computes

    (g_j, v_j) = sum_l W_l u[j][l] + b        W_l in R^{d x 2} per layer, b in R^2 shared
    q_lin = sum_j sigmoid(g_j) v_j / max(sum_j sigmoid(g_j), 1e-8)

which is ``W u~ + b`` on the concatenation u~ = [u(1); ...; u(L)] without ever forming it. Training:
binary cross-entropy of q_lin (a logit) against y = 1[reward >= 0.5], AdamW (lr 3e-6, weight decay
1e-5), gradients accumulated over 16 trajectories per optimizer step (the loss is the mean over the
accumulated trajectories; a last, shorter group is averaged over its own size), at most 40 epochs,
80/20 train/validation split with seed 0, and the checkpoint (after an epoch) with the lowest
validation loss is kept. Every one of these is a constructor setting. ``fit(..., groups=)`` splits by
group instead of by trajectory (whole groups go to validation, in a seeded order, until it holds at
least ``val_frac`` of the trajectories; at least one group trains): the protocol passes its fold
groups (task, repository), so that no task has candidates on both sides of the early-stopping split.

The head's products and weight gradient in fixed pieces, with autograd's bits, are ``head_products``.

Initialisation (``init``):
  "zeros" (default): W = 0 and b = (0, log(p / (1 - p))) with p the positive rate of the training
      split, so training starts at the constant base-rate predictor (loss = the label entropy).
      The paper does not state its init; with lr 3e-6 a random init whose logits are far from the
      base rate may not recover within 40 epochs, the zero init cannot start there.
  "torch": each per-layer projection as ``torch.nn.Linear(d, 2, bias=False)`` initialises it
      (uniform in +-1/sqrt(d)) from a generator seeded with ``seed``; b = 0.

Pitfall: the states are used without normalisation (as the paper says), so the logit scale follows
the hidden-state norms of the model; the learning rate is small for that reason.

Determinism: the split and the epoch orders come from ``numpy.random.default_rng(seed)``, the
"torch" init from a seeded ``torch.Generator``; ``fit`` runs with
``torch.use_deterministic_algorithms(True)``. Threads without thread-dependent results: a product
whose reduction over spans is split across threads rounds differently, so every product runs at one
torch thread, in pieces fixed by the data alone (one per trajectory, or one per contiguous run of
trajectories; 256-trajectory chunks for the epoch losses, 64 for scoring), and the caller's thread
count only sets how many workers share the pieces (``latentsift._core.threads.one_thread_workers``). The
head's weight gradient is computed from the same pieces and summed in the order autograd's engine
would sum it (tested bit for bit against autograd). Two fits give identical weights and scores
whatever the caller's thread count.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._core.validation import LatentSiftError, NotFittedError, param_error, check_positive_int
from .._core.estimator import Estimator
from .._core.io import ArtefactKind, atomic_path, read_artefact, replaced_folder, write_artefact
from .._core.manifests import ScorerManifest, manifest_values
from .._core.threads import one_thread_workers
from .._core import words
from ..bank.bank import as_fingerprint
from ..states.model import Fingerprint
from ..states.states import TrajectoryStates
from .head_products import _block_product, _flat_weights, _products, _weight_grad

SCORER_FORMAT = "latentsift-scorer"
SCORER_VERSION = 1
SCORER_JSON = "scorer.json"
SCORER_TENSORS = "scorer.safetensors"
CURVE_PNG = "training_curve.png"
SCORER_ARTEFACT = ArtefactKind(SCORER_FORMAT, SCORER_VERSION, SCORER_JSON, noun="a scorer directory",
                               make="train one with 'latentsift scorer train'", redo="retrain the scorer",
                               schema=ScorerManifest)
INITS = ("zeros", words.TORCH)  # the initialisations; "torch" as torch.nn.Linear does, not the kNN backend
GATE_EPS = 1e-8  # Eq. (linear-scorer): max(sum_j sigmoid(g_j), 1e-8)


# ---------------------------------------------------------------------- the equations
def span_outputs(u, W, b):
    """(g, v) per span = sum_l W_l u[j][l] + b (Eq. linear-head); u (S, L, d), W (L, d, 2) -> (S, 2).

    ``u`` may also be a sequence of (S_i, L, d) blocks: their spans in order, as if concatenated
    (the blocks are never copied into one tensor). Computed as one (2, L*d) x (L*d, S_i) product per
    block on zero-copy views (the concatenated vector u~ is never formed); this orientation is ~3x
    faster on CPU than (S, L*d) x (L*d, 2), and its gradient g^T u reads u once. The bias is added
    once, after the blocks are joined.
    """
    import torch
    Wt = _flat_weights(W)
    blocks = [u] if torch.is_tensor(u) else list(u)
    outs = [_block_product(Wt, x) for x in blocks]
    return (outs[0] if len(outs) == 1 else torch.cat(outs)) + b


def gated_logits(out, owner, n_traj: int):
    """q_lin = sum_j sigmoid(g_j) v_j / max(sum_j sigmoid(g_j), 1e-8) per trajectory (Eq. linear-scorer).

    out: (S, 2) span outputs (g, v); owner: (S,) int64 trajectory number of each span in 0..n_traj-1.
    A trajectory without model-authored spans gets q_lin = 0 (0 / 1e-8).
    """
    import torch
    a = torch.sigmoid(out[:, 0])
    num = torch.zeros(n_traj, dtype=out.dtype).index_add_(0, owner, a * out[:, 1])
    den = torch.zeros(n_traj, dtype=out.dtype).index_add_(0, owner, a)
    return num / den.clamp_min(GATE_EPS)


@contextlib.contextmanager
def _deterministic():
    import torch
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev)


class _Packed:
    """Model-authored span states of several trajectories, stacked: u (S, L, d) float32 + offsets."""

    def __init__(self, states: Sequence[TrajectoryStates], pool=None):
        import torch
        masks = [s.scorer_mask() for s in states]
        self.sizes = np.array([int(m.sum()) for m in masks], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        if not states:
            self.u = torch.zeros(0, 0, 0)
            return
        L, d = states[0].n_layers, states[0].d_model
        # each trajectory's model-authored spans copied into their rows (boolean indexing: measured
        # twice as fast as np.compress(..., out=) on these (S, L, d) blocks), by the pool's workers
        # when given (numpy's copies release the GIL)
        u = np.empty((int(self.offsets[-1]), L, d), dtype=np.float32)

        def copy(i: int) -> None:
            u[self.offsets[i]:self.offsets[i + 1]] = states[i].layers[masks[i]]
        if pool is None:
            for i in range(len(states)):
                copy(i)
        else:
            list(pool.map(copy, range(len(states))))
        self.u = torch.from_numpy(u)

    def blocks(self, idx: np.ndarray) -> list:
        """The span blocks of trajectories ``idx`` in order, as zero-copy views: one block for a
        contiguous run of trajectories (one product), else one per trajectory."""
        lo, hi = self.offsets[idx], self.offsets[idx + 1]
        if np.all(lo[1:] == hi[:-1]):
            return [self.u[lo[0]:hi[-1]]]
        return [self.u[a:z] for a, z in zip(lo, hi)]

    def owner(self, idx: np.ndarray):
        """The owner number 0..len(idx)-1 of each span of trajectories ``idx``."""
        import torch
        return torch.from_numpy(np.repeat(np.arange(len(idx)), self.sizes[idx]))

    def outputs(self, idx: np.ndarray, W, b):
        """Span outputs (g, v) of trajectories ``idx`` and the owner number of each span."""
        blocks = self.blocks(idx)
        return span_outputs(blocks[0] if len(blocks) == 1 else blocks, W, b), self.owner(idx)


def early_stopping_groups(trajectories, group: Callable[[Any], str] = lambda t: t.repo) -> dict[str, str]:
    """The groups of the scorer's early-stopping split: each trajectory's fold group (``group``; by default its
    repository, as the protocol's default folds and ``fit``), or its task where all share one group (one group
    would leave no validation side). No task has candidates on both sides either way."""
    trajs = list(trajectories)
    by_group = len({group(t) for t in trajs}) > 1
    return {t.traj_id: group(t) if by_group else t.instance_id for t in trajs}


def states_key(states: Mapping[str, TrajectoryStates], labels: Mapping[str, int]) -> tuple:
    """(traj_id, label, tokens run, layers, width) of each trajectory ``labels`` names, sorted: what tells one
    fit's inputs from another's within a run (``fit_once``)."""
    return tuple((t, int(labels[t]), int(states[t].n_tokens), states[t].n_layers, states[t].d_model)
                 for t in sorted(labels))


def fit_once(fits: dict | None, params: Mapping[str, Any], states: Mapping[str, TrajectoryStates],
             labels: Mapping[str, int], *, fingerprint=None, groups: Mapping[str, str] | None = None) -> "LinearScorer":
    """``LinearScorer(**params).fit`` on the states of the trajectories ``labels`` names (sorted by id), or the
    scorer that an identical call (same settings, trajectories, labels, groups and fingerprint) put in ``fits``.

    A fit gives the same weights whenever its inputs are the same (module docstring, "Determinism"), so a
    repeat returns the first one (its ``history_`` seconds are the first fit's). ``fits``: a dict that one
    run keeps for the states it holds (the protocol fits the same banks in Stage 1's fitted fusion and in the
    pruning's inner split); None fits every time. The states are told apart by the model's fingerprint and
    each trajectory's token count and shape (``states_key``): a run's other representations (the sweep's longer
    spans or patch step) render more tokens of the same model, the sweep's other encoder has another width.
    """
    ids = sorted(labels)
    fp = None if fingerprint is None else as_fingerprint(fingerprint, "fit_once").digest
    key = (tuple(sorted(LinearScorer(**params).get_params().items())), states_key(states, labels),
           None if groups is None else tuple((t, str(groups[t])) for t in ids), fp)
    if fits is not None and key in fits:
        return fits[key]
    scorer = LinearScorer(**params).fit([states[i] for i in ids], [labels[i] for i in ids], fingerprint=fingerprint,
                                        groups=groups)
    if fits is not None:
        fits[key] = scorer
    return scorer


class LinearScorer(Estimator):
    """Gated linear head on all-layer span states (scikit-learn's estimator contract: the constructor stores
    the settings, ``fit`` returns self, ``get_params``/``set_params``, ``sklearn.base.clone``).

    Learned attributes: ``W_`` (n_layers, d_model, 2) float32, ``b_`` (2,) float32 (the best
    checkpoint), ``history_`` (one dict per epoch, epoch 0 = before training: ``train_loss``,
    ``val_loss``, ``seconds``; ``train_loss`` is None with ``train_loss=False``), ``best_epoch_``,
    ``train_ids_``, ``val_ids_``, ``train_pos_rate_``, ``n_layers_``, ``d_model_``, ``fingerprint_``
    (None when not given).
    """

    def __init__(self, *, lr: float = 3e-6, weight_decay: float = 1e-5, accumulation: int = 16,
                 max_epochs: int = 40, val_frac: float = 0.2, seed: int = 0, init: str = "zeros",
                 patience: int | None = None, train_loss: bool = True):
        self.lr = lr
        self.weight_decay = weight_decay
        self.accumulation = accumulation
        self.max_epochs = max_epochs
        self.val_frac = val_frac
        self.seed = seed
        self.init = init
        self.patience = patience
        # the training set's loss each epoch, for history_ only: a forward over the training
        # trajectories that nothing fitted depends on (the protocol's fits skip it)
        self.train_loss = train_loss

    def __repr__(self) -> str:
        return "LinearScorer(" + ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()) + ")"

    def _check_params(self) -> None:
        o = "LinearScorer"
        for name in ("lr", "weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (name == "lr" and v == 0):
                raise param_error(name, o, "a positive float" if name == "lr" else "a float >= 0", v)
        check_positive_int(self.accumulation, "accumulation", o)
        check_positive_int(self.max_epochs, "max_epochs", o)
        if self.patience is not None:
            check_positive_int(self.patience, "patience", o)
        if isinstance(self.val_frac, bool) or not isinstance(self.val_frac, (int, float)) \
                or not 0.0 <= self.val_frac < 1.0:
            raise param_error("val_frac", o, "a float in [0, 1)", self.val_frac)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise param_error("seed", o, "an int", self.seed)
        if not isinstance(self.train_loss, bool):
            raise param_error("train_loss", o, "a bool", self.train_loss)
        if self.init not in INITS:
            raise param_error("init", o, f"one of {list(INITS)}", self.init)

    def _check_fitted(self) -> None:
        if not hasattr(self, "W_"):
            raise NotFittedError("This LinearScorer is not fitted yet: call fit(...) or LinearScorer.load(path).")

    # ------------------------------------------------------------------ fit
    def _initial_params(self, L: int, d: int, pos_rate: float):
        import torch
        if self.init == "zeros":
            W = torch.zeros(L, d, 2)
            p = min(max(pos_rate, 1e-6), 1 - 1e-6)
            b = torch.tensor([0.0, math.log(p / (1 - p))])  # start at the base-rate logit
        else:
            g = torch.Generator().manual_seed(int(self.seed))
            bound = 1.0 / math.sqrt(d)  # nn.Linear(d, 2) default: kaiming_uniform(a=sqrt(5))
            W = (torch.rand(L, d, 2, generator=g) * 2 - 1) * bound
            b = torch.zeros(2)
        return W.float(), b.float()

    def split(self, traj_ids: Sequence[str], groups: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
        """The seeded train/validation split of sorted ``traj_ids`` (the paper's 80/20, seed 0); with
        ``groups`` (traj_id -> group) whole groups go to one side (``_split``)."""
        train, val, _ = self._split(traj_ids, groups)
        return train, val

    def _split(self, traj_ids: Sequence[str], groups: Mapping[str, str] | None) -> tuple[list[str], list[str], int]:
        """(train, validation, n): ``n`` the length of the seeded permutation drawn (trajectories, or groups)."""
        ids = sorted(traj_ids)
        target = int(round(self.val_frac * len(ids)))
        if groups is None:
            perm = np.random.default_rng(int(self.seed)).permutation(len(ids))
            n_val = min(max(target, 1), len(ids) - 1) if self.val_frac > 0 else target
            return sorted(ids[i] for i in perm[n_val:]), sorted(ids[i] for i in perm[:n_val]), len(ids)
        units = sorted({groups[t] for t in ids})
        size = {u: 0 for u in units}
        for t in ids:
            size[groups[t]] += 1
        perm = np.random.default_rng(int(self.seed)).permutation(len(units))
        held: set[str] = set()
        n_val = 0
        for i in perm:  # whole groups in the seeded order until validation holds val_frac (>= 1 trajectory)
            if self.val_frac == 0 or n_val >= max(target, 1) or len(held) == len(units) - 1:
                break
            held.add(units[i])
            n_val += size[units[i]]
        return ([t for t in ids if groups[t] not in held], [t for t in ids if groups[t] in held], len(units))

    def fit(self, states: Sequence[TrajectoryStates], labels: Mapping[str, int] | Sequence[int], *,
            fingerprint: Fingerprint | None = None, groups: Mapping[str, str] | Sequence[str] | None = None,
            callback: Callable[[dict], None] | None = None) -> "LinearScorer":
        """Train on bank trajectories. ``labels``: dict traj_id -> 0/1, or a list aligned with ``states``.

        ``groups`` (dict traj_id -> group, or a list aligned with ``states``; e.g. each trajectory's task):
        the validation split keeps every group on one side (module docstring); None splits by trajectory.
        The result does not depend on the order of ``states`` (trajectories are sorted by traj_id).
        ``callback`` receives each epoch's history entry (for progress bars).
        """
        import torch
        self._check_params()
        states, lab, fingerprint = _check_fit_inputs(states, labels, fingerprint)
        ids = [s.traj_id for s in states]
        grp = None if groups is None else check_groups(groups, ids)
        L, d, lids = states[0].n_layers, states[0].d_model, getattr(states[0], "layer_ids", None)
        by_id = {s.traj_id: s for s in states}
        train_ids, val_ids, n_drawn = self._split(ids, grp)
        if len(train_ids) == 0:
            raise LatentSiftError("LinearScorer.fit needs at least one training trajectory.")
        y_tr = torch.tensor([float(lab[t]) for t in train_ids])
        y_va = torch.tensor([float(lab[t]) for t in val_ids])
        pos_rate = float(y_tr.mean())
        best, history = self._train([by_id[t] for t in train_ids], [by_id[t] for t in val_ids], y_tr, y_va,
                                    (L, d, pos_rate), n_drawn, callback)
        self.W_ = best[2].numpy().astype(np.float32)
        self.b_ = best[3].numpy().astype(np.float32)
        self.best_epoch_ = int(best[1])
        self.history_ = history
        self.train_ids_, self.val_ids_ = train_ids, val_ids
        self.train_pos_rate_ = pos_rate
        self.n_layers_, self.d_model_ = L, d
        self.layer_ids_ = None if lids is None else [int(x) for x in lids]
        self.fingerprint_ = fingerprint
        return self

    def _train(self, train: list, val: list, y_tr, y_va, shape: tuple[int, int, float], n_ids: int,
               callback: Callable[[dict], None] | None) -> tuple[tuple, list[dict]]:
        """AdamW on the gated head over accumulated trajectories, one validation loss per epoch, early
        stopping by ``patience``: ((best criterion, epoch, W, b), history)."""
        import torch
        L, d, pos_rate = shape
        with _deterministic(), one_thread_workers() as pool:
            tr = _Packed(train, pool)
            va = _Packed(val, pool) if val else None
            W0, b0 = self._initial_params(L, d, pos_rate)
            W = torch.nn.Parameter(W0)
            b = torch.nn.Parameter(b0)
            opt = torch.optim.AdamW([W, b], lr=float(self.lr), weight_decay=float(self.weight_decay))
            bce = torch.nn.functional.binary_cross_entropy_with_logits

            def chunk_loss(packed, y, s):
                with torch.no_grad():  # grad mode is per thread
                    idx = np.arange(s, min(s + 256, len(y)))
                    out, own = packed.outputs(idx, W, b)
                    return bce(gated_logits(out, own, len(idx)), y[idx], reduction="sum")

            def mean_losses():
                """(train, validation) mean loss (train: None unless ``train_loss``); their
                256-trajectory chunks computed side by side."""
                sets = {"train": (tr, y_tr)} if self.train_loss else {}
                if va is not None:
                    sets["val"] = (va, y_va)
                jobs = {k: [pool.submit(chunk_loss, p, y, s) for s in range(0, len(y), 256)]
                        for k, (p, y) in sets.items()}
                out = {k: float(torch.stack([f.result() for f in fs]).sum() / len(sets[k][1]))
                       for k, fs in jobs.items()}
                return out.get("train"), out.get("val", float("nan"))

            rng = np.random.default_rng(int(self.seed))
            rng.permutation(n_ids)  # consumed by the split: epoch orders follow it in the stream
            t0 = time.perf_counter()
            train_loss, val_loss = mean_losses()
            history = [{"epoch": 0, "train_loss": train_loss, "val_loss": val_loss, "seconds": 0.0}]
            if callback:
                callback(history[-1])
            best = (math.inf, 0, W.detach().clone(), b.detach().clone())
            stale = 0
            acc = int(self.accumulation)
            for epoch in range(1, int(self.max_epochs) + 1):
                order = rng.permutation(len(train))
                for s in range(0, len(order), acc):
                    idx = np.sort(order[s:s + acc])
                    # the products (and below their weight gradient) in the workers; autograd does the
                    # rest, from the products' output on: the same operations as autograd through them
                    blocks = tr.blocks(idx)
                    prod = _products(_flat_weights(W.detach()), blocks, pool)
                    prod.requires_grad_()
                    q = gated_logits(prod + b, tr.owner(idx), len(idx))
                    loss = bce(q, y_tr[idx], reduction="mean")  # mean over the accumulated trajectories
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    W.grad = _weight_grad(prod.grad, blocks, pool).view(2, L, d).permute(1, 2, 0).contiguous()
                    opt.step()
                train_loss, val_loss = mean_losses()
                entry = {"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss,
                         "seconds": round(time.perf_counter() - t0, 4)}
                history.append(entry)
                if callback:
                    callback(entry)
                crit = entry["val_loss"] if va is not None else -epoch  # no validation: keep the last
                if crit < best[0]:
                    best = (crit, epoch, W.detach().clone(), b.detach().clone())
                    stale = 0
                else:
                    stale += 1
                    if self.patience is not None and stale >= self.patience:
                        break
        return best, history

    # ------------------------------------------------------------------ use
    def decision_function(self, states: Sequence[TrajectoryStates], *, chunk: int = 64) -> np.ndarray:
        """q_lin (float64, one per trajectory, in the given order) from the best checkpoint."""
        import torch
        self._check_fitted()
        states = list(states)
        for s in states:
            if not isinstance(s, TrajectoryStates):
                raise param_error("states", "LinearScorer.decision_function", "a list of TrajectoryStates",
                                  type(s).__name__)
            lids = getattr(s, "layer_ids", None)
            if (s.n_layers, s.d_model) != (self.n_layers_, self.d_model_) or \
                    (None if lids is None else [int(x) for x in lids]) != self.layer_ids_:
                raise LatentSiftError(f"States of {s.traj_id!r} have {s.n_layers} layers x d={s.d_model} "
                                      f"(layers {lids}); the scorer was trained on {self.n_layers_} x "
                                      f"{self.d_model_} (layers {self.layer_ids_}): another model or layer "
                                      "selection. Extract all layers for the scorer.")
        W = torch.from_numpy(self.W_)
        b = torch.from_numpy(self.b_)
        out = np.empty(len(states), dtype=np.float64)

        def score(s: int) -> None:
            with torch.no_grad():
                part = states[s:s + chunk]
                packed = _Packed(part)
                o, own = packed.outputs(np.arange(len(part)), W, b)
                out[s:s + len(part)] = gated_logits(o, own, len(part)).double().numpy()

        with one_thread_workers() as pool:  # chunks side by side, each at one thread
            list(pool.map(score, range(0, len(states), chunk)))
        return out

    def check_fingerprint(self, fingerprint: Any, what: str = "candidate states") -> None:
        self._check_fitted()
        if self.fingerprint_ is not None:
            self.fingerprint_.check_same(as_fingerprint(fingerprint, "LinearScorer.check_fingerprint"), what)

    # ------------------------------------------------------------------ io
    def plot_history(self, path: str | Path) -> Path:
        """Training curve (train and validation BCE per epoch, best epoch marked) as a PNG."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        self._check_fitted()
        ep = [h["epoch"] for h in self.history_]
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        if self.history_[0].get("train_loss") is not None:
            ax.plot(ep, [h["train_loss"] for h in self.history_], marker=".", label="train")
        if self.val_ids_:
            ax.plot(ep, [h["val_loss"] for h in self.history_], marker=".", label="validation")
        ax.axvline(self.best_epoch_, color="grey", ls="--", lw=1, label=f"kept (epoch {self.best_epoch_})")
        ax.set_xlabel("epoch (0 = initialisation)")
        ax.set_ylabel("binary cross-entropy")
        ax.set_title(f"LinearScorer: lr={self.lr:g}, wd={self.weight_decay:g}, init={self.init}")
        ax.legend()
        fig.tight_layout()
        path = Path(path)
        try:
            with atomic_path(path, ".png") as tmp:
                fig.savefig(tmp)
        finally:
            plt.close(fig)
        return path

    def to_json(self, source: Mapping[str, Any] | None = None) -> dict:
        self._check_fitted()
        return {"format": SCORER_FORMAT, "version": SCORER_VERSION, "settings": self.get_params(),
                "fingerprint": self.fingerprint_.to_dict() if self.fingerprint_ is not None else None,
                "n_layers": self.n_layers_, "d_model": self.d_model_, "layer_ids": self.layer_ids_,
                "best_epoch": self.best_epoch_,
                "train_pos_rate": self.train_pos_rate_, "history": self.history_,
                "train_ids": self.train_ids_, "val_ids": self.val_ids_, "tensors": SCORER_TENSORS,
                "source": dict(source or getattr(self, "source_", {}) or {})}

    def save(self, path: str | Path, *, source: Mapping[str, Any] | None = None, plot: bool = True) -> Path:
        """SCORER_DIR/scorer.safetensors (W, b), training_curve.png, then scorer.json (last = complete)."""
        from safetensors.numpy import save as st_save
        self._check_fitted()
        with replaced_folder(path) as tmp:  # an old scorer stays whole until the new one is; a failure leaves none
            if plot:
                self.plot_history(tmp / CURVE_PNG)
            blob = st_save({"W": np.ascontiguousarray(self.W_), "b": np.ascontiguousarray(self.b_)})
            meta = write_artefact(tmp, SCORER_ARTEFACT, self.to_json(source), {"tensors": (SCORER_TENSORS, blob)})
        self.source_ = dict(meta["source"])
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "LinearScorer":
        from safetensors.numpy import load as st_load
        meta, blobs = read_artefact(path, SCORER_ARTEFACT, {"tensors": SCORER_TENSORS})
        arr = st_load(blobs["tensors"])
        sc = cls(**meta["settings"])
        with manifest_values(Path(path) / SCORER_JSON, "settings", SCORER_ARTEFACT.redo):
            sc._check_params()
        sc.W_, sc.b_ = arr["W"], arr["b"]
        sc.history_ = meta["history"]
        sc.best_epoch_ = int(meta["best_epoch"])
        sc.train_ids_, sc.val_ids_ = meta["train_ids"], meta["val_ids"]
        sc.train_pos_rate_ = meta["train_pos_rate"]
        sc.n_layers_, sc.d_model_ = int(meta["n_layers"]), int(meta["d_model"])
        sc.layer_ids_ = meta.get("layer_ids")
        sc.fingerprint_ = Fingerprint.from_dict(meta["fingerprint"]) if meta.get("fingerprint") else None
        sc.source_ = dict(meta.get("source", {}))
        return sc


def _check_fit_inputs(states, labels,
                      fingerprint) -> tuple[list[TrajectoryStates], dict[str, int], Fingerprint | None]:
    """``LinearScorer.fit``'s inputs checked: (states, traj_id -> label, fingerprint)."""
    o = "LinearScorer.fit"
    states = list(states)
    if not states or not all(isinstance(s, TrajectoryStates) for s in states):
        raise param_error("states", o, "a non-empty list of TrajectoryStates",
                          "an empty list" if not states else "other objects")
    ids = [s.traj_id for s in states]
    if len(set(ids)) != len(ids):
        raise LatentSiftError(f"The 'states' parameter of {o} has duplicate traj_ids.")
    if isinstance(labels, Mapping):
        lab = {}
        for t in ids:
            if t not in labels:
                raise LatentSiftError(f"The 'labels' parameter of {o} has no label for {t!r}.")
            lab[t] = labels[t]
    else:
        labels = list(labels)
        if len(labels) != len(states):
            raise LatentSiftError(f"The 'labels' parameter of {o} must have one label per state "
                                  f"({len(states)}). Got {len(labels)} instead.")
        lab = dict(zip(ids, labels))
    for t, y in lab.items():
        if isinstance(y, bool) or y not in (0, 1):
            raise LatentSiftError(f"The 'labels' parameter of {o} must hold 0 or 1. Got {y!r} for {t!r}.")
    L, d, lids = states[0].n_layers, states[0].d_model, getattr(states[0], "layer_ids", None)
    for s in states:
        if (s.n_layers, s.d_model, getattr(s, "layer_ids", None)) != (L, d, lids):
            raise LatentSiftError(f"States of {s.traj_id!r} have {s.n_layers} layers x d={s.d_model}; "
                                  f"others have {L} x {d} (mixed models or layer selections).")
    if fingerprint is not None:
        fingerprint = as_fingerprint(fingerprint, o)
        if fingerprint.d_model != d:
            raise LatentSiftError(f"The states have d_model={d} but the fingerprint says {fingerprint.d_model}.")
    return states, lab, fingerprint


def check_groups(groups: Mapping[str, str] | Sequence[str], ids: Sequence[str],
                 owner: str = "LinearScorer.fit") -> dict[str, str]:
    """``owner``'s ``groups`` (``LinearScorer.fit``, ``LogisticProbe.fit``) as traj_id -> group, one per trajectory."""
    if isinstance(groups, Mapping):
        missing = [t for t in ids if t not in groups]
        if missing:
            raise LatentSiftError(f"The 'groups' parameter of {owner} has no group for {missing[0]!r}.")
        return {t: str(groups[t]) for t in ids}
    groups = list(groups)
    if len(groups) != len(ids):
        raise LatentSiftError(f"The 'groups' parameter of {owner} must have one group per state "
                              f"({len(ids)}). Got {len(groups)} instead.")
    return {t: str(g) for t, g in zip(ids, groups)}


def check_split(scorer: LinearScorer, labels: Mapping[str, int], log: Callable[[str], None] | None = None) -> None:
    """Before any state loads: refuse a train/validation split whose training side lacks an outcome,
    and say (``log``) when validation takes most of the trajectories or there is none."""
    train, val = scorer.split(list(labels))
    n, f = len(labels), scorer.val_frac
    classes = {labels[t] for t in train}
    if len(classes) < 2:
        what = "none" if not train else ("all resolved" if classes == {1} else "all unresolved")
        raise LatentSiftError(f"--val-frac {f:g} leaves {len(train)} of the {n} bank trajectories for training "
                              f"({what}); the scorer needs both outcomes to learn from: lower --val-frac.")
    if log is None:
        return
    if not val:
        log("no validation split (--val-frac 0): every bank trajectory trains and the last epoch is kept.")
    elif len(train) < len(val):
        log(f"warning: --val-frac {f:g} trains on {len(train)} of the {n} bank trajectories and validates on "
            f"{len(val)}; the paper holds out 0.2.")

