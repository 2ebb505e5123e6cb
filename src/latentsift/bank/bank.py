"""Positive and negative banks of distance states (paper, "Three-channel representations and bank construction").

One bank entry is one labelled trajectory holding its three channel sequences. ``Bank.fit`` stacks,
per channel and per class, the distance states ``z[t][c]`` (final layer by default) of every entry
into one (n_states, d_model) float32 matrix, and remembers which trajectory and step each row came
from (so a filter can name the bank trajectories behind its evidence). Channel-c retrieval searches
the channel-c rows of all entries of a class; no separate per-channel bank is built.

    bank = Bank().fit(states, labels, instances, repos, fingerprint)
    bank = Bank.from_trajectories(trajs, states_or_store, fingerprint)   # the same, from labelled trajectories
    d_pos, d_neg, i_pos, i_neg = bank.distances(z, "cot")
    bank.save("runs/bank"); bank = Bank.load("runs/bank")

Guards: a bank refuses to score a candidate whose instance (or trajectory) is in the bank
(``check_candidates``), and states from another model (``check_fingerprint``).

Repository splits: ``split_by_repo`` (k folds balanced by trajectory count) and
``leave_one_repo_out`` give (bank_repos, eval_repos) pairs with disjoint repositories, as the paper's
protocol requires; ``select_by_repo`` picks the trajectories of a repository subset. ``iter_folds``
is the one fold loop (Stage 1, agent transfer, pruning, the shift guard, the inner cross-fits): per
split, the bank side's trajectories and the evaluation side's pools; ``inner_folds`` the same on a
bank's own trajectories.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .._core.validation import (FingerprintMismatch, LatentSiftError, NotFittedError, check_choice,
                                check_positive_int, param_error, check_states)
from .._core.estimator import Estimator
from .._core.io import ArtefactKind, read_artefact, replaced_folder, write_artefact
from .._core.manifests import BankManifest, manifest_values
from .knn import TORCH_KNN, bank_sqnorms, knn_backends, nearest_distances
from ..states.model import Fingerprint
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import CHANNEL_ID, CHANNELS, Pool, Trajectory, group_pools

BANK_FORMAT = "latentsift-bank"
BANK_VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "bank.safetensors"
BANK_ARTEFACT = ArtefactKind(BANK_FORMAT, BANK_VERSION, MANIFEST, noun="a bank directory",
                             make="build one with 'latentsift bank build'", redo="rebuild the bank", schema=BankManifest)
CLASSES = ("pos", "neg")
SEARCH_MEMO = 8  # query sets whose search answers a bank keeps (``distances``)
NORMALIZATIONS = (None, "l2", "whiten")
WHITEN_SHRINKAGE = 0.1  # ridge added to the bank covariance's eigenvalues, as a fraction of their mean
CENTERINGS = (None, "mean")
DEFAULT_LAYER = -1  # distance states come from the final layer (paper, "Three-channel representations ...")




def as_fingerprint(fp: Any, owner: str) -> Fingerprint:
    """A ``Fingerprint`` from a Fingerprint or its ``to_dict()`` form."""
    if isinstance(fp, Fingerprint):
        return fp
    if isinstance(fp, Mapping):
        try:
            return Fingerprint.from_dict(dict(fp))
        except (KeyError, TypeError):
            pass
    raise param_error("fingerprint", owner, "a model Fingerprint (or its to_dict() form)", type(fp).__name__)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """z / ||z||_2 row-wise (zero rows stay zero); a Bank 'normalize' variant, not in the paper."""
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(n > 0, n, 1.0)).astype(np.float32)


def fit_whitening(x: np.ndarray, shrinkage: float = WHITEN_SHRINKAGE) -> tuple[np.ndarray, np.ndarray]:
    """(mean, W) of ZCA whitening fitted on the rows of x; a Bank 'normalize' variant, not in the paper.

    W = V diag((lambda + shrinkage * mean(lambda))^-1/2) V^T from the covariance's eigenpairs, so that
    (x - mean) @ W has (nearly) identity covariance; the ridge keeps the few-sample directions of a
    small bank from being blown up. Fewer than two rows: the identity (nothing to fit).
    """
    d = x.shape[1]
    if len(x) < 2:
        return np.zeros(d, np.float32), np.eye(d, dtype=np.float32)
    x64 = np.asarray(x, dtype=np.float64)
    mu = x64.mean(axis=0)
    lam, v = np.linalg.eigh(np.cov(x64 - mu, rowvar=False))
    lam = np.clip(lam, 0.0, None)
    w = (v / np.sqrt(lam + shrinkage * max(lam.mean(), 1e-12))) @ v.T
    return mu.astype(np.float32), w.astype(np.float32)


class Bank(Estimator):
    """Positive and negative banks of per-channel distance states (scikit-learn's estimator contract:
    ``get_params``/``set_params``, ``fit`` returns self, ``sklearn.base.clone`` gives an unfitted copy).

    Settings (stored, never learned):
      layer:     index into ``TrajectoryStates.layers`` axis 1 used for distance states
                 (default -1 = final layer, as in the paper).
      normalize: None (paper), "l2" (unit-norm rows) or "whiten" (ZCA whitening fitted per channel on
                 the bank's states, pos and neg together; ``fit_whitening``), applied to bank and
                 queries alike.
      center:    None (paper) or "mean" (subtract the per-channel mean of all bank states, pos and
                 neg together, from bank rows and queries; applied before ``normalize``).
      channels:  channels to index (default all three).
      backend:   nearest-neighbour backend of ``knn.nearest_distances`` ("torch" or "faiss").

    Learned attributes (after ``fit``), per channel c:
      pos_[c], neg_[c]:             (n_states, d_model) float32, transformed rows
      pos_owner_[c], neg_owner_[c]: (n_states,) int32 index into ``traj_ids_`` of each row's trajectory
      pos_step_[c], neg_step_[c]:   (n_states,) int32 step index t of each row
      center_[c]:                   (d_model,) float32 mean subtracted (only with center="mean")
      whiten_[c]:                   (mean (d_model,), W (d_model, d_model)) float32 (normalize="whiten")
    and traj_ids_ (sorted), labels_, instances_, repos_ (dicts keyed by traj_id), fingerprint_,
    d_model_.
    """

    def __init__(self, *, layer: int = DEFAULT_LAYER, normalize: str | None = None,
                 center: str | None = None, channels: Sequence[str] = CHANNELS, backend: str = TORCH_KNN):
        self.layer = layer
        self.normalize = normalize
        self.center = center
        self.channels = channels
        self.backend = backend

    # ------------------------------------------------------------------ settings

    def _check_params(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, (int, np.integer)):
            raise param_error("layer", "Bank", "an int layer index", self.layer)
        for name, choices in (("normalize", NORMALIZATIONS), ("center", CENTERINGS)):
            if getattr(self, name) not in choices:
                raise param_error(name, "Bank", f"one of {list(choices)}", getattr(self, name))
        check_choice(self.backend, "backend", "Bank", knn_backends())
        if not self.channels or len(set(self.channels)) != len(self.channels):
            raise param_error("channels", "Bank", f"a non-empty subset of {list(CHANNELS)} without repeats",
                              self.channels)
        for c in self.channels:
            check_choice(c, "channels", "Bank", CHANNELS)

    def __repr__(self) -> str:
        return "Bank(" + ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()) + ")"

    # ------------------------------------------------------------------ fit
    def fit(self, states: Mapping[str, TrajectoryStates], labels: Mapping[str, int],
            instances: Mapping[str, str], repos: Mapping[str, str], fingerprint: Fingerprint) -> "Bank":
        """Build the banks from labelled trajectories (label 1 = reward >= 0.5 -> positive bank).

        All four mappings are keyed by traj_id and must have the same keys. Raises when a class
        has no trajectory (a bank with an empty class cannot give margins).
        """
        self.__dict__.pop("_sqnorms", None)  # norms of a previous fit are stale
        self.__dict__.pop("_searches", None)
        self._check_params()
        fp = as_fingerprint(fingerprint, "Bank.fit")
        ids, lab = self._check_fit_inputs(states, labels, instances, repos, fp)
        self.traj_ids_ = ids
        self.labels_ = lab
        self.instances_ = {t: str(instances[t]) for t in ids}
        self.repos_ = {t: str(repos[t]) for t in ids}
        self.fingerprint_ = fp
        self.d_model_ = fp.d_model
        rows: dict[tuple[str, str], list] = {(k, c): [[], [], []] for k in CLASSES for c in self.channels}
        for i, t in enumerate(ids):
            s = states[t]
            z = s.distance_states(self.layer)
            k = "pos" if lab[t] == 1 else "neg"
            for c in self.channels:
                sel = np.asarray(s.channel) == CHANNEL_ID[c]
                rows[k, c][0].append(z[sel])
                rows[k, c][1].append(np.full(int(sel.sum()), i, dtype=np.int32))
                rows[k, c][2].append(np.asarray(s.step)[sel].astype(np.int32))
        raw = {}
        for (k, c), (zs, own, st) in rows.items():
            raw[k, c] = (np.concatenate(zs).astype(np.float32, copy=False).reshape(-1, self.d_model_),
                         np.concatenate(own), np.concatenate(st))
        self.center_ = {}
        if self.center == "mean":
            for c in self.channels:
                both = np.concatenate([raw["pos", c][0], raw["neg", c][0]])
                self.center_[c] = (both.mean(axis=0) if len(both) else np.zeros(self.d_model_)).astype(np.float32)
        self.whiten_ = {}
        if self.normalize == "whiten":
            for c in self.channels:
                both = np.concatenate([raw["pos", c][0], raw["neg", c][0]])
                self.whiten_[c] = fit_whitening(both - self.center_.get(c, 0.0))
        for k in CLASSES:
            setattr(self, f"{k}_", {c: self.transform(raw[k, c][0], c) for c in self.channels})
            setattr(self, f"{k}_owner_", {c: raw[k, c][1] for c in self.channels})
            setattr(self, f"{k}_step_", {c: raw[k, c][2] for c in self.channels})
        return self

    def _check_fit_inputs(self, states, labels, instances, repos,
                          fp: Fingerprint) -> tuple[list[str], dict[str, int]]:
        """``fit``'s inputs checked: (sorted traj_ids, traj_id -> 0/1), both classes present."""
        if not isinstance(states, Mapping) or not states:
            raise param_error("states", "Bank.fit", "a non-empty dict traj_id -> TrajectoryStates",
                              type(states).__name__ if not isinstance(states, Mapping) else "an empty dict")
        ids = sorted(states)
        for name, m in (("labels", labels), ("instances", instances), ("repos", repos)):
            if not isinstance(m, Mapping):
                raise param_error(name, "Bank.fit", "a dict keyed by traj_id", type(m).__name__)
            missing = [t for t in ids if t not in m]
            if missing:
                raise LatentSiftError(f"The '{name}' parameter of Bank.fit has no entry for {len(missing)} "
                                      f"trajectory(ies) of 'states', e.g. {missing[0]!r}.")
        lab: dict[str, int] = {}
        for t in ids:
            y = labels[t]
            if isinstance(y, bool) or y not in (0, 1):
                raise LatentSiftError(f"The 'labels' parameter of Bank.fit must hold 0 or 1 per trajectory. "
                                      f"Got {y!r} instead for {t!r}.")
            lab[t] = int(y)
        n_pos = sum(lab.values())
        if n_pos == 0 or n_pos == len(ids):
            empty = "positive (label 1)" if n_pos == 0 else "negative (label 0)"
            raise LatentSiftError(f"The bank would have an empty {empty} class ({n_pos} positive, "
                                  f"{len(ids) - n_pos} negative trajectories). Both banks need at least "
                                  "one trajectory: add labelled trajectories of the missing class.")
        for t in ids:
            s = states[t]
            if not isinstance(s, TrajectoryStates):
                raise param_error("states", "Bank.fit", "a dict of TrajectoryStates",
                                  f"{type(s).__name__} for {t!r}")
            if s.d_model != fp.d_model:
                raise FingerprintMismatch(f"States of {t!r} have d_model={s.d_model} but the fingerprint says "
                                          f"{fp.d_model}; they come from another model.")
            if not -s.n_layers <= self.layer < s.n_layers:
                raise param_error("layer", "Bank", f"a layer index in [-{s.n_layers}, {s.n_layers - 1}]",
                                  self.layer)
        return ids, lab

    def fit_trajectories(self, trajs: Sequence[Trajectory], states, fingerprint: Any = None) -> "Bank":
        """``fit`` from labelled trajectories: their labels, instances and repositories come from ``trajs``,
        their states from ``states`` (a mapping traj_id -> TrajectoryStates, or a store with ``load``
        and ``fingerprint``; ``fingerprint`` defaults to the store's)."""
        ids = sorted(t.traj_id for t in trajs)
        if hasattr(states, "load") and hasattr(states, "fingerprint"):  # a state store (or a union of stores)
            fingerprint = states.fingerprint if fingerprint is None else fingerprint
            states = states.load(ids)
        return self.fit({i: states[i] for i in ids},
                        {t.traj_id: (None if t.label is None else int(t.label)) for t in trajs},
                        {t.traj_id: t.instance_id for t in trajs}, {t.traj_id: t.repo for t in trajs}, fingerprint)

    @classmethod
    def from_trajectories(cls, trajs: Sequence[Trajectory], states, fingerprint: Any = None, **params) -> "Bank":
        """``Bank(**params).fit_trajectories(trajs, states, fingerprint)``: a bank in one call."""
        return cls(**params).fit_trajectories(trajs, states, fingerprint)

    # ------------------------------------------------------------------ use
    def _check_fitted(self) -> None:
        if not hasattr(self, "pos_"):
            raise NotFittedError("This Bank is not fitted yet: call fit(...) or Bank.load(path) first.")

    def transform(self, z: np.ndarray, channel: str) -> np.ndarray:
        """The bank's state transform (identity in the paper): optional centering, then L2 or whitening."""
        z = np.asarray(z, dtype=np.float32)
        if self.center == "mean":
            z = z - self.center_[channel]
        if self.normalize == "l2":
            z = l2_normalize(z)
        elif self.normalize == "whiten":
            mu, w = self.whiten_[channel]
            z = (z - mu) @ w
        return np.ascontiguousarray(z, dtype=np.float32)

    @property
    def instance_ids_(self) -> set[str]:
        self._check_fitted()
        return set(self.instances_.values())

    @property
    def repo_names_(self) -> list[str]:
        self._check_fitted()
        return sorted(set(self.repos_.values()))

    def label_counts(self) -> dict[str, int]:
        self._check_fitted()
        n_pos = sum(self.labels_.values())
        return {"pos": n_pos, "neg": len(self.traj_ids_) - n_pos}

    def state_counts(self) -> dict[str, dict[str, int]]:
        self._check_fitted()
        return {c: {"pos": int(self.pos_[c].shape[0]), "neg": int(self.neg_[c].shape[0])} for c in self.channels}

    def distances(self, z, channel: str):
        """Exact nearest positive and negative bank states of query states (paper, "Distance scoring and latent filtering").

        z: (n, d_model) raw distance states of one channel (the bank applies its own transform).
        Returns (d_pos, d_neg, idx_pos, idx_neg): float32 (n,) distances and int64 (n,) rows of
        ``pos_[channel]`` / ``neg_[channel]`` (map them with ``owner`` / ``pos_step_``).
        """
        self._check_fitted()
        check_choice(channel, "channel", "Bank.distances", self.channels)
        for k in CLASSES:
            if getattr(self, f"{k}_")[channel].shape[0] == 0:
                raise LatentSiftError(f"The {'positive' if k == 'pos' else 'negative'} bank has no state in "
                                      f"channel {channel!r}: none of its trajectories has a {channel!r} span. "
                                      "Leave that channel out (channels=...) or add trajectories.")
        q = np.asarray(z.detach().cpu().numpy() if hasattr(z, "detach") else z)
        if q.ndim != 2 or q.shape[1] != self.d_model_:
            raise LatentSiftError(f"The 'z' parameter of Bank.distances must have shape (n, {self.d_model_}). "
                                  f"Got {q.shape} instead.")
        # the same query states searched again (Stage 1's ablations all search the fold's bank with the
        # same candidates) get the first search's answer back: a digest of the query bytes is the key
        key = (channel, q.dtype.str, q.shape, hashlib.blake2b(np.ascontiguousarray(q).data, digest_size=16).digest())
        memo = self.__dict__.setdefault("_searches", {})
        if key not in memo:
            q = self.transform(q, channel)
            d_pos, i_pos = self._search(q, "pos", channel)
            d_neg, i_neg = self._search(q, "neg", channel)
            while len(memo) >= SEARCH_MEMO:
                memo.pop(next(iter(memo)))  # the oldest
            memo[key] = (d_pos, d_neg, i_pos, i_neg)
        return tuple(a.copy() for a in memo[key])

    def _search(self, q: np.ndarray, cls: str, channel: str):
        """Exact search of one class bank; its squared norms are computed once and kept (not saved)."""
        rows = getattr(self, f"{cls}_")[channel]
        cache = self.__dict__.setdefault("_sqnorms", {})
        if (cls, channel) not in cache:
            check_states(rows, f"{cls}_[{channel!r}]", "Bank")  # finite, 2-D: checked once per bank
            cache[(cls, channel)] = bank_sqnorms(rows)
        return nearest_distances(q, rows, backend=self.backend, return_index=True,
                                 sqnorms=cache[(cls, channel)], validate_bank=False)

    def owner(self, channel: str, cls: str, rows) -> list[str]:
        """traj_ids of bank rows ``rows`` of class ``cls`` ("pos"/"neg") in ``channel``."""
        self._check_fitted()
        check_choice(cls, "cls", "Bank.owner", CLASSES)
        own = getattr(self, f"{cls}_owner_")[channel][np.asarray(rows, dtype=np.int64)]
        return [self.traj_ids_[i] for i in own]

    def check_candidates(self, instance_ids: Sequence[str], traj_ids: Sequence[str] = ()) -> None:
        """Refuse candidates whose instance (or trajectory) is in the bank (leakage: the paper's banks hold only training repositories)."""
        self._check_fitted()
        inst = self.instance_ids_ - set(getattr(self, "allowed_instances_", ()))  # leak.apply_on_leak("allow")
        bad = sorted({i for i in instance_ids if i in inst})
        if bad:
            raise LatentSiftError(f"{len(bad)} candidate instance(s) are in the bank, e.g. {bad[0]!r}: a "
                                  "candidate's own instance must never be in the bank. Rebuild the bank "
                                  "without them (bank build --exclude-repos ...) or drop those pools.")
        tids = set(self.traj_ids_)
        bad = sorted({t for t in traj_ids if t in tids})
        if bad:
            raise LatentSiftError(f"{len(bad)} candidate trajectory(ies) are bank entries, e.g. {bad[0]!r}.")

    def check_fingerprint(self, fingerprint: Any, what: str = "candidate states") -> None:
        """Raise ``FingerprintMismatch`` unless ``fingerprint`` is the bank's model fingerprint."""
        self._check_fitted()
        self.fingerprint_.check_same(as_fingerprint(fingerprint, "Bank.check_fingerprint"), what)

    # ------------------------------------------------------------------ io
    def manifest(self, source: Mapping[str, Any] | None = None) -> dict:
        self._check_fitted()
        return {
            "format": BANK_FORMAT, "version": BANK_VERSION,
            "fingerprint": self.fingerprint_.to_dict(),
            "settings": {**self.get_params(), "channels": list(self.channels)},
            "label_counts": self.label_counts(),
            "state_counts": self.state_counts(),
            "repos": self.repo_names_,
            "trajectories": [{"traj_id": t, "label": self.labels_[t], "instance_id": self.instances_[t],
                              "repo": self.repos_[t]} for t in self.traj_ids_],
            "source": dict(source or getattr(self, "source_", {}) or {}),
            "tensors": TENSORS,
        }

    def save(self, path: str | Path, *, source: Mapping[str, Any] | None = None) -> Path:
        """Write BANK_DIR/bank.safetensors then BANK_DIR/manifest.json (its presence = complete).

        ``source`` (e.g. the states directory and pools file used) is recorded in the manifest;
        ``scorer train`` reads the states directory from there.
        """
        from safetensors.numpy import save as st_save
        self._check_fitted()
        with replaced_folder(path) as tmp:  # an old bank stays whole until the new one is; a failure leaves none
            tensors = {}
            for k in CLASSES:
                for c in self.channels:
                    tensors[f"{k}.{c}.states"] = getattr(self, f"{k}_")[c]
                    tensors[f"{k}.{c}.owner"] = getattr(self, f"{k}_owner_")[c]
                    tensors[f"{k}.{c}.step"] = getattr(self, f"{k}_step_")[c]
            for c, v in self.center_.items():
                tensors[f"center.{c}"] = v
            for c, (mu, w) in self.whiten_.items():
                tensors[f"whiten.{c}.mean"], tensors[f"whiten.{c}.matrix"] = mu, w
            blob = st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()})
            manifest = write_artefact(tmp, BANK_ARTEFACT, self.manifest(source), {"tensors": (TENSORS, blob)})
        self.source_ = dict(manifest["source"])
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "Bank":
        """Read a bank written by ``save``; checks the format and the tensors' checksum."""
        from safetensors.numpy import load as st_load
        man, blobs = read_artefact(path, BANK_ARTEFACT, {"tensors": TENSORS})
        arrays = st_load(blobs["tensors"])
        s = man["settings"]
        bank = cls(layer=s["layer"], normalize=s["normalize"], center=s["center"],
                   channels=tuple(s["channels"]), backend=s["backend"])
        with manifest_values(Path(path) / MANIFEST, "settings", BANK_ARTEFACT.redo):
            bank._check_params()
        trajs = man["trajectories"]
        bank.traj_ids_ = [r["traj_id"] for r in trajs]
        bank.labels_ = {r["traj_id"]: int(r["label"]) for r in trajs}
        bank.instances_ = {r["traj_id"]: r["instance_id"] for r in trajs}
        bank.repos_ = {r["traj_id"]: r["repo"] for r in trajs}
        bank.fingerprint_ = Fingerprint.from_dict(man["fingerprint"])
        bank.d_model_ = bank.fingerprint_.d_model
        bank.center_ = {c: arrays[f"center.{c}"] for c in bank.channels if f"center.{c}" in arrays}
        bank.whiten_ = {c: (arrays[f"whiten.{c}.mean"], arrays[f"whiten.{c}.matrix"]) for c in bank.channels
                        if f"whiten.{c}.mean" in arrays}
        for k in CLASSES:
            setattr(bank, f"{k}_", {c: arrays[f"{k}.{c}.states"] for c in bank.channels})
            setattr(bank, f"{k}_owner_", {c: arrays[f"{k}.{c}.owner"] for c in bank.channels})
            setattr(bank, f"{k}_step_", {c: arrays[f"{k}.{c}.step"] for c in bank.channels})
        bank.source_ = dict(man.get("source", {}))
        return bank


