"""Stage 1: the LatentSift filter and the baseline filters under one interface.

The paper's sections "Distance scoring and latent filtering" and "Linear scorer and signal fusion".

Every filter answers three verbs:

- ``prepare(pool, states)``: per-candidate quantities that do not depend on which other candidates
  are ranked with it (LatentSift: q per channel and q_lin; baselines: the rule's raw score),
  computed once per pool. ``prepare_many(pools, states)`` does all pools with one nearest-neighbour
  search per channel.
- ``rank_subset(prepared, traj_ids) -> {traj_id: s}``: the final score s of each candidate of a
  subset (e.g. a draw of K of the pool's n candidates), ranked *within that subset* (ranks
  are never pooled across instances or draws).
- ``score(pool, states) -> PoolResult``: everything for the whole pool, with the retained set
  (``max(3, floor(K/2))`` best by s; ties at the cut by ``retain.select_retained``'s rule).

``states`` is a dict traj_id -> ``TrajectoryStates`` (then pass ``fingerprint=``) or a states store
(any object with ``load(traj_ids)`` and ``fingerprint``, e.g. ``StateStore``).

Missing-channel rule: a candidate with no channel-c state has q_c = NaN (missing) and
ranks lowest in channel c (``rank.normalized_ranks``); so its s_dist is the lowest rank among the
candidates, whatever its other channels say.

Determinism: candidates are processed in traj_id order and every result is keyed by traj_id, so the
output does not depend on the order of the pool; the retention tie rule hashes (seed, traj_id).

``latentsift filter`` on files is here too (``filter_options``, ``run_filter``, ``FilterRun``): it
is the one place where the filters, the baselines and the output format meet (about 700 lines).
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ._io import atomic_write_json, jsonable, read_json
from ._validation import LatentSiftError, check_choice, param_error
from .bank import Bank, as_fingerprint
from .fuse import FUSION_WEIGHT, fuse
from .leak import ON_LEAK, apply_on_leak
from .margin import DISTANCES, WEIGHTINGS, channel_scores_grouped, signed_evidence
from .rank import min_channel_rank, normalized_ranks
from .retain import KEEP_FRAC, MIN_KEEP, check_retention, select_retained
from .scale.approx import approx_bank  # ray and faiss themselves load only when used
from .scale.bank import shard_bank
from .scale.cluster import require_ray
from .scorer import LinearScorer
from .shift import ON_SHIFT, Reference, guard
from .states import TrajectoryStates
from .store import StateStore, check_recorded_settings
from .trajectory import CHANNEL_ID, CHANNELS, Pool, Trajectory, load_pools

BRANCHES = ("both", "distance", "learned")
N_EVIDENCE = 3  # strongest steps reported per channel


# ---------------------------------------------------------------------- result types
@dataclass
class Evidence:
    """One of a candidate's strongest steps in one channel and its nearest bank states.

    ``contribution`` = w_t * e_t / sum_t w_t (its share of q_c; e_t = the step evidence, the margin
    d_neg - d_pos for the two-sided construction); the contributions of all steps sum to q_c.
    """

    channel: str
    step: int
    evidence: float
    contribution: float
    d_pos: float
    d_neg: float
    pos_traj: str
    pos_step: int
    neg_traj: str
    neg_step: int


@dataclass
class CandidateScore:
    """Stage-1 outcome for one candidate. Fields a filter does not compute are None.

    q, r: per channel (None = the channel is missing for this candidate: it ranks lowest).
    raw: a baseline's rule score (e.g. -n_tokens); None for LatentSift.
    """

    traj_id: str
    instance_id: str
    s: float
    retained: bool
    q: dict[str, float | None] | None = None
    r: dict[str, float] | None = None
    s_dist: float | None = None
    q_lin: float | None = None
    s_lin: float | None = None
    raw: float | None = None
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict:
        return jsonable(asdict(self))


@dataclass
class PoolResult:
    """All candidates of one instance, in traj_id order, with the number retained."""

    instance_id: str
    filter: str
    n_keep: int
    candidates: list[CandidateScore]

    @property
    def retained(self) -> list[str]:
        return [c.traj_id for c in self.candidates if c.retained]

    def to_dict(self) -> dict:
        return {"instance_id": self.instance_id, "filter": self.filter, "k": len(self.candidates),
                "n_keep": self.n_keep, "retained": self.retained,
                "candidates": [c.to_dict() for c in self.candidates]}


@dataclass
class Prepared:
    """Per-candidate quantities of one pool, candidates in traj_id order.

    q: (n, n_channels) float64 channel scores (NaN = missing), columns in ``channels`` order;
    q_lin: (n,) learned logits; raw: (n,) a baseline's rule score. Unused ones are None.
    """

    instance_id: str
    traj_ids: list[str]
    channels: tuple[str, ...] = ()
    q: np.ndarray | None = None
    q_lin: np.ndarray | None = None
    raw: np.ndarray | None = None
    evidence: dict[str, list[Evidence]] = field(default_factory=dict)

    def positions(self, traj_ids: Sequence[str]) -> np.ndarray:
        lookup = {t: i for i, t in enumerate(self.traj_ids)}
        out = []
        for t in traj_ids:
            if t not in lookup:
                raise LatentSiftError(f"rank_subset: {t!r} is not a prepared candidate of {self.instance_id!r}.")
            out.append(lookup[t])
        if len(set(out)) != len(out):
            raise LatentSiftError(f"rank_subset: duplicate traj_ids in the subset of {self.instance_id!r}.")
        return np.asarray(out, dtype=np.int64)


# ---------------------------------------------------------------------- shared plumbing
def _as_pools(pools: Pool | Iterable[Pool] | Iterable[Trajectory]) -> list[Pool]:
    if isinstance(pools, Pool):
        return [pools]
    items = list(pools)
    if items and all(isinstance(p, Trajectory) for p in items):
        by: dict[str, list[Trajectory]] = {}
        for t in items:
            by.setdefault(t.instance_id, []).append(t)
        return [Pool(i, c) for i, c in sorted(by.items())]
    if not all(isinstance(p, Pool) for p in items):
        raise param_error("pools", "prepare", "a Pool, a list of Pools or a list of Trajectories", "other objects")
    return items


def _check_pools(pools: list[Pool]) -> None:
    seen: set[str] = set()
    for p in pools:
        if not p.candidates:
            raise LatentSiftError(f"The pool of {p.instance_id!r} has no candidate.")
        for c in p.candidates:
            if c.instance_id != p.instance_id:
                raise LatentSiftError(f"Candidate {c.traj_id!r} has instance {c.instance_id!r} but is in the pool "
                                      f"of {p.instance_id!r}.")
            if c.traj_id in seen:
                raise LatentSiftError(f"Candidate {c.traj_id!r} appears twice in the pools.")
            seen.add(c.traj_id)


def resolve_states(states: Any, traj_ids: Sequence[str], fingerprint: Any = None, *, owner: str = "prepare",
                   need_fingerprint: bool = True):
    """(dict traj_id -> TrajectoryStates, fingerprint) from a dict or a states store.

    A store's own fingerprint is used unless ``fingerprint`` is given; a plain dict needs
    ``fingerprint`` (unless ``need_fingerprint`` is False, then None is returned for it).
    """
    if states is None:
        raise param_error("states", owner, "a dict of TrajectoryStates or a states store", None)
    if hasattr(states, "load") and hasattr(states, "fingerprint") and not isinstance(states, Mapping):
        fp = states.fingerprint if fingerprint is None else fingerprint
        loaded = states.load(list(traj_ids))
    elif isinstance(states, Mapping):
        fp, loaded = fingerprint, states
    else:
        raise param_error("states", owner, "a dict of TrajectoryStates or a states store", type(states).__name__)
    if fp is None and need_fingerprint:
        raise LatentSiftError(f"{owner}: pass fingerprint= (the model fingerprint of the states) when states "
                              "is a plain dict; it is checked against the bank's.")
    missing = [t for t in traj_ids if t not in loaded]
    if missing:
        raise LatentSiftError(f"{owner}: no states for {len(missing)} candidate(s), e.g. {missing[0]!r}; "
                              "extract them first (latentsift extract).")
    out = {}
    for t in traj_ids:
        s = loaded[t]
        if not isinstance(s, TrajectoryStates):
            raise param_error("states", owner, "TrajectoryStates values", f"{type(s).__name__} for {t!r}")
        out[t] = s
    return out, (None if fp is None else as_fingerprint(fp, owner))


class Stage1Filter:
    """Base of the Stage-1 filters: ``prepare`` / ``rank_subset`` / ``score`` (see module docstring)."""

    name = "filter"

    def __init__(self, *, min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC, seed: int = 0):
        min_keep, frac = check_retention(min_keep, frac, f"{type(self).__name__} (--min-keep/--frac)")
        self.min_keep = min_keep
        self.frac = frac
        self.seed = seed

    def get_params(self) -> dict:
        return {"min_keep": self.min_keep, "frac": self.frac, "seed": self.seed}

    def prepare(self, pool: Pool | Sequence[Trajectory], states: Any = None, *, fingerprint: Any = None) -> Prepared:
        pools = _as_pools(pool)
        if len(pools) != 1:
            raise LatentSiftError(f"prepare takes the candidates of one instance; got {len(pools)} instances "
                                  "(use prepare_many).")
        return self.prepare_many(pools, states, fingerprint=fingerprint)[pools[0].instance_id]

    def prepare_many(self, pools, states: Any = None, *, fingerprint: Any = None) -> dict[str, Prepared]:
        raise NotImplementedError

    def _rank(self, prepared: Prepared, idx: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def rank_subset(self, prepared: Prepared, traj_ids: Sequence[str]) -> dict[str, float]:
        """Final score s of each candidate in ``traj_ids``, ranked within that subset only."""
        idx = prepared.positions(traj_ids)
        s = self._rank(prepared, idx)["s"]
        return {prepared.traj_ids[i]: float(v) for i, v in zip(idx, s)}

    def retained_subset(self, prepared: Prepared, traj_ids: Sequence[str]) -> list[str]:
        """The candidates of ``traj_ids`` that Stage 1 keeps (sorted by traj_id)."""
        sc = self.rank_subset(prepared, traj_ids)
        ids = sorted(sc)
        mask = select_retained([sc[t] for t in ids], ids, seed=self.seed, min_keep=self.min_keep, frac=self.frac)
        return [t for t, m in zip(ids, mask) if m]

    def _result(self, prepared: Prepared) -> PoolResult:
        idx = np.arange(len(prepared.traj_ids))
        rk = self._rank(prepared, idx)
        mask = select_retained(rk["s"], prepared.traj_ids, seed=self.seed, min_keep=self.min_keep, frac=self.frac)
        cands = []
        for i, t in enumerate(prepared.traj_ids):
            c = CandidateScore(traj_id=t, instance_id=prepared.instance_id, s=float(rk["s"][i]),
                               retained=bool(mask[i]))
            if prepared.q is not None and "r" in rk:
                c.q = {ch: (None if np.isnan(prepared.q[i, j]) else float(prepared.q[i, j]))
                       for j, ch in enumerate(prepared.channels)}
                c.r = {ch: float(rk["r"][j, i]) for j, ch in enumerate(prepared.channels)}
                c.s_dist = float(rk["s_dist"][i])
            if prepared.q_lin is not None and "s_lin" in rk:
                c.q_lin = float(prepared.q_lin[i])
                c.s_lin = float(rk["s_lin"][i])
            if prepared.raw is not None:
                c.raw = float(prepared.raw[i])
            c.evidence = list(prepared.evidence.get(t, []))
            cands.append(c)
        return PoolResult(prepared.instance_id, self.name, int(mask.sum()), cands)

    def score(self, pool: Pool | Sequence[Trajectory], states: Any = None, *, fingerprint: Any = None) -> PoolResult:
        """Score one pool: every field per candidate and the retained set."""
        return self._result(self.prepare(pool, states, fingerprint=fingerprint))

    def score_pools(self, pools, states: Any = None, *, fingerprint: Any = None) -> list[PoolResult]:
        """``score`` for many pools (one search per channel for all of them), sorted by instance."""
        prep = self.prepare_many(pools, states, fingerprint=fingerprint)
        return [self._result(prep[i]) for i in sorted(prep)]


# ---------------------------------------------------------------------- LatentSift
class LatentSift(Stage1Filter):
    """The paper's Stage-1 filter: distance branch (banks) fused with the learned branch (scorer).

    Settings: ``channels`` (subset for the ablation; s_dist = min rank over it), ``distance``
    ("two-sided" margin d_neg - d_pos, or the one-sided "pos" (-d_pos) / "neg" (d_neg)),
    ``weighting`` ("linear" step weights t, or "uniform"), ``branches`` ("both", "distance" only,
    "learned" only), ``fusion_weight`` (s = w s_dist + (1 - w) s_lin), ``min_keep`` / ``frac``
    (retain max(min_keep, floor(frac K))), ``seed`` (retention tie rule), ``n_evidence`` (strongest
    steps reported per channel, 0 = none).

    The bank is always required: it carries the fingerprint and the instance guard. The scorer may
    be None only with ``branches="distance"``.
    """

    name = "latentsift"

    def __init__(self, bank: Bank, scorer: LinearScorer | None = None, *, channels: Sequence[str] = CHANNELS,
                 distance: str = "two-sided", weighting: str = "linear", branches: str = "both",
                 fusion_weight: float = FUSION_WEIGHT, min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC,
                 seed: int = 0, n_evidence: int = N_EVIDENCE):
        super().__init__(min_keep=min_keep, frac=frac, seed=seed)
        self.bank = bank
        self.scorer = scorer
        self.channels = tuple(channels)
        self.distance = distance
        self.weighting = weighting
        self.branches = branches
        self.fusion_weight = fusion_weight
        self.n_evidence = n_evidence
        self._check()

    def get_params(self) -> dict:
        return {"channels": list(self.channels), "distance": self.distance, "weighting": self.weighting,
                "branches": self.branches, "fusion_weight": self.fusion_weight, "n_evidence": self.n_evidence,
                **super().get_params()}

    def _check(self) -> None:
        o = "LatentSift"
        if not isinstance(self.bank, Bank):
            raise param_error("bank", o, "a fitted Bank", type(self.bank).__name__)
        self.bank._check_fitted()
        check_choice(self.branches, "branches", o, BRANCHES)
        check_choice(self.distance, "distance", o, DISTANCES)
        check_choice(self.weighting, "weighting", o, WEIGHTINGS)
        if not self.channels or len(set(self.channels)) != len(self.channels):
            raise param_error("channels", o, f"a non-empty subset of {list(CHANNELS)} without repeats",
                              list(self.channels))
        for c in self.channels:
            check_choice(c, "channels", o, CHANNELS)
            if c not in self.bank.channels:
                raise LatentSiftError(f"The bank indexes channels {list(self.bank.channels)}; channel {c!r} "
                                      "was asked for.")
        if isinstance(self.fusion_weight, bool) or not isinstance(self.fusion_weight, (int, float)) \
                or not 0.0 <= self.fusion_weight <= 1.0:
            raise param_error("fusion_weight", o, "a float in [0, 1]", self.fusion_weight)
        if self.branches != "distance":
            if not isinstance(self.scorer, LinearScorer):
                raise param_error("scorer", o, f"a fitted LinearScorer when branches={self.branches!r}",
                                  type(self.scorer).__name__)
            self.scorer._check_fitted()
            if self.scorer.fingerprint_ is not None:
                self.bank.fingerprint_.check_same(self.scorer.fingerprint_, "scorer")
        if isinstance(self.n_evidence, bool) or not isinstance(self.n_evidence, (int, np.integer)) \
                or self.n_evidence < 0:
            raise param_error("n_evidence", o, "an int >= 0", self.n_evidence)

    @property
    def _uses_distance(self) -> bool:
        return self.branches in ("both", "distance")

    @property
    def _uses_learned(self) -> bool:
        return self.branches in ("both", "learned")

    def prepare_many(self, pools, states: Any = None, *, fingerprint: Any = None) -> dict[str, Prepared]:
        """q per channel and q_lin of every candidate of every pool (guards checked first)."""
        pools = _as_pools(pools)
        _check_pools(pools)
        if not pools:  # e.g. every pool left out by the leak guard
            return {}
        cands = sorted((c for p in pools for c in p.candidates), key=lambda c: c.traj_id)
        ids = [c.traj_id for c in cands]
        self.bank.check_candidates([c.instance_id for c in cands], ids)
        st, fp = resolve_states(states, ids, fingerprint, owner="LatentSift.prepare")
        self.bank.check_fingerprint(fp, "pool states")
        if self._uses_learned:
            self.scorer.check_fingerprint(fp, "pool states")
        n = len(ids)
        q = np.full((n, len(self.channels)), np.nan) if self._uses_distance else None
        evidence: dict[str, list[Evidence]] = {t: [] for t in ids}
        if self._uses_distance:
            for j, ch in enumerate(self.channels):
                q[:, j] = self._channel(ch, [st[t] for t in ids], ids, evidence)
        q_lin = self.scorer.decision_function([st[t] for t in ids]) if self._uses_learned else None
        pos = {t: i for i, t in enumerate(ids)}
        out = {}
        for p in pools:
            tids = sorted(c.traj_id for c in p.candidates)
            rows = np.array([pos[t] for t in tids], dtype=np.int64)
            out[p.instance_id] = Prepared(
                instance_id=p.instance_id, traj_ids=tids, channels=self.channels if q is not None else (),
                q=None if q is None else q[rows], q_lin=None if q_lin is None else q_lin[rows],
                evidence={t: evidence[t] for t in tids})
        return out

    def _channel(self, ch: str, sts: list[TrajectoryStates], ids: list[str],
                 evidence: dict[str, list[Evidence]]) -> np.ndarray:
        """q_c of every candidate (Eq. 2) with one bank search for all their channel-c states."""
        cid = CHANNEL_ID[ch]
        zs, steps, owner = [], [], []
        for i, s in enumerate(sts):
            sel = np.asarray(s.channel) == cid
            zs.append(s.distance_states(self.bank.layer)[sel])
            steps.append(np.asarray(s.step)[sel])
            owner.append(np.full(int(sel.sum()), i, dtype=np.int64))
        d = self.bank.d_model_
        z = np.concatenate(zs).reshape(-1, d) if zs else np.zeros((0, d), np.float32)
        t = np.concatenate(steps).astype(np.int64)
        o = np.concatenate(owner)
        if z.shape[0] == 0:
            return np.full(len(sts), np.nan)
        d_pos, d_neg, i_pos, i_neg = self.bank.distances(z, ch)
        qc = channel_scores_grouped(d_pos, d_neg, t, o, len(sts), distance=self.distance, weighting=self.weighting)
        if self.n_evidence:
            self._evidence(ch, t, o, d_pos, d_neg, i_pos, i_neg, ids, evidence)
        return qc

    def _evidence(self, ch, t, o, d_pos, d_neg, i_pos, i_neg, ids, evidence) -> None:
        """The n_evidence steps with the largest |w_t e_t| / sum w (their share of q_c) per candidate."""
        e = signed_evidence(d_pos, d_neg, self.distance)
        w = t.astype(np.float64) if self.weighting == "linear" else np.ones(len(t))
        wsum = np.bincount(o, weights=w, minlength=len(ids))
        if self.weighting == "linear":  # only step 0 present -> plain mean
            flat = wsum[o] == 0
            w = np.where(flat, 1.0, w)
            wsum = np.bincount(o, weights=w, minlength=len(ids))
        contrib = w * e / wsum[o]
        pos_own = self.bank.pos_owner_[ch][i_pos]
        neg_own = self.bank.neg_owner_[ch][i_neg]
        pos_step = self.bank.pos_step_[ch][i_pos]
        neg_step = self.bank.neg_step_[ch][i_neg]
        order = np.lexsort((t, -np.abs(contrib), o))  # per candidate: strongest first, earlier step on ties
        taken = np.zeros(len(ids), dtype=np.int64)
        for k in order:
            c = o[k]
            if taken[c] >= self.n_evidence:
                continue
            taken[c] += 1
            evidence[ids[c]].append(Evidence(
                channel=ch, step=int(t[k]), evidence=float(e[k]), contribution=float(contrib[k]),
                d_pos=float(d_pos[k]), d_neg=float(d_neg[k]),
                pos_traj=self.bank.traj_ids_[pos_own[k]], pos_step=int(pos_step[k]),
                neg_traj=self.bank.traj_ids_[neg_own[k]], neg_step=int(neg_step[k])))

    def _rank(self, prepared: Prepared, idx: np.ndarray) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        if self._uses_distance:
            r = np.stack([normalized_ranks(prepared.q[idx, j]) for j in range(len(prepared.channels))])
            out["r"] = r  # r_c: within-subset normalised rank per channel (Eq. 4)
            out["s_dist"] = min_channel_rank(r)  # s_dist = min_c r_c (Eq. 4)
        if self._uses_learned:
            out["s_lin"] = normalized_ranks(prepared.q_lin[idx])  # s_lin: q_lin ranked within the subset
        if self.branches == "both":
            out["s"] = fuse(out["s_dist"], out["s_lin"], self.fusion_weight)  # s = w s_dist + (1-w) s_lin (Eq. 3)
        else:
            out["s"] = out["s_dist"] if self.branches == "distance" else out["s_lin"]
        return out


# ---------------------------------------------------------------------- baselines
class _RuleFilter(Stage1Filter):
    """A baseline: s = normalised within-subset rank of a per-candidate rule score ``raw``."""

    needs_states = False

    def _raw(self, cands: list[Trajectory], states: dict[str, TrajectoryStates] | None) -> np.ndarray:
        raise NotImplementedError

    def prepare_many(self, pools, states: Any = None, *, fingerprint: Any = None) -> dict[str, Prepared]:
        pools = _as_pools(pools)
        _check_pools(pools)
        out = {}
        for p in pools:
            cands = sorted(p.candidates, key=lambda c: c.traj_id)
            st = None
            if states is not None and self.needs_states:
                st, _ = resolve_states(states, [c.traj_id for c in cands], fingerprint, owner=f"{self.name}.prepare",
                                       need_fingerprint=False)
            out[p.instance_id] = Prepared(instance_id=p.instance_id, traj_ids=[c.traj_id for c in cands],
                                          raw=self._raw(cands, st))
        return out

    def _rank(self, prepared: Prepared, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {"s": normalized_ranks(prepared.raw[idx])}


class RandomFilter(_RuleFilter):
    """Random Stage 1: raw = a uniform number in [0, 1) from sha256("random:{seed}:{traj_id}").

    A fixed random order per seed (a draw's retained set is random because draws differ).
    """

    name = "random"

    def _raw(self, cands, states):
        return np.array([int.from_bytes(hashlib.sha256(f"random:{self.seed}:{c.traj_id}".encode()).digest()[:8],
                                        "big") / 2.0 ** 64 for c in cands])


class ShortestTokensFilter(_RuleFilter):
    """Prefer fewer tokens: raw = -n_tokens, from the states (``TrajectoryStates.n_tokens``, the
    tokens the policy saw) or, without states, from ``tokenizer`` over cot + fn + obs text."""

    name = "shortest-tokens"
    needs_states = True

    def __init__(self, *, tokenizer: Any = None, **kw):
        super().__init__(**kw)
        self.tokenizer = tokenizer

    def _raw(self, cands, states):
        vals = []
        for c in cands:
            if states is not None:
                n = int(states[c.traj_id].n_tokens)
                if n <= 0:
                    raise LatentSiftError(f"The states of {c.traj_id!r} record no token count (n_tokens=0); "
                                          "pass a tokenizer instead.")
            elif self.tokenizer is not None:
                text = "".join(s.cot + s.fn + s.obs for s in c.steps)
                n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            else:
                raise LatentSiftError("shortest-tokens needs the candidates' states (n_tokens) or a tokenizer.")
            vals.append(-float(n))
        return np.array(vals)


class ShortestCharsFilter(_RuleFilter):
    """Prefer fewer characters: raw = -(characters of cot + fn + obs over all steps)."""

    name = "shortest-chars"

    def _raw(self, cands, states):
        return np.array([-float(c.n_chars) for c in cands])


class FewestStepsFilter(_RuleFilter):
    """Prefer fewer agent steps: raw = -n_steps."""

    name = "fewest-steps"

    def _raw(self, cands, states):
        return np.array([-float(c.n_steps) for c in cands])


BASELINES: dict[str, type[_RuleFilter]] = {f.name: f for f in (RandomFilter, ShortestTokensFilter,
                                                                 ShortestCharsFilter, FewestStepsFilter)}


def make_baseline(name: str, **kw) -> _RuleFilter:
    """A baseline filter by name: one of ``BASELINES`` (random, shortest-tokens, shortest-chars, fewest-steps)."""
    check_choice(name, "name", "make_baseline", BASELINES)
    return BASELINES[name](**kw)


# ---------------------------------------------------------------------- files in, results out
FILTER_FORMAT = "latentsift-filter"
FILTER_VERSION = 1
METHODS = ("latentsift", *BASELINES)


@dataclass
class FilterRun:
    """The output of ``latentsift filter``: settings, provenance and one ``PoolResult`` per instance."""

    method: str
    settings: dict
    inputs: dict
    fingerprint: dict | None
    pools: list[PoolResult]
    extra: dict = field(default_factory=dict)  # e.g. a sifter's configuration and the shift guard's findings

    def to_dict(self) -> dict:
        return {"format": FILTER_FORMAT, "version": FILTER_VERSION, "method": self.method,
                "settings": jsonable(self.settings), "inputs": self.inputs, "fingerprint": self.fingerprint,
                "n_pools": len(self.pools), "n_candidates": sum(len(p.candidates) for p in self.pools),
                "n_retained": sum(p.n_keep for p in self.pools),
                **jsonable(self.extra), "pools": [p.to_dict() for p in self.pools]}

    def save(self, path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, self.to_dict())


def _is_num(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _is_num_map(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(isinstance(k, str) and _is_num(x) for k, x in v.items()))


#: field -> (check, what it must be) of the records of a filter output (``read_filter_output``).
_STR, _INT = (lambda v: isinstance(v, str), "a string"), (lambda v: isinstance(v, int) and not isinstance(v, bool),
                                                          "an integer")
_NUM, _NUM_MAP = (_is_num, "a number or null"), (_is_num_map, "an object of numbers or null")
_LIST = (lambda v: isinstance(v, list), "a list")
_RECORD_FIELDS = {
    "pool": {"instance_id": _STR, "candidates": _LIST},
    "candidate": {"traj_id": _STR, "s": _NUM, "retained": (lambda v: isinstance(v, bool), "true or false"),
                  "q": _NUM_MAP, "r": _NUM_MAP, "s_dist": _NUM, "q_lin": _NUM, "s_lin": _NUM, "raw": _NUM,
                  "evidence": (lambda v: v is None or isinstance(v, list), "a list or null")},
    "evidence": {"channel": _STR, "step": _INT, "pos_traj": _STR, "pos_step": _INT, "neg_traj": _STR,
                 "neg_step": _INT, "evidence": _NUM, "contribution": _NUM, "d_pos": _NUM, "d_neg": _NUM},
}


def _check_record(rec: Any, where: str, kind: str) -> None:
    if not isinstance(rec, dict):
        raise LatentSiftError(f"{where}: a {kind} record must be a JSON object. Got {type(rec).__name__} instead.")
    for name, (ok, what) in _RECORD_FIELDS[kind].items():
        required = kind != "candidate" or name in ("traj_id", "s", "retained")
        if name not in rec and not required:
            continue
        if name not in rec or not ok(rec[name]):
            got = "nothing" if name not in rec else repr(rec[name])[:40]
            raise LatentSiftError(f"{where}: field {name!r} must be {what}. Got {got} instead.")


def read_filter_output(path: str | Path) -> dict:
    """A ``latentsift filter`` output, its format and every pool, candidate and evidence record
    checked: a malformed one is a one-line ``LatentSiftError`` naming the file and the record."""
    p = Path(path)
    d = read_json(p)
    if not isinstance(d, dict) or d.get("format") != FILTER_FORMAT:
        fmt = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise LatentSiftError(f"{p} is not a 'latentsift filter' output (format {fmt!r}).")
    if not isinstance(d.get("pools"), list):
        raise LatentSiftError(f"{p}: field 'pools' must be a list. Got {type(d.get('pools')).__name__} instead.")
    for i, pool in enumerate(d["pools"]):
        _check_record(pool, f"{p}: pools[{i}]", "pool")
        for j, c in enumerate(pool["candidates"]):
            where = f"{p}: pools[{i}].candidates[{j}]"
            _check_record(c, where, "candidate")
            for k, e in enumerate(c.get("evidence") or []):
                _check_record(e, f"{where}.evidence[{k}]", "evidence")
    return d


def load_selected_pools(pools_path, instances: Sequence[str] | None = None) -> list:
    """The pools of a canonical JSONL file, only those of ``instances`` when given (unknown ids: error)."""
    pools = load_pools(pools_path)
    if not pools:
        raise LatentSiftError(f"{pools_path} holds no candidate pools: nothing to score.")
    if instances is not None:
        want = set(instances)
        unknown = sorted(want - {p.instance_id for p in pools})
        if unknown:
            raise LatentSiftError(f"{pools_path} has no pool for instance(s) {unknown[:5]}.")
        pools = [p for p in pools if p.instance_id in want]
    return pools


def filter_options(*, method: str = "latentsift", bank_dir=None, scorer_dir=None, sifter_dir=None,
                   bank_choice: str = "all", on_leak: str | None = None, ray_address: str | None = None,
                   bank_shards: int | None = None, approx: str | None = None, distance_only: bool = False,
                   learned_only: bool = False, channels: str | None = None, distance: str | None = None,
                   weighting: str | None = None, fusion_weight: float | None = None) -> dict:
    """Check a ``latentsift filter`` combination of options before any work; the settings they resolve to.

    A sifter (``sifter_dir``) replaces the bank, the scorer and the method, and runs in one process;
    ``bank_choice`` other than "all" needs a sifter; Ray (``ray_address`` / ``bank_shards``) and the
    approximate search (``approx``) exclude each other, and Ray must be installed. A conflict raises
    ``LatentSiftError`` naming the options. Returns ``{"branches", "on_leak"}``: the LatentSift
    branches (both, or one of ``distance_only`` / ``learned_only``) and ``on_leak``, which defaults
    to "error" with a bank (evaluation: a bank holding a pool's instance is leakage) and to "allow"
    with a sifter (deployment: a bank that has seen other attempts at the task is knowledge), and
    ``latentsift``: the LatentSift settings given (``channels`` comma-separated, ``distance``,
    ``weighting``, ``fusion_weight``; None = the filter's default) with the branches. A sifter keeps
    its saved settings, so any of them given with ``sifter_dir`` is refused.
    """
    if distance_only and learned_only:
        raise LatentSiftError("Pass at most one of --distance-only and --learned-only.")
    if ray_address is not None or bank_shards is not None:
        require_ray()
        if approx is not None:
            raise LatentSiftError("Pass --approx or --ray/--bank-shards, not both.")
    if bank_choice != "all" and sifter_dir is None:
        raise LatentSiftError("--bank-choice needs --sifter (a sifter fitted with 'latentsift fit --per-agent').")
    if sifter_dir is not None:
        if bank_dir is not None or scorer_dir is not None or method != "latentsift":
            raise LatentSiftError("--sifter replaces --bank, --scorer and --method: pass only --sifter.")
        if ray_address is not None or bank_shards is not None or approx is not None:
            raise LatentSiftError("--sifter runs in one process: drop --ray, --bank-shards and --approx.")
        given = [o for o, v in (("--channels", channels), ("--distance", distance), ("--weighting", weighting),
                                ("--fusion-weight", fusion_weight), ("--distance-only", distance_only or None),
                                ("--learned-only", learned_only or None)) if v is not None]
        if given:
            raise LatentSiftError(f"--sifter scores with the settings it was fitted with: drop {', '.join(given)}.")
    branches = "distance" if distance_only else "learned" if learned_only else "both"
    chosen = {"channels": None if channels is None else tuple(c.strip() for c in channels.split(",") if c.strip()),
              "distance": distance, "weighting": weighting, "fusion_weight": fusion_weight}
    return {"branches": branches, "on_leak": on_leak or ("allow" if sifter_dir is not None else "error"),
            "latentsift": {k: v for k, v in chosen.items() if v is not None} | {"branches": branches}}


def run_filter(pools_path, states_dir=None, *, bank_dir=None, scorer_dir=None, method: str = "latentsift",
               instances: Sequence[str] | None = None, ray_address: str | None = None, bank_shards: int | None = None,
               approx: str | None = None, on_shift: str | None = None, on_leak: str = "error",
               **settings) -> FilterRun:
    """``latentsift filter``: score every pool of a canonical JSONL file.

    ``method`` is "latentsift" (needs ``bank_dir``, and ``scorer_dir`` unless
    ``branches="distance"``) or a baseline name. ``settings`` go to the filter's constructor
    (``channels``, ``distance``, ``weighting``, ``branches``, ``fusion_weight``, ``min_keep``, ``frac``,
    ``seed``, ``n_evidence``). ``instances`` keeps only those pools. ``ray_address`` /
    ``bank_shards`` search the bank on Ray actors (same results, ``latentsift.scale``); ``approx``
    ("ivf" or "hnsw") searches it approximately with FAISS (off by default). ``on_shift``
    ("warn", "keep-all", "error"; None = no guard) runs the shift guard's state-space check against
    the bank (``latentsift.shift``; a bare bank records no agents, so that check is skipped).
    ``on_leak`` ("error", "skip", "allow"; ``latentsift.leak``) decides, per pool, what happens to a
    pool whose instance is in the bank; the decisions go to the output's ``leak`` section.
    """
    check_choice(method, "method", "run_filter", METHODS)
    check_choice(on_leak, "on_leak", "filter", ON_LEAK)
    if on_shift is not None:
        check_choice(on_shift, "on_shift", "run_filter", ON_SHIFT)
    pools = load_selected_pools(pools_path, instances)
    store = StateStore(states_dir).open() if states_dir is not None else None
    inputs = {"pools": str(Path(pools_path).resolve()),
              "states_dir": None if states_dir is None else str(Path(states_dir).resolve())}
    if method == "latentsift":
        if bank_dir is None or store is None:
            raise LatentSiftError("The latentsift filter needs --bank and --states.")
        bank = base_bank = Bank.load(bank_dir)
        check_recorded_settings(base_bank.source_.get("store_settings"), store, f"The bank {bank_dir}")
        # scale-out: the same bank searched on Ray shards, or approximately with FAISS
        if approx is not None:
            bank = approx_bank(bank, approx)
            inputs["approx"] = approx
        elif ray_address is not None or bank_shards is not None:
            bank = shard_bank(bank, bank_shards or 2, ray_address=ray_address or "local")
            inputs["bank_shards"] = bank.n_shards_
        scorer = None
        if settings.get("branches", "both") != "distance":
            if scorer_dir is None:
                raise LatentSiftError("The latentsift filter needs --scorer (or --distance-only).")
            scorer = LinearScorer.load(scorer_dir)
            check_recorded_settings(scorer.source_.get("store_settings"), store, f"The scorer {scorer_dir}")
        filt: Stage1Filter = LatentSift(bank, scorer, **settings)
        pools, leak, leak_warnings = apply_on_leak(pools, bank, on_leak)
        inputs |= {"bank_dir": str(Path(bank_dir).resolve()), "bank_repos": bank.repo_names_,
                   "bank_label_counts": bank.label_counts(),
                   "scorer_dir": None if scorer_dir is None or scorer is None else str(Path(scorer_dir).resolve())}
        eval_repos = sorted({c.repo for p in pools for c in p.candidates})
        inputs["repos_shared_with_bank"] = sorted(set(eval_repos) & set(bank.repo_names_))
    else:
        filt = make_baseline(method, **settings)
    try:
        results = filt.score_pools(pools, store, fingerprint=None)
    finally:
        if hasattr(getattr(filt, "bank", None), "close"):
            filt.bank.close()
    fp = store.fingerprint.to_dict() if store is not None else None
    run = FilterRun(method=filt.name, settings=filt.get_params(), inputs=inputs, fingerprint=fp, pools=results)
    if method == "latentsift":
        run.extra["leak"] = {**leak, "warnings": leak_warnings}
    if method == "latentsift" and on_shift is not None:
        # shift guard with a bare bank: it records no agents or scaffolds, so only the
        # state-space check runs (candidates' nearest-bank distances against the bank's own
        # leave-one-instance-out distances)
        states = store.load([c.traj_id for p in pools for c in p.candidates])
        shift, warnings = guard(results, pools, states, base_bank, Reference.from_bank(base_bank), on_shift)
        run.extra["shift"] = {**shift, "warnings": warnings}
    return run
