"""Early pruning: stop hopeless candidates mid-run from their partial states.

Stage 1 of the paper runs after all K candidates finished; the states it reads exist step by step
while the policy writes, so the same scores can stop a candidate early and save *generation* tokens.

Pieces (pipeline order):

- **Prefix cuts** on the stored per-step states (nothing is re-extracted): ``cut_steps`` gives, per
  candidate, how many steps a checkpoint keeps: the first ``t`` steps (schedule ``"steps"``), or the
  steps covering the first fraction ``f`` of its model-written tokens (schedule ``"tokens"``; this
  schedule needs each candidate's final length, so it is an offline yardstick, while the
  ``"steps"`` schedule is what an online loop can run). A checkpoint at or beyond a candidate's
  length means that candidate has *finished*: it can no longer be stopped.
- **Prefix scores** of every Stage-1 filter: :func:`prefix_prepare` (any ``sift.Stage1Filter`` on
  prefix pools and states: the paper's method, its variants, the length baselines, random) and the
  fast path :class:`PrefixSift` (the paper's method with the whole-trajectory bank: nearest-neighbour
  distances of every state are computed once, each prefix only re-aggregates them). At a cut that
  keeps every step, both equal the Stage-1 scores exactly (tested). :class:`PrefixBankSift` uses a
  bank of *prefixes* of the bank trajectories cut the same way (the second kind of bank).
- **The stop rule** :func:`stop_decision`: at a checkpoint, among the alive candidates (running or
  finished), the running ones whose within-pool normalised rank is below ``threshold`` are stopped,
  lowest score first, never leaving fewer alive than Stage 1's keep rule keeps (``sift.keep``; the
  paper's ``max(3, floor(K/2))``, so a pool with fewer candidates than that is never pruned).
- **Offline evaluation**: ``protocol.pruning.evaluate_pruning`` over the protocol's disjoint folds
  (tokens saved, retention, Best@K of the cascade on the survivors; thresholds chosen in-bank).
- **Online** :class:`Pruner`: fed each candidate's states (``states.StateRecorder``) and answering
  at each step boundary which candidates to stop, with scores and evidence.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._core.registry import registry_add, registry_entries, registry_find
from .._core.validation import LatentSiftError, check_choice, param_error
from .margin import channel_scores_grouped
from .rank import normalized_ranks
from .keep import PAPER_KEEP, KeepRule
from .retain import order_by_score
from ..bank.bank import Bank
from .ablations import BRANCH_DISTANCE, BRANCH_LEARNED
from .rules import RANDOM, RuleFilter, make_baseline
from .sift import Evidence, LatentSift, Prepared, Stage1Filter, resolve_states
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import CHANNEL_ID, Pool, Trajectory

SCHEDULES: dict[str, tuple] = {"steps": (2, 4, 8, 16), "tokens": (0.1, 0.25, 0.5, 0.75)}
THRESHOLDS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
TARGET_RETENTION = 0.9
# the prefix bank (one bank and one search per checkpoint) is evaluated on these schedules only: on the
# token schedule its prefixes are most of each trajectory, so it costs a full Stage-1 search per
# checkpoint (bench/prune.py) for what the whole-trajectory bank already measures there
PREFIX_BANK_SCHEDULES = ("steps",)


def min_alive(k: int, rule: KeepRule = PAPER_KEEP) -> int:
    """Candidates never pruned below: what Stage 1 keeps of K (a keep rule whose count is fixed by K;
    the paper's max(3, floor(K/2)), all when K <= 3)."""
    n = rule.count(k)
    if n is None:
        raise param_error("rule", "min_alive", "a keep rule whose count depends on K alone (e.g. FixedKeep)", rule)
    return n


def check_threshold(threshold: Any, owner: str) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) \
            or not 0.0 < float(threshold) <= 1.0:
        raise param_error("threshold", owner, "a float in (0, 1]", threshold)
    return float(threshold)