# ---------------------------------------------------------------------- repository splits
def _repo_counts(repos: Mapping[str, str]) -> dict[str, int]:
    if not isinstance(repos, Mapping) or not repos:
        raise param_error("repos", "split_by_repo", "a non-empty dict traj_id -> repository",
                          type(repos).__name__ if not isinstance(repos, Mapping) else "an empty dict")
    counts: dict[str, int] = {}
    for r in repos.values():
        counts[str(r)] = counts.get(str(r), 0) + 1
    return counts


def _seeded_key(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


def split_by_repo(repos: Mapping[str, str], n_folds: int = 5, seed: int = 0) -> list[tuple[list[str], list[str]]]:
    """k repository-disjoint folds, balanced by trajectory count (greedy).

    ``repos`` maps traj_id -> repository. Repositories are taken largest first (ties in a seeded
    order) and each goes to the fold with the fewest trajectories so far (lowest fold index on ties).
    Returns one (bank_repos, eval_repos) pair per fold, both sorted; eval folds partition the repos.
    """
    counts = _repo_counts(repos)
    n_folds = check_positive_int(n_folds, "n_folds", "split_by_repo")
    if n_folds < 2 or n_folds > len(counts):
        raise param_error("n_folds", "split_by_repo", f"an int in [2, {len(counts)}] (the number of repositories)",
                          n_folds)
    order = sorted(counts, key=lambda r: (-counts[r], _seeded_key(seed, r)))
    folds: list[list[str]] = [[] for _ in range(n_folds)]
    load = [0] * n_folds
    for r in order:
        f = min(range(n_folds), key=lambda i: (load[i], i))
        folds[f].append(r)
        load[f] += counts[r]
    allr = sorted(counts)
    return [(sorted(set(allr) - set(f)), sorted(f)) for f in folds]


def leave_one_repo_out(repos: Mapping[str, str]) -> list[tuple[list[str], list[str]]]:
    """One (bank_repos, [eval_repo]) pair per repository, repositories in sorted order."""
    counts = _repo_counts(repos)
    if len(counts) < 2:
        raise LatentSiftError("leave_one_repo_out needs trajectories from at least 2 repositories. "
                              f"Got {len(counts)} instead.")
    allr = sorted(counts)
    return [([x for x in allr if x != r], [r]) for r in allr]


def select_by_repo(repos: Mapping[str, str], *, include: Sequence[str] | None = None,
                   exclude: Sequence[str] | None = None) -> list[str]:
    """Sorted traj_ids whose repository is in ``include`` (all when None) and not in ``exclude``.

    Unknown repository names raise (a typo would otherwise silently select nothing).
    """
    known = set(repos.values())
    for name, sel in (("include", include), ("exclude", exclude)):
        unknown = sorted(set(sel or ()) - known)
        if unknown:
            raise LatentSiftError(f"The '{name}' parameter of select_by_repo names unknown repositories "
                                  f"{unknown}; known: {sorted(known)}.")
    inc = set(include) if include is not None else known
    exc = set(exclude or ())
    return sorted(t for t, r in repos.items() if r in inc and r not in exc)


# ---------------------------------------------------------------------- the fold loop
@dataclass
class Fold:
    """One fold of a split: its index, its groups, the bank side's trajectories, the evaluation pools."""

    k: int
    bank_groups: list
    eval_groups: list
    bank_trajs: list
    eval_pools: list


def by_repo(t: Trajectory) -> str:
    """A trajectory's fold group by repository (the paper's folds)."""
    return t.repo


def by_instance(t: Trajectory) -> str:
    """A trajectory's fold group by task (runs of one repository)."""
    return t.instance_id


def iter_folds(trajs: Sequence[Trajectory], splits: Sequence[tuple[Sequence[str], Sequence[str]]],
               group: Callable[[Trajectory], str] = by_repo, *, pools: Sequence[Pool] | None = None,
               bank_filter: Callable[[Trajectory], bool] | None = None,
               eval_order: str = "instance") -> Iterator[Fold]:
    """The folds of ``splits`` ((bank groups, eval groups) pairs) that have evaluation pools.

    ``group(traj)``: the fold group of a trajectory (repository by default); ``pools``: the pools of
    ``trajs`` (``group_pools`` when omitted); ``bank_filter``: keep only these bank trajectories
    (e.g. one agent's); ``eval_order``: evaluation pools by instance id ("instance") or group by
    group in sorted group order, by instance within a group ("group").
    """
    check_choice(eval_order, "eval_order", "iter_folds", ("instance", "group"))
    pools = group_pools(trajs) if pools is None else list(pools)
    for k, (bank_groups, eval_groups) in enumerate(splits):
        bank_set, eval_set = set(bank_groups), set(eval_groups)
        if eval_order == "group":
            by: dict[str, list[Pool]] = {}
            for p in pools:
                by.setdefault(group(p.candidates[0]), []).append(p)
            eval_pools = [p for g in sorted(eval_set) for p in by.get(g, [])]
        else:
            eval_pools = [p for p in pools if group(p.candidates[0]) in eval_set]
        if not eval_pools:
            continue
        bank_trajs = [t for t in trajs if group(t) in bank_set and (bank_filter is None or bank_filter(t))]
        yield Fold(k, bank_groups, eval_groups, bank_trajs, eval_pools)


def inner_folds(trajs: Sequence[Trajectory], group: Callable[[Trajectory], str] = by_repo, *, n_folds: int = 2,
                seed: int = 0) -> Iterator[Fold]:
    """``iter_folds`` over ``split_by_repo`` of ``trajs``' own groups: the inner cross-fit of a bank."""
    return iter_folds(trajs, split_by_repo({t.traj_id: group(t) for t in trajs}, n_folds=n_folds, seed=seed), group)
