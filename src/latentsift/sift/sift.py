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
  (``max(3, floor(K/2))`` best by s; ties at the cut by ``retain.select_retained``'s rule; ``keep_rule``, ``sift.keep``).

``states`` is a dict traj_id -> ``TrajectoryStates`` (then pass ``fingerprint=``) or a states store
(any object with ``load(traj_ids)`` and ``fingerprint``, e.g. ``StateStore``).

Missing-channel rule: a candidate with no channel-c state has q_c = NaN (missing) and is not ranked
in channel c: each channel ranks the candidates that have it, m is the minimum over the channels the
candidate is ranked in, and s_dist is m through its distribution under no signal, so that the number of
channels a candidate has does not move it; a candidate ranked in none gets the neutral rank 0.5
(``rank.channel_ranks``, ``rank.null_min_rank``; the why is in ``latentsift.sift.rank``).

Determinism: candidates are processed in traj_id order and every result is keyed by traj_id, so the
output does not depend on the order of the pool; the retention tie rule hashes (seed, traj_id).

The rule filters (baselines) and the registry of every filter are in ``latentsift.sift.rules``; the
output of ``latentsift filter`` (``FilterRun``, ``read_filter_output``) is here, its file driver in
``latentsift._jobs.filter``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .._core.io import atomic_write_json, jsonable, read_json
from .._core.validation import LatentSiftError, check_choice, param_error
from ..bank.bank import Bank, as_fingerprint
from .fuse import FUSION_WEIGHT, fuse
from .margin import DISTANCES, WEIGHTINGS, channel_scores_grouped, signed_evidence
from .rank import channel_ranks, normalized_ranks, null_min_rank
from .keep import FixedKeep, KeepRule
from .retain import KEEP_FRAC, MIN_KEEP, check_retention
from .scorer import LinearScorer
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import CHANNEL_ID, CHANNELS, Pool, Trajectory, load_pools

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

    q, r: per channel (q None = the channel is missing for this candidate; r None = not ranked in it:
    missing, or the only candidate with the channel; s_dist is the minimum of the other r through its
    distribution under no signal, ``rank.null_min_rank``).
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
def as_pools(pools: Pool | Iterable[Pool] | Iterable[Trajectory]) -> list[Pool]:
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


def check_pools(pools: list[Pool]) -> None:
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

    @property
    def keep_rule(self) -> KeepRule:
        """Stage 1's keep rule of this filter: the paper's ``FixedKeep(min_keep, frac, seed)``."""
        return FixedKeep(self.min_keep, self.frac, self.seed)

    def prepare(self, pool: Pool | Sequence[Trajectory], states: Any = None, *, fingerprint: Any = None) -> Prepared:
        pools = as_pools(pool)
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
        mask = self.keep_rule.keep([sc[t] for t in ids], ids)
        return [t for t, m in zip(ids, mask) if m]

    def _result(self, prepared: Prepared) -> PoolResult:
        idx = np.arange(len(prepared.traj_ids))
        rk = self._rank(prepared, idx)
        mask = self.keep_rule.keep(rk["s"], prepared.traj_ids)
        cands = []
        for i, t in enumerate(prepared.traj_ids):
            c = CandidateScore(traj_id=t, instance_id=prepared.instance_id, s=float(rk["s"][i]),
                               retained=bool(mask[i]))
            if prepared.q is not None and "r" in rk:
                c.q = {ch: (None if np.isnan(prepared.q[i, j]) else float(prepared.q[i, j]))
                       for j, ch in enumerate(prepared.channels)}
                c.r = {ch: (None if np.isnan(rk["r"][j, i]) else float(rk["r"][j, i]))
                       for j, ch in enumerate(prepared.channels)}
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
def check_sift_settings(settings: Mapping[str, Any], owner: str | Mapping[str, str]) -> None:
    """The value checks of ``LatentSift``'s settings that need no bank (``branches``, ``distance``, ``weighting``,
    ``channels``, ``fusion_weight``, ``n_evidence``; those absent are not checked). ``owner``: who is told,
    one name, or per setting (a command's options: ``{"distance": "filter (--distance)", ...}``)."""
    def who(name: str) -> str:
        return owner if isinstance(owner, str) else owner.get(name, name)

    def given(name: str) -> bool:
        return settings.get(name) is not None

    for name, allowed in (("branches", BRANCHES), ("distance", DISTANCES), ("weighting", WEIGHTINGS)):
        if given(name):
            check_choice(settings[name], name, who(name), allowed)
    if given("channels"):
        chans = list(settings["channels"])
        if not chans or len(set(chans)) != len(chans):
            raise param_error("channels", who("channels"), f"a non-empty subset of {list(CHANNELS)} without repeats",
                              chans)
        for c in chans:
            check_choice(c, "channels", who("channels"), CHANNELS)
    w = settings.get("fusion_weight")
    if given("fusion_weight") and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0):
        raise param_error("fusion_weight", who("fusion_weight"), "a float in [0, 1]", w)
    n = settings.get("n_evidence")
    if given("n_evidence") and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
        raise param_error("n_evidence", who("n_evidence"), "an int >= 0", n)


class LatentSift(Stage1Filter):
    """The paper's Stage-1 filter: distance branch (banks) fused with the learned branch (scorer).

    Settings: ``channels`` (subset for the ablation; s_dist from the min rank over it), ``distance``
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
        check_sift_settings({"branches": self.branches, "distance": self.distance, "weighting": self.weighting,
                             "channels": self.channels, "fusion_weight": self.fusion_weight,
                             "n_evidence": self.n_evidence}, o)
        for c in self.channels:
            if c not in self.bank.channels:
                raise LatentSiftError(f"The bank indexes channels {list(self.bank.channels)}; channel {c!r} "
                                      "was asked for.")
        if self.branches != "distance":
            if not isinstance(self.scorer, LinearScorer):
                raise param_error("scorer", o, f"a fitted LinearScorer when branches={self.branches!r}",
                                  type(self.scorer).__name__)
            self.scorer._check_fitted()
            if self.scorer.fingerprint_ is not None:
                self.bank.fingerprint_.check_same(self.scorer.fingerprint_, "scorer")

    @property
    def _uses_distance(self) -> bool:
        return self.branches in ("both", "distance")

    @property
    def _uses_learned(self) -> bool:
        return self.branches in ("both", "learned")

    def prepare_many(self, pools, states: Any = None, *, fingerprint: Any = None) -> dict[str, Prepared]:
        """q per channel and q_lin of every candidate of every pool (guards checked first)."""
        pools = as_pools(pools)
        check_pools(pools)
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
            r = np.stack([channel_ranks(prepared.q[idx, j]) for j in range(len(prepared.channels))])
            out["r"] = r  # r_c: within-subset normalised rank per channel among its holders (Eq. 4)
            out["s_dist"] = null_min_rank(r)  # min_c r_c over the ranked channels (Eq. 4) through its null (Eq. 4')
        if self._uses_learned:
            out["s_lin"] = normalized_ranks(prepared.q_lin[idx])  # s_lin: q_lin ranked within the subset
        if self.branches == "both":
            out["s"] = fuse(out["s_dist"], out["s_lin"], self.fusion_weight)  # s = w s_dist + (1-w) s_lin (Eq. 3)
        else:
            out["s"] = out["s_dist"] if self.branches == "distance" else out["s_lin"]
        return out


# ---------------------------------------------------------------------- files in, results out
FILTER_FORMAT = "latentsift-filter"
FILTER_VERSION = 1


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