def check_schedule(kind: Any, checkpoints: Any, owner: str) -> tuple:
    check_choice(kind, "schedule", owner, SCHEDULES)
    cps = tuple(checkpoints)
    if not cps:
        raise param_error("checkpoints", owner, "a non-empty increasing sequence", list(cps))
    for c in cps:
        if kind == "steps" and (isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1):
            raise param_error("checkpoints", owner, "positive ints (steps) for schedule 'steps'", list(cps))
        if kind == "tokens" and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 < c < 1.0):
            raise param_error("checkpoints", owner, "fractions in (0, 1) for schedule 'tokens'", list(cps))
    if list(cps) != sorted(set(cps)):
        raise param_error("checkpoints", owner, "a non-empty increasing sequence", list(cps))
    return cps


# ---------------------------------------------------------------------------------- token counts
@dataclass
class StepTokens:
    """Tokens per step of one recorded trajectory: ``gen`` model-written (cot + fn), ``obs`` observation."""

    gen: np.ndarray
    obs: np.ndarray

    @property
    def n_steps(self) -> int:
        return int(self.gen.shape[0])


def step_tokens(trajs: Sequence[Trajectory], tokenizer) -> dict[str, StepTokens]:
    """Per-step model-written and observation token counts, with the policy's (fast) tokenizer."""
    texts, owner = [], []
    for t in trajs:
        for s in t.steps:
            texts += [s.cot + s.fn, s.obs]
        owner.append(len(t.steps))
    n = [len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    out, i = {}, 0
    for t, k in zip(trajs, owner):
        arr = np.asarray(n[i:i + 2 * k], dtype=np.int64).reshape(k, 2)
        out[t.traj_id] = StepTokens(gen=arr[:, 0], obs=arr[:, 1])
        i += 2 * k
    return out


# ---------------------------------------------------------------------------------- prefix cuts
def cut_length(tok: StepTokens, kind: str, value) -> int:
    """Steps a checkpoint keeps: ``min(t, n_steps)`` (steps) or the fewest steps whose model-written
    tokens reach ``f`` of the trajectory's total (tokens; by steps when it wrote none)."""
    n = tok.n_steps
    if kind == "steps":
        return int(min(value, n))
    total = int(tok.gen.sum())
    if n == 0:
        return 0
    if total == 0:
        return int(min(n, max(1, math.ceil(value * n))))
    return int(min(n, np.searchsorted(np.cumsum(tok.gen), value * total, side="left") + 1))


def cut_states(st: TrajectoryStates, n_steps: int, n_tokens: int | None = None) -> TrajectoryStates:
    """The spans of the first ``n_steps`` steps (steps 0..n_steps-1); ``n_tokens`` of the prefix."""
    step = np.asarray(st.step)
    n_tok = st.n_tokens if n_tokens is None else int(n_tokens)
    if step.size == 0 or np.all(step[1:] >= step[:-1]):  # spans in trajectory order: the prefix is a head (a view)
        m = int(np.searchsorted(step, n_steps, side="left"))
        return TrajectoryStates(traj_id=st.traj_id, layers=st.layers[:m], step=step[:m],
                                channel=np.asarray(st.channel)[:m], n_tokens=n_tok, layer_ids=st.layer_ids)
    keep = step < n_steps
    return TrajectoryStates(traj_id=st.traj_id, layers=st.layers[keep], step=step[keep],
                            channel=np.asarray(st.channel)[keep], n_tokens=n_tok, layer_ids=st.layer_ids)


def cut_trajectory(traj: Trajectory, n_steps: int) -> Trajectory:
    return dataclasses.replace(traj, steps=list(traj.steps[:n_steps]))


def prefix_tokens(tok: StepTokens, n_steps: int) -> int:
    """All tokens (model-written + observations) of the first ``n_steps`` steps."""
    return int(tok.gen[:n_steps].sum() + tok.obs[:n_steps].sum())


def prefix_prepare(filt: Stage1Filter, pools: Sequence[Pool], states: Mapping[str, TrajectoryStates] | None,
                   cut: Mapping[str, int], *, tokens: Mapping[str, StepTokens] | None = None,
                   fingerprint: Any = None) -> dict[str, Prepared]:
    """Any Stage-1 filter on prefixes: pools and states cut to ``cut[traj_id]`` steps, then ``prepare_many``.

    The prefix states' ``n_tokens`` are the prefix's tokens from ``tokens`` (for the token-count
    rule, i.e. 'longest so far'). A candidate with no state of a channel in its prefix is not ranked in that
    channel, and one with no state at all gets the distance branch's neutral rank (``sift.rank``).
    """
    cpools = [Pool(p.instance_id, [cut_trajectory(c, cut[c.traj_id]) for c in p.candidates]) for p in pools]
    cst = None
    if states is not None:
        rule = isinstance(filt, RuleFilter)  # reads n_tokens only: no layers are sliced
        cst = {}
        for p in pools:
            for c in p.candidates:
                n = None if tokens is None else prefix_tokens(tokens[c.traj_id], cut[c.traj_id])
                st = states[c.traj_id]
                cst[c.traj_id] = (TrajectoryStates(c.traj_id, st.layers[:0], np.asarray(st.step)[:0],
                                                   np.asarray(st.channel)[:0], n_tokens=st.n_tokens if n is None else n)
                                  if rule else cut_states(st, cut[c.traj_id], n))
    return filt.prepare_many(cpools, cst, fingerprint=fingerprint)


class PrefixSift:
    """The paper's method (any ``LatentSift`` setting) on prefixes, whole-trajectory bank.

    The distances of every state of the candidates to the bank are computed once (they do not depend
    on the cut); a prefix re-aggregates the evidence of its steps (Eq. 2) and re-runs the learned head
    on its states. Exactly ``LatentSift.prepare_many`` on the cut states (tested at the full cut).
    """

    def __init__(self, filt: LatentSift, pools: Sequence[Pool], states: Mapping[str, TrajectoryStates], *,
                 fingerprint: Any = None, cache: dict | None = None):
        if not isinstance(filt, LatentSift):
            raise param_error("filt", "PrefixSift", "a LatentSift filter", type(filt).__name__)
        self.filt = filt
        self.pools = list(pools)
        ids = sorted(c.traj_id for p in self.pools for c in p.candidates)
        filt.bank.check_candidates([c.instance_id for p in self.pools for c in p.candidates], ids)
        st, fp = resolve_states(states, ids, fingerprint, owner="PrefixSift")
        filt.bank.check_fingerprint(fp, "pool states")
        self.ids, self.states = ids, st
        self.pos = {t: i for i, t in enumerate(ids)}
        self._d: dict[str, tuple] = {}
        self._cache = cache
        if filt._uses_distance:
            for ch in filt.channels:
                cid = CHANNEL_ID[ch]
                key = (id(filt.bank), ch, tuple(ids))  # ``cache``: shared by filters on the same bank and pools
                if cache is not None and key in cache:
                    self._d[ch] = cache[key]
                    continue
                zs, steps, owner = [], [], []
                for i, t in enumerate(ids):
                    sel = np.asarray(st[t].channel) == cid
                    zs.append(st[t].distance_states(filt.bank.layer)[sel])
                    steps.append(np.asarray(st[t].step)[sel].astype(np.int64))
                    owner.append(np.full(int(sel.sum()), i, dtype=np.int64))
                z = np.concatenate(zs).reshape(-1, filt.bank.d_model_)
                s, o = np.concatenate(steps), np.concatenate(owner)
                if z.shape[0]:
                    d_pos, d_neg, _, _ = filt.bank.distances(z, ch)
                else:
                    d_pos = d_neg = np.zeros(0)
                self._d[ch] = (np.asarray(d_pos), np.asarray(d_neg), s, o)
                if cache is not None:
                    cache[key] = self._d[ch]

    def prepare(self, cut: Mapping[str, int]) -> dict[str, Prepared]:
        f, n = self.filt, len(self.ids)
        lim = np.array([cut[t] for t in self.ids], dtype=np.int64)
        q = None
        if f._uses_distance:
            q = np.full((n, len(f.channels)), np.nan)
            for j, ch in enumerate(f.channels):
                d_pos, d_neg, s, o = self._d[ch]
                m = s < lim[o]
                q[:, j] = channel_scores_grouped(d_pos[m], d_neg[m], s[m], o[m], n, distance=f.distance,
                                                 weighting=f.weighting)
        q_lin = None
        if f._uses_learned:
            # ``cache``: the learned branch's prefix scores depend on the scorer and the cut alone, so
            # the filters that share a scorer (both branches, the learned one alone) score each cut once
            key = ("q_lin", id(f.scorer), tuple(self.ids), lim.tobytes())
            q_lin = None if self._cache is None else self._cache.get(key)
            if q_lin is None:
                q_lin = np.full(n, np.nan)
                cs = [cut_states(self.states[t], int(lim[i])) for i, t in enumerate(self.ids)]
                have = [i for i, c in enumerate(cs) if c.scorer_mask().any()]  # no model span yet: ranks lowest
                if have:
                    q_lin[have] = f.scorer.decision_function([cs[i] for i in have])
                if self._cache is not None:
                    self._cache[key] = q_lin
        out = {}
        for p in self.pools:
            tids = sorted(c.traj_id for c in p.candidates)
            rows = np.array([self.pos[t] for t in tids], dtype=np.int64)
            out[p.instance_id] = Prepared(p.instance_id, tids, f.channels if q is not None else (),
                                          None if q is None else q[rows], None if q_lin is None else q_lin[rows])
        return out


class PrefixBankSift:
    """The paper's method with a bank of *prefixes*: bank trajectories cut at the same checkpoint.

    One ``Bank`` per checkpoint (cached), fitted on the bank trajectories' states cut to their own
    prefix at that checkpoint; the learned branch keeps the whole-trajectory scorer.
    """

    def __init__(self, bank_trajs: Sequence[Trajectory], states: Mapping[str, TrajectoryStates], fingerprint,
                 tokens: Mapping[str, StepTokens], scorer=None, *, bank_params: Mapping | None = None,
                 seed: int = 0, **sift_params):
        self.bank_trajs = list(bank_trajs)
        self.states, self.fingerprint, self.tokens = states, fingerprint, tokens
        self.scorer, self.bank_params, self.seed, self.sift_params = scorer, dict(bank_params or {}), seed, sift_params
        self._filters: dict[tuple, LatentSift] = {}

    def filter_at(self, kind: str, value) -> LatentSift:
        key = (kind, value)
        if key not in self._filters:
            cst = {t.traj_id: cut_states(self.states[t.traj_id], cut_length(self.tokens[t.traj_id], kind, value))
                   for t in self.bank_trajs}
            bank = Bank.from_trajectories(self.bank_trajs, cst, self.fingerprint, **self.bank_params)
            counts = bank.state_counts()
            chans = tuple(c for c in bank.channels if counts[c]["pos"] and counts[c]["neg"])
            if not chans:
                raise LatentSiftError(f"The prefix bank at {kind}={value} has no channel with states of both "
                                      "classes; use later checkpoints.")
            self._filters[key] = LatentSift(bank, self.scorer, seed=self.seed, channels=chans,
                                            branches="both" if self.scorer is not None else "distance",
                                            **self.sift_params)
        return self._filters[key]


# ---------------------------------------------------------------------------------- the policies
class SiftPolicy:
    """Prune policy: the paper's method (``branches`` of it) on prefixes, whole-trajectory bank (``PrefixSift``).

    A policy is built per fold from ``(pools, states, fingerprint, tokens, bank_trajs=, bank=, scorer=,
    seed=, cache=)``; ``prepare(kind, value, cut)`` gives the filter and its prefix preparations at one
    checkpoint; ``schedules`` (None: every one) are those it is evaluated on; ``fallbacks`` the
    checkpoints where it fell back to another bank.
    """

    schedules: tuple[str, ...] | None = None

    def __init__(self, branches: str, pools, states, fingerprint, tokens, *, bank=None, scorer=None, seed: int = 0,
                 cache=None, **_):
        self.fallbacks: list[str] = []
        self.filt = LatentSift(bank, scorer if branches != "distance" else None, branches=branches, seed=seed,
                               n_evidence=0)
        self._fast = PrefixSift(self.filt, pools, states, fingerprint=fingerprint, cache=cache)

    def prepare(self, kind, value, cut) -> tuple[Stage1Filter, dict[str, Prepared]]:
        return self.filt, self._fast.prepare(cut)


class PrefixBankPolicy:
    """Prune policy: the paper's method with a bank of prefixes (``PrefixBankSift``); where no prefix bank
    is possible (e.g. one class only) the whole-trajectory bank (recorded in ``fallbacks``)."""

    schedules = PREFIX_BANK_SCHEDULES

    def __init__(self, pools, states, fingerprint, tokens, *, bank_trajs=(), bank=None, scorer=None, seed: int = 0,
                 cache=None, **_):
        self.pools, self.states, self.fp, self.fallbacks = pools, states, fingerprint, []
        self._bank, self._scorer, self._seed, self._cache, self._whole = bank, scorer, seed, cache, None
        self._pb = PrefixBankSift(bank_trajs, states, fingerprint, tokens, scorer, seed=seed, n_evidence=0)

    def prepare(self, kind, value, cut) -> tuple[Stage1Filter, dict[str, Prepared]]:
        try:
            f = self._pb.filter_at(kind, value)
        except LatentSiftError:  # no prefix bank possible here: whole-trajectory bank
            self.fallbacks.append(f"{kind}={value}")
            if self._whole is None:
                self._whole = LatentSift(self._bank, self._scorer, seed=self._seed, n_evidence=0)
                self._whole_fast = PrefixSift(self._whole, self.pools, self.states, fingerprint=self.fp,
                                              cache=self._cache)
            return self._whole, self._whole_fast.prepare(cut)
        return f, prefix_prepare(f, self.pools, self.states, cut, fingerprint=self.fp)


class RulePolicy:
    """Prune policy: a rule filter (a Stage-1 baseline) on prefixes; the rule says which policy it is
    (``register_filter(prune_policy=...)``)."""

    schedules: tuple[str, ...] | None = None

    def __init__(self, rule: str, pools, states, fingerprint, tokens, *, seed: int = 0, **_):
        self.pools, self.states, self.tokens, self.fallbacks = pools, states, tokens, []
        self.filt = make_baseline(rule, seed=seed)

    def prepare(self, kind, value, cut) -> tuple[Stage1Filter, dict[str, Prepared]]:
        return self.filt, prefix_prepare(self.filt, self.pools, self.states, cut, tokens=self.tokens)


# the state policies (kind "prune_policy"); the rule filters add theirs through ``register_filter``
registry_add("prune_policy", LatentSift.name, functools.partial(SiftPolicy, "both"), family="state")
registry_add("prune_policy", f"{LatentSift.name}:prefix-bank", PrefixBankPolicy, family="state")
for _branch in (BRANCH_DISTANCE, BRANCH_LEARNED):  # the branch ablations, named as registered there
    _branches = registry_find("filter", _branch, plugins=False).params["branches"]
    registry_add("prune_policy", _branch, functools.partial(SiftPolicy, _branches), family="state")


def prune_policies(family: str | None = None, *, plugins: bool = True) -> tuple[str, ...]:
    """The prune policies: the registered state policies, then the rule filters' (length rules, then random)."""
    out = [(e.name, e.info["family"]) for e in registry_entries("prune_policy", plugins=plugins)]
    rule = [(e.info["prune_policy"], RANDOM if e.info["key"] == RANDOM else "length")
            for e in registry_entries("filter", plugins=plugins) if e.info.get("prune_policy")]
    out += sorted(rule, key=lambda x: x[1] == RANDOM)  # the length rules first (stable), random last
    return tuple(n for n, f in out if family is None or f == family)


def prune_policy(name: str, *args, **kw):
    """The prune policy ``name`` built for one fold (``SiftPolicy`` / ``PrefixBankPolicy`` / ``RulePolicy``)."""
    check_choice(name, "policy", "evaluate_pruning", prune_policies())
    for e in registry_entries("prune_policy"):
        if e.name == name:
            return e.obj(*args, **kw)
    rule = next(e.name for e in registry_entries("filter") if e.info.get("prune_policy") == name)
    return RulePolicy(rule, *args, **kw)


#: The package's own policies, in report order (state, length, random).
POLICIES = prune_policies(plugins=False)
STATE_POLICIES = prune_policies("state", plugins=False)
LENGTH_POLICIES = prune_policies("length", plugins=False)


# ---------------------------------------------------------------------------------- the stop rule
def stop_decision(ids: Sequence[str], scores: Sequence[float], running: Sequence[bool], threshold: float, k: int,
                  *, seed: int = 0, keep_rule: KeepRule = PAPER_KEEP) -> list[str]:
    """Which of the alive candidates ``ids`` to stop at one checkpoint.

    ``scores``: their prefix scores (higher = better; NaN lowest), ``running``: not finished yet
    (finished candidates are never stopped but count as alive), ``k``: the pool's K. Running
    candidates whose normalised rank among the alive is below ``threshold`` are stopped, lowest
    first (ties by the (seed, traj_id) hash), keeping at least what ``keep_rule`` keeps of K alive
    (the paper's ``max(3, floor(K/2))``).
    """
    threshold = check_threshold(threshold, "stop_decision")
    ids = list(ids)
    room = len(ids) - min_alive(k, keep_rule)
    if room <= 0:
        return []
    s = np.asarray(scores, dtype=np.float64)
    r = normalized_ranks(s)
    order = order_by_score(s, ids, seed=seed)[::-1]  # lowest score first
    out = []
    for i in order:
        if len(out) >= room:
            break
        if running[i] and r[i] < threshold:
            out.append(ids[int(i)])
    return out


@dataclass
class PoolRun:
    """What one policy did to one pool: the step count at which each stopped candidate was stopped."""

    instance_id: str
    stopped: dict[str, int]
    survivors: list[str]


def simulate_pool(pool_ids: Sequence[str], n_steps: Mapping[str, int], cuts: Sequence[Mapping[str, int]],
                  rank_at: Callable[[int, list[str]], Mapping[str, float]], threshold: float, *,
                  seed: int = 0, instance_id: str = "", keep_rule: KeepRule = PAPER_KEEP) -> PoolRun:
    """Run the stop rule over a pool's checkpoints. ``cuts[j][traj_id]`` = steps kept at checkpoint j;
    ``rank_at(j, alive_ids)`` gives their prefix scores. A cut reaching a candidate's length = finished."""
    k = len(pool_ids)
    alive = sorted(pool_ids)
    stopped: dict[str, int] = {}
    for j, cut in enumerate(cuts):
        if len(alive) <= min_alive(k, keep_rule):
            break
        running = [cut[t] < n_steps[t] for t in alive]
        if not any(running):
            break
        sc = rank_at(j, alive)
        for t in stop_decision(alive, [sc[t] for t in alive], running, threshold, k, seed=seed, keep_rule=keep_rule):
            stopped[t] = int(cut[t])
        alive = [t for t in alive if t not in stopped]
    return PoolRun(instance_id, stopped, alive)


def tokens_saved(run: PoolRun, tokens: Mapping[str, StepTokens]) -> tuple[int, int]:
    """(model-written, observation) tokens the stopped candidates would still have produced."""
    gen = sum(int(tokens[t].gen[s:].sum()) for t, s in run.stopped.items())
    obs = sum(int(tokens[t].obs[s:].sum()) for t, s in run.stopped.items())
    return gen, obs


# ---------------------------------------------------------------------------------- online
@dataclass
class PruneDecision:
    """The answer at one step boundary: who to stop now, with the prefix scores and the evidence."""

    step: int
    checked: bool                       # a checkpoint: scores computed and the stop rule applied
    stop: list[str]
    alive: list[str]
    running: list[str]
    scores: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, list[Evidence]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"step": self.step, "checked": self.checked, "stop": self.stop, "alive": self.alive,
                "running": self.running, "scores": self.scores,
                "evidence": {t: [dataclasses.asdict(e) for e in ev] for t, ev in self.evidence.items()}}


