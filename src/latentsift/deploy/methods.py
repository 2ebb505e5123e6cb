"""The deployable methods: every score that ``crossval`` reports, as something ``fit`` learns and ``filter`` applies.

A method is read from the one registry of Stage-1 filters (``latentsift.sift.rules``); nothing is registered
here. A registered filter is deployable by what its registration says:

- kind "state" or "ablation" (the paper's method, its branches ``branch:distance`` / ``branch:learned``, its
  channel subsets, ...): family ``paper``, the paper's bank and gated scorer with the entry's ``params``;
- ``variant:fusion:fitted``: family ``fusion``, the paper's bank and scorer with the fusion weight of Eq. 3
  fitted on cross-fitted bank scores (``sift.variants.fit_fusion_weight``);
- a variant with ``signals`` (the logistic probe ``variant:probe``, the stacked fusions ``variant:stack:*``):
  family ``stack``, the weights of a logistic regression on within-pool ranks of cross-fitted signals
  (``sift.variants.fit_stack``), the bank when it fuses a channel margin, the probe when it fuses it;
- kind "rule" (``shortest-chars``, ``fewest-steps``, ...): family ``rule``, nothing learned; it needs states
  only when the rule reads them (``RuleFilter.needs_states``: ``shortest-tokens``).

The representation variants (``variant:layer:*``, ``variant:norm:*``, ``variant:center:*``,
``variant:scaffold-bank``) are evaluated by ``crossval`` but not deployable (their factories need the fold's
paper scores); ``methods()`` leaves them out. A new rule, ablation or stacked fusion is deployable from its
registration alone.

Evidence per family (what ``filter`` writes per candidate besides s and retained): ``paper`` and
``fusion``: q and r per channel, s_dist, q_lin, s_lin and the strongest steps with their nearest bank states
(the branches give their own branch's fields only); ``stack``: s only, the weights in the output's
``configuration``; ``rule``: raw, the rule's value (e.g. minus the characters).

``recommend`` is the declared choice of ``fit --method auto`` and of the "recommended" row of ``crossval``:
among ``AUTO_CANDIDATES``, the highest inner-CV within-pool AUC (``CRITERION``), ties (equal at ``TIE_DECIMALS``
decimals) to the cheaper (``Method.cost``: a free rule first).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .._core.validation import LatentSiftError
from ..bank.bank import Bank, Fold, inner_folds
from ..metrics.diagnostics import within_pool_auc
from ..sift.ablations import BRANCH_DISTANCE, BRANCH_LEARNED
from ..sift.rules import EXAMPLES_PASSED, PAPER, RANDOM, FilterEntry, filters
from ..sift.scorer import early_stopping_groups
from ..sift.sift import LatentSift, Prepared, as_pools, resolve_states
from ..sift.variants import (FITTED_FUSION, PROBE, STACK_STATES_LENGTH, LogisticProbe, StackedFilter,
                             cross_fitted_branches, fit_fusion_weight, fit_stack, pool_rank_features, probe_features,
                             probe_once, trajectory_signals)
from ..trajectories.trajectory import Trajectory

#: ``fit --method auto``: the recommendation (``recommend``) instead of one method.
AUTO = "auto"
#: The family of each deployable kind of registration (module docstring).
FAMILIES = ("paper", "fusion", "stack", "rule")
#: Tie order: a free rule first (no model to run), then a rule that reads the states (shortest-tokens: the
#: extraction's token counts) and a stack without states, then the bank's methods.
_COST = {"rule": 0, "rule-states": 1, "stack-free": 1, "paper": 2, "stack": 3, "fusion": 3}
#: Per family, what ``filter`` reports per candidate (module docstring; ``sifter.json`` records it).
EVIDENCE = {"paper": "q and r per channel, s_dist, q_lin, s_lin, the strongest steps and their nearest bank "
                          "states (a branch: its own fields)",
            "fusion": "as the paper's method, with the fitted fusion weight in the configuration",
            "stack": "s only; the fused signals and their weights in the configuration",
            "rule": "raw: the rule's value per candidate"}
#: The criterion of the recommendation.
CRITERION = "inner-CV within-pool AUC (2 inner folds by repository, by task when the runs hold one; ties 1/2)"
#: Two inner-CV AUCs are a tie when equal at this many decimals; the cheaper wins a tie.
TIE_DECIMALS = 3
_STATE_SIGNALS = ("q_cot", "q_obs", "q_fn", "probe")


@dataclass(frozen=True)
class Method:
    """One deployable method: its registered ``name`` (``fit --method``), results ``key`` (crossval's tables),
    ``label``, ``family`` (``FAMILIES``), whether it ``needs_states``, its tie ``cost``, the LatentSift
    ``params`` it changes (family paper), the ``signals`` it fuses (family stack) and the registry entry."""

    name: str
    key: str
    label: str
    family: str
    needs_states: bool
    cost: int
    params: dict = field(default_factory=dict)
    signals: tuple[str, ...] = ()
    entry: FilterEntry | None = field(default=None, repr=False, compare=False)

    @property
    def evidence(self) -> str:
        return EVIDENCE[self.family]

    @property
    def needs_bank(self) -> bool:
        """A method that reads states keeps a bank of them: the paper's family and a stack of channel margins score
        against it, and for every such method it carries the model fingerprint (states of another model are
        refused) and the shift and leak guards' references."""
        return self.needs_states

    @property
    def needs_scorer(self) -> bool:
        return self.family in ("paper", "fusion")

    def describe(self) -> dict:
        """What ``sifter.json`` records of the method."""
        return {"name": self.name, "key": self.key, "family": self.family, "needs_states": self.needs_states,
                "evidence": self.evidence, **({"params": self.params} if self.params else {}),
                **({"signals": list(self.signals)} if self.signals else {})}


def _method(e: FilterEntry) -> Method | None:
    common = dict(name=e.name, key=e.key, label=e.label, entry=e)
    if e.kind in ("state", "ablation"):
        return Method(family="paper", needs_states=True, cost=_COST["paper"], params=dict(e.params or {}),
                      **common)
    if e.kind == "variant" and e.name == FITTED_FUSION:
        return Method(family="fusion", needs_states=True, cost=_COST["fusion"], **common)
    if e.kind == "variant" and e.signals is not None:
        states = any(s in _STATE_SIGNALS for s in e.signals)
        return Method(family="stack", needs_states=states, cost=_COST["stack" if states else "stack-free"],
                      signals=tuple(e.signals), **common)
    if e.kind == "rule":
        states = bool(getattr(e.factory, "needs_states", False))
        return Method(family="rule", needs_states=states, cost=_COST["rule-states" if states else "rule"], **common)
    return None


def methods() -> list[Method]:
    """Every deployable method, in registration order (module docstring)."""
    return [m for m in map(_method, filters()) if m is not None]


def method_names() -> tuple[str, ...]:
    """``fit --method``'s choices: every deployable method's name, then ``AUTO``."""
    return tuple(m.name for m in methods()) + (AUTO,)


def get_method(name: str) -> Method:
    """The deployable method of a registered name or results key; one line naming the choices otherwise."""
    for m in methods():
        if name in (m.name, m.key):
            return m
    raise LatentSiftError(f"Unknown method {name!r}; deployable: {', '.join(method_names())}.")


#: ``fit --method auto``'s declared candidates (names; a premise-only rule joins where its record is present).
AUTO_CANDIDATES = (PAPER, BRANCH_DISTANCE, BRANCH_LEARNED, PROBE, FITTED_FUSION, STACK_STATES_LENGTH)


def auto_candidates(trajs: Sequence[Trajectory], *, states: bool = True) -> list[Method]:
    """The candidates of the recommendation on ``trajs``: ``AUTO_CANDIDATES`` (with ``states``), and the free rules
    but random and the docstring examples' pass share (an execution outcome, not a free rule: new pools need the
    examples run), a premise-only one where its record is present, shortest-tokens with ``states``."""
    out = [get_method(n) for n in AUTO_CANDIDATES] if states else []
    for m in methods():
        if m.family != "rule" or m.key in (RANDOM, EXAMPLES_PASSED) or (m.needs_states and not states):
            continue
        if m.entry.premise_only and m.entry.factory.absent(list(trajs)) is not None:
            continue
        out.append(m)
    return out


def recommend(evidence: Mapping[str, float | None], candidates: Sequence[Method]) -> tuple[str, str]:
    """(chosen method's name, the reason in one line): the highest ``evidence`` (name -> inner-CV AUC; None/NaN
    is not a candidate), ties at ``TIE_DECIMALS`` decimals to the lower ``cost``, then the earlier candidate."""
    ok = [m for m in candidates if evidence.get(m.name) is not None and math.isfinite(evidence[m.name])]
    if not ok:
        raise LatentSiftError("recommend: no candidate has an inner-CV within-pool AUC (no mixed pool in the "
                              "labelled runs' inner folds).")
    best = max(ok, key=lambda m: (round(evidence[m.name], TIE_DECIMALS), -m.cost, -candidates.index(m)))
    top = max(evidence[m.name] for m in ok)
    tied = [m.name for m in ok if round(evidence[m.name], TIE_DECIMALS) == round(evidence[best.name], TIE_DECIMALS)
            and m is not best]
    why = (f"highest {CRITERION.split(' (')[0]} {evidence[best.name]:.3f}"
           + (f" (tied at {TIE_DECIMALS} decimals with {', '.join(tied)}: the cheaper wins)" if tied else "")
           + ("" if evidence[best.name] == top else f"; the best was {top:.3f}"))
    return best.name, why


def method_line(config: Mapping) -> str:
    """The one line ``fit`` and ``filter`` print: the method a sifter uses and why (its ``config_``)."""
    choice = config.get("choice") or {}
    how = "chosen by --method auto: " + choice.get("reason", "") if choice.get("auto") else "asked with --method"
    states = "" if (config.get("method_info") or {}).get("needs_states", True) else "; needs no states"
    return f"Method: {config['method']} ({how}{states})"


# ------------------------------------------------------------------------ the probe as saved arrays
@dataclass
class ProbeWeights:
    """A fitted ``LogisticProbe`` as the arrays it scores with (standardisation, coefficients, intercept, layers):
    what a sifter saves, and scores with before saving and after loading alike."""

    layers: tuple[int, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float

    @classmethod
    def from_probe(cls, probe: LogisticProbe) -> "ProbeWeights":
        scaler, lr = probe.model_[0], probe.model_[-1]
        return cls(tuple(int(x) for x in probe.layers_), np.asarray(scaler.mean_, np.float64),
                   np.asarray(scaler.scale_, np.float64), np.asarray(lr.coef_[0], np.float64), float(lr.intercept_[0]))

    def decision_function(self, states) -> np.ndarray:
        x = probe_features(states, self.layers).astype(np.float64)
        return ((x - self.mean) / self.scale) @ self.coef + self.intercept

    def arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "scale": self.scale, "coef": self.coef,
                "intercept": np.array([self.intercept]), "layers": np.array(self.layers, np.int64)}

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> "ProbeWeights":
        return cls(tuple(int(x) for x in a["layers"]), a["mean"], a["scale"], a["coef"], float(a["intercept"][0]))


# ------------------------------------------------------------------------ cross-fitted signals of a bank
def fold_distance(fold: Fold, states, fingerprint, *, seed: int = 0) -> dict[str, dict[str, float]]:
    """traj_id -> channel -> q of the paper's distance branch for the evaluation pools of one fold,
    with a bank of the fold's bank side."""
    bank = Bank.from_trajectories(fold.bank_trajs, states, fingerprint)
    q: dict[str, dict[str, float]] = {}
    for p in LatentSift(bank, None, branches="distance", seed=seed).prepare_many(
            fold.eval_pools, states, fingerprint=fingerprint).values():
        for r, t in enumerate(p.traj_ids):
            q[t] = {c: float(p.q[r, j]) for j, c in enumerate(p.channels)}
    return q


def cross_fitted_signals(bank_trajs: Sequence[Trajectory], states, fingerprint, group, *, signals: Sequence[str],
                         seed: int = 0, fits: dict | None = None
                         ) -> tuple[dict[str, dict[str, float]], dict[str, int], int]:
    """(traj_id -> signal -> value, traj_id -> inner fold, number of inner folds) of every bank trajectory: the
    channel margins (``q_*``) and the probe scored by a bank / probe fitted on the other inner folds
    (``inner_folds`` by ``group``, as the outer folds are), the trajectory's own signals (``trajectory_signals``)
    as they are. Only the ``signals`` asked are computed; ``fits``: a run's memo of fitted probes
    (``sift.variants.probe_once``)."""
    labels = {t.traj_id: int(t.label) for t in bank_trajs}
    raw: dict[str, dict[str, float]] = {t.traj_id: trajectory_signals(t) for t in bank_trajs}
    fold_of: dict[str, int] = {}
    inner = list(inner_folds(bank_trajs, group, seed=seed))
    for f in inner:
        ie_ids = sorted(c.traj_id for p in f.eval_pools for c in p.candidates)
        fold_of |= {t: f.k for t in ie_ids}
        if any(s.startswith("q_") for s in signals):
            for t, q in fold_distance(f, states, fingerprint, seed=seed).items():
                raw[t] |= {f"q_{c}": v for c, v in q.items()}
        if "probe" in signals:
            ib_ids = sorted(t.traj_id for t in f.bank_trajs)
            ip = probe_once(fits, states, {i: labels[i] for i in ib_ids},
                            early_stopping_groups(f.bank_trajs, group), seed=seed)
            for t, v in zip(ie_ids, ip.decision_function([states[i] for i in ie_ids])):
                raw[t]["probe"] = float(v)
    return {t: raw[t] for t in sorted(fold_of)}, fold_of, len(inner)


def stack_inner_auc(raw: Mapping[str, np.ndarray], instance: np.ndarray, labels: np.ndarray, fold: np.ndarray,
                    n_inner: int) -> float:
    """Cross-fitted within-pool AUC of a stacked fusion on the bank: weights fitted on one inner fold's
    cross-fitted signals (``raw``: signal -> per-trajectory values), scored on the other's (equal weights where an
    inner fold cannot fit them)."""
    pred = np.full(len(labels), np.nan)
    for j in range(n_inner):
        tr, te = fold != j, fold == j
        try:
            w = fit_stack({s: v[tr] for s, v in raw.items()}, instance[tr], labels[tr])
        except LatentSiftError:
            w = {s: 1.0 for s in raw}
        pred[te] = pool_rank_features({s: v[te] for s, v in raw.items()}, instance[te]) @ \
            np.array([w[s] for s in sorted(raw)])
    return within_pool_auc(instance, labels, pred).auc


def rule_auc(m: Method, trajs: Sequence[Trajectory], states=None) -> float:
    """Within-pool AUC of a free rule on labelled ``trajs`` (nothing is fitted: no inner fold is needed)."""
    filt = m.entry.factory()
    prep = filt.prepare_many(as_pools(trajs), states)
    by = {t.traj_id: t for t in trajs}
    ids = [t for p in prep.values() for t in p.traj_ids]
    s = np.concatenate([p.raw for p in prep.values()])
    return within_pool_auc(np.array([by[t].instance_id for t in ids]), np.array([int(by[t].label) for t in ids]),
                           s).auc


def inner_cv_evidence(trajs: Sequence[Trajectory], states, fingerprint, candidates: Sequence[Method], *, group,
                      scorer_params: Mapping, seed: int = 0, log=lambda m: None) -> dict[str, float | None]:
    """Candidate name -> its inner-CV within-pool AUC on the labelled ``trajs`` alone (``CRITERION``): the free
    rules on the pools as they are; the paper's method, its branches and the fitted fusion on cross-fitted
    s_dist / s_lin (``cross_fitted_branches``: the fused score at w = 0.5, 1 and 0; the fitted fusion at its
    chosen w, optimistic: the weight is chosen on these scores); the stacks (the probe among them) by
    ``stack_inner_auc``. A candidate that cannot be cross-fitted gets None (said in ``log``)."""
    out: dict[str, float | None] = {}
    for m in candidates:
        if m.family == "rule":
            out[m.name] = rule_auc(m, trajs, states if m.needs_states else None)
    crit = lambda inst, y, s: within_pool_auc(inst, y, s).auc  # noqa: E731
    fam = {m.family for m in candidates}
    if fam & {"paper", "fusion"}:
        try:
            cf = cross_fitted_branches(trajs, states, fingerprint, dict(scorer_params) | {"train_loss": False},
                                       group=group, seed=seed)
            w, by_w = fit_fusion_weight(cf["s_dist"], cf["s_lin"], cf["instance"], cf["label"], crit)
            out |= latentsift_evidence(by_w, w, candidates)
        except LatentSiftError as e:
            log(f"[auto] the paper's method and its branches not cross-fitted: {e}")
    stacks = [m for m in candidates if m.family == "stack"]
    if stacks:
        sig = sorted({s for m in stacks for s in m.signals})
        try:
            raw, fold_of, n_inner = cross_fitted_signals(trajs, states, fingerprint, group, signals=sig, seed=seed)
            out |= stacks_evidence(raw, fold_of, n_inner, {t.traj_id: t for t in trajs}, stacks)
        except LatentSiftError as e:
            log(f"[auto] the stacked fusions not cross-fitted: {e}")
    return {m.name: out.get(m.name) for m in candidates}


def latentsift_evidence(by_w: Mapping[str, float], w: float, candidates: Sequence[Method]) -> dict[str, float]:
    """The paper's method (w = 0.5), its distance (w = 1) and learned (w = 0) branches and the fitted fusion (its
    chosen w) read from the fusion weight's inner-CV criterion per w (``fit_fusion_weight``)."""
    at = {PAPER: "0.5", BRANCH_DISTANCE: "1", BRANCH_LEARNED: "0", FITTED_FUSION: f"{w:g}"}
    return {m.name: float(by_w[at[m.name]]) for m in candidates if m.name in at and at[m.name] in by_w}


def stacks_evidence(raw: Mapping[str, Mapping[str, float]], fold_of: Mapping[str, int], n_inner: int,
                    traj_by_id: Mapping[str, Trajectory], stacks: Sequence[Method]) -> dict[str, float]:
    """Each stacked fusion's ``stack_inner_auc`` on cross-fitted signals ``raw`` (traj_id -> signal -> value)."""
    ids = sorted(raw)
    inst = np.array([traj_by_id[t].instance_id for t in ids])
    y = np.array([int(traj_by_id[t].label) for t in ids])
    fold = np.array([fold_of[t] for t in ids])
    return {m.name: float(stack_inner_auc({s: np.array([raw[t][s] for t in ids]) for s in m.signals}, inst, y,
                                          fold, n_inner)) for m in stacks}


# ------------------------------------------------------------------------ a fitted stack on new pools
class DeployedStack(StackedFilter):
    """A stacked fusion fitted on a team's labelled runs, scoring new pools: each candidate's signals (the
    distance branch's q per channel from ``bank``, the ``probe``'s score, the trajectory's own signals), then
    ``StackedFilter``'s fused within-subset ranks with ``weights``."""

    name = "stacked"

    def __init__(self, weights: Mapping[str, float], *, bank: Bank | None = None, probe: ProbeWeights | None = None,
                 seed: int = 0, **kw):
        super().__init__({k: {} for k in weights}, weights, seed=seed, **kw)
        self.bank, self.probe = bank, probe

    def prepare_many(self, pools, states=None, *, fingerprint=None) -> dict[str, Prepared]:
        pools = as_pools(pools)
        cands = sorted((c for p in pools for c in p.candidates), key=lambda c: c.traj_id)
        raw = {k: {} for k in self.weights}
        for c in cands:
            for k, v in trajectory_signals(c).items():
                if k in raw:
                    raw[k][c.traj_id] = v
        if any(k.startswith("q_") or k == "probe" for k in raw):
            st, fp = resolve_states(states, [c.traj_id for c in cands], fingerprint, owner="DeployedStack.prepare",
                                    need_fingerprint=self.bank is not None)
            if any(k.startswith("q_") for k in raw):
                dist = LatentSift(self.bank, None, branches="distance", seed=self.seed, n_evidence=0)
                for p in dist.prepare_many(pools, st, fingerprint=fp).values():
                    for r, t in enumerate(p.traj_ids):
                        for j, ch in enumerate(p.channels):
                            if f"q_{ch}" in raw:
                                raw[f"q_{ch}"][t] = float(p.q[r, j])
            if "probe" in raw:
                ids = [c.traj_id for c in cands]
                raw["probe"] |= dict(zip(ids, self.probe.decision_function([st[t] for t in ids]).tolist()))
        return StackedFilter(raw, self.weights, seed=self.seed).prepare_many(pools)


def fit_stack_method(m: Method, trajs: Sequence[Trajectory], states, fingerprint, *, group, seed: int = 0) -> dict:
    """What a stacked fusion learns from labelled ``trajs``: its weights (``fit_stack`` on cross-fitted signals),
    their inner-CV AUC, and the probe on every trajectory when it fuses it."""
    raw, fold_of, n_inner = cross_fitted_signals(trajs, states, fingerprint, group, signals=m.signals, seed=seed)
    ids = sorted(raw)
    by = {t.traj_id: t for t in trajs}
    inst = np.array([by[t].instance_id for t in ids])
    y = np.array([int(by[t].label) for t in ids])
    cols = {s: np.array([raw[t][s] for t in ids]) for s in m.signals}
    out = {"weights": fit_stack(cols, inst, y), "inner_cv_within_pool_auc": float(
        stack_inner_auc(cols, inst, y, np.array([fold_of[t] for t in ids]), n_inner)),
           "n_bank_candidates": len(ids)}
    if "probe" in m.signals:
        tids = sorted(by)
        out["probe"] = ProbeWeights.from_probe(LogisticProbe(seed=seed).fit(
            [states[t] for t in tids], [int(by[t].label) for t in tids], early_stopping_groups(trajs, group)))
    return out


def fit_fusion_method(trajs: Sequence[Trajectory], states, fingerprint, scorer_params: Mapping, *, group,
                      seed: int = 0) -> dict:
    """What the fitted fusion learns: the weight w of Eq. 3 with the best within-pool AUC on cross-fitted s_dist
    and s_lin of ``trajs`` (``fit_fusion_weight``), and the criterion per w."""
    cf = cross_fitted_branches(trajs, states, fingerprint, dict(scorer_params) | {"train_loss": False}, group=group,
                               seed=seed)
    w, by_w = fit_fusion_weight(cf["s_dist"], cf["s_lin"], cf["instance"], cf["label"],
                                lambda inst, y, s: within_pool_auc(inst, y, s).auc)
    return {"fusion_weight": w, "inner_cv_criterion": by_w, "n_bank_candidates": int(len(cf["label"]))}


def check_records(method: Method, pools, owner: str) -> None:
    """One line when a rule reads a record the pools lack (``RuleFilter.absent``: a patch, generated-token counts,
    the examples' pass share): it would rank every candidate of a pool as a tie."""
    absent = getattr(method.entry.factory, "absent", None) if method.family == "rule" else None
    why = None if absent is None else absent([c for p in as_pools(pools) for c in p.candidates])
    if why is not None:
        raise LatentSiftError(f"{owner}: the method {method.name!r} reads a record these pools lack: {why}.")


def check_states_given(method: str | Method, states, owner: str) -> None:
    """One line when a method that needs states is given none."""
    m = method if isinstance(method, Method) else get_method(method)
    if states is None and m.needs_states:
        raise LatentSiftError(f"{owner}: the method {m.name!r} scores the candidates' states: pass --states "
                              "(a store from 'latentsift extract'), or a method that needs none (a rule).")