class Pruner:
    """Online early pruning for an agent loop running K candidates of one task.

    Feed each candidate's states as they grow (``update(traj_id, recorder.states())``; mark
    ``finished=True`` when it ends) and call ``step(n)`` at each step boundary, ``n`` = steps every
    running candidate has completed. At a checkpoint (schedule ``"steps"``) the filter scores the
    alive candidates' prefixes, ranked among them, and the stop rule answers which to stop.
    ``filter``: any Stage-1 filter (``LatentSift`` with its bank, or a baseline such as
    a rule filter such as shortest-in-tokens = stop the longest so far).
    """

    def __init__(self, filter: Stage1Filter, traj_ids: Sequence[str], *, threshold: float = 0.5,
                 checkpoints: Sequence[int] = SCHEDULES["steps"], instance_id: str = "online",
                 fingerprint: Any = None, seed: int = 0, keep_rule: KeepRule = PAPER_KEEP):
        if not isinstance(filter, Stage1Filter):
            raise param_error("filter", "Pruner", "a Stage-1 filter (latentsift.sift.sift)", type(filter).__name__)
        ids = list(traj_ids)
        if not ids or len(set(ids)) != len(ids):
            raise param_error("traj_ids", "Pruner", "a non-empty list of distinct ids", ids)
        self.filter = filter
        self.k = len(ids)
        self.threshold = check_threshold(threshold, "Pruner")
        self.checkpoints = check_schedule("steps", checkpoints, "Pruner")
        self.instance_id, self.fingerprint, self.seed = instance_id, fingerprint, seed
        self.keep_rule = keep_rule
        min_alive(self.k, keep_rule)  # refuses a rule whose count is not fixed by K
        self.alive = sorted(ids)
        self.finished: set[str] = set()
        self.stopped: dict[str, int] = {}
        self.states: dict[str, TrajectoryStates] = {}
        self.history: list[PruneDecision] = []

    def update(self, traj_id: str, states: TrajectoryStates, *, finished: bool = False) -> None:
        if traj_id not in self.alive:
            raise LatentSiftError(f"Pruner.update: {traj_id!r} is not an alive candidate "
                                  f"({'stopped' if traj_id in self.stopped else 'unknown'}).")
        if not isinstance(states, TrajectoryStates):
            raise param_error("states", "Pruner.update", "TrajectoryStates", type(states).__name__)
        self.states[traj_id] = states
        if finished:
            self.finished.add(traj_id)

    def step(self, n_steps: int) -> PruneDecision:
        running = [t for t in self.alive if t not in self.finished]
        if n_steps not in self.checkpoints or len(self.alive) <= min_alive(self.k, self.keep_rule) or not running:
            d = PruneDecision(n_steps, False, [], list(self.alive), running)
            self.history.append(d)
            return d
        lacking = [t for t in self.alive if t not in self.states]
        if lacking:
            raise LatentSiftError(f"Pruner.step: no states yet for {lacking}; call update() for every alive "
                                  "candidate before the checkpoint.")
        # prefixes of exactly n_steps steps (a running candidate may already hold states of step n_steps)
        st = {t: cut_states(self.states[t], n_steps) for t in self.alive}
        pool = Pool(self.instance_id, [Trajectory(t, self.instance_id, "", "", []) for t in self.alive])
        prep = self.filter.prepare_many([pool], st, fingerprint=self.fingerprint)[self.instance_id]
        sc = self.filter.rank_subset(prep, self.alive)
        stop = stop_decision(self.alive, [sc[t] for t in self.alive], [t not in self.finished for t in self.alive],
                             self.threshold, self.k, seed=self.seed, keep_rule=self.keep_rule)
        for t in stop:
            self.stopped[t] = n_steps
        self.alive = [t for t in self.alive if t not in stop]
        d = PruneDecision(n_steps, True, stop, list(self.alive), [t for t in self.alive if t not in self.finished],
                          scores=sc, evidence={t: list(prep.evidence.get(t, [])) for t in sc})
        self.history.append(d)
        return d
