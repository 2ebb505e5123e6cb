"""Beyond the paper: variants of the Stage-1 filter, each a setting, never a fork of the method.

The paper's LatentSift stays the reference. The variants here answer one question: does the
hidden-state signal carry anything that length and agent identity do not?

- ``center_by_group``: de-confounding style: subtract, per scaffold and channel, the mean state of
  that scaffold's *bank* trajectories from every state (bank and candidates alike).
- ``ScaffoldSift``: scaffold-conditioned banks: a candidate's states are compared only with bank
  trajectories of its own scaffold.
- ``LogisticProbe``: a regularised logistic probe on the same states as the gated head (model-authored
  spans, mean over spans of a few layers), the regularisation chosen by cross-validation on the bank by
  group (no task on both sides of an inner split).
- ``trajectory_signals``: length and patch signals read from the trajectory (no states);
  ``bank_subsample``: nested instance subsets of a bank for training-set size curves.
- ``fitted_fusion``: the paper's method with its fusion weight (Eq. 3, 0.5 in the paper) fitted on the bank by
  inner cross-validation by group (``fit_fusion_weight``): a fusion that cannot do much worse than its better
  branch. The scored fold is never read: its candidates are scored with the weight the bank chose.
- ``StackedFilter`` + ``fit_stack``: a fusion of within-pool ranks of several per-candidate signals
  (channel margins, learned logits, length in characters, step count), with weights fitted by a
  logistic regression on *bank* pools only, whose signals come from cross-fitting inside the bank
  (inner repository folds). Nothing assumes that shorter is better: the sign and size of every weight
  are learned from the bank.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .._core.threads import blas_fixed
from .._core import words
from .._core.validation import LatentSiftError, NotFittedError
from ..bank.bank import Bank, inner_folds
from .fuse import FUSION_WEIGHT, fuse
from .rank import grouped_normalized_ranks, normalized_ranks
from .rules import PAPER, register_filter
from .scorer import check_groups, fit_once, states_key
from .sift import LatentSift, Prepared, Stage1Filter
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import CHANNELS, Pool, Trajectory


# ------------------------------------------------------------------------ state transforms
def center_by_group(states: Mapping[str, TrajectoryStates], groups: Mapping[str, str], fit_ids: Sequence[str],
                    *, layers: Sequence[int] | None = None) -> dict[str, TrajectoryStates]:
    """States minus the per-(group, channel) mean over the ``fit_ids`` (bank) trajectories.

    ``layers``: layer indices to keep (default all). A group with no bank trajectory is left as is
    (its mean is unknown without looking at candidates).
    """
    fit = [t for t in fit_ids]
    if not fit:
        raise LatentSiftError("center_by_group needs at least one bank trajectory.")
    sel = slice(None) if layers is None else list(layers)
    sums: dict[tuple[str, int], np.ndarray] = {}
    counts: dict[tuple[str, int], int] = {}
    for t in fit:
        st = states[t]
        x = np.asarray(st.layers[:, sel, :], dtype=np.float64)
        for c in range(len(CHANNELS)):
            m = np.asarray(st.channel) == c
            if m.any():
                key = (groups[t], c)
                sums[key] = sums.get(key, 0.0) + x[m].sum(axis=0)
                counts[key] = counts.get(key, 0) + int(m.sum())
    means = {k: (v / counts[k]).astype(np.float32) for k, v in sums.items()}
    out: dict[str, TrajectoryStates] = {}
    for t, st in states.items():
        x = np.array(st.layers[:, sel, :], dtype=np.float32)
        for c in range(len(CHANNELS)):
            key = (groups[t], c)
            if key in means:
                m = np.asarray(st.channel) == c
                x[m] -= means[key]
        out[t] = TrajectoryStates(st.traj_id, x, st.step, st.channel, st.n_tokens)
    return out


# ------------------------------------------------------------------------ trajectory signals
def patch_lines(patch: str) -> int:
    """Changed lines (``+`` / ``-`` lines outside the file headers) of a unified diff; 0 for no patch."""
    return sum(1 for line in patch.splitlines()
               if line.startswith(("+", "-")) and not line.startswith(("+++", "---")))


def trajectory_signals(traj: Trajectory) -> dict[str, float]:
    """Per-candidate signals read from the trajectory itself (no states), for the stacked fusion.

    ``neg_chars`` / ``neg_steps``: minus the length in characters / steps; ``patch_lines``: changed
    lines of the final patch; ``no_patch``: 1 when the final patch is empty. Signs carry no
    assumption: the stacked fusion learns each weight, sign included, from the bank.
    """
    return {"neg_chars": -float(traj.n_chars), "neg_steps": -float(traj.n_steps),
            "patch_lines": float(patch_lines(traj.patch or "")), "no_patch": float(not (traj.patch or "").strip())}


def bank_subsample(trajs: Sequence[Trajectory], fraction: float, *, seed: int = 0) -> list[Trajectory]:
    """The trajectories of the first ``ceil(fraction * n)`` instances in a seeded hash order.

    Whole instances are kept together; for one seed the subsets are nested (a larger fraction keeps
    every instance of a smaller one), so a training-set size curve moves one way only.
    """
    if not 0 < fraction <= 1:
        raise LatentSiftError(f"The 'fraction' parameter of bank_subsample must be in (0, 1]. Got {fraction!r} "
                              "instead.")
    insts = sorted({t.instance_id for t in trajs},
                   key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    keep = set(insts[: math.ceil(fraction * len(insts))])
    return [t for t in trajs if t.instance_id in keep]


# ------------------------------------------------------------------------ logistic probe
def probe_layers(n_layers: int) -> tuple[int, int]:
    """The probe's default layers: the final one and the middle one (index ``n_layers // 2``)."""
    return (-1, n_layers // 2)


def probe_features(states: Sequence[TrajectoryStates], layers: Sequence[int] | None = None) -> np.ndarray:
    """Mean over model-authored spans (cot, fn) of the chosen layers' states (default ``probe_layers``),
    concatenated.

    A trajectory without a model-authored span gets zeros (documented; rare: an empty agent run).
    """
    d = states[0].d_model
    layers = probe_layers(states[0].n_layers) if layers is None else layers
    out = np.zeros((len(states), len(layers) * d), dtype=np.float32)
    for i, st in enumerate(states):
        u = st.scorer_states()
        if len(u):
            out[i] = np.asarray(u[:, list(layers), :], dtype=np.float32).mean(axis=0).reshape(-1)
    return out


@dataclass
class LogisticProbe:
    """L2-regularised logistic regression on ``probe_features``; C chosen by inner cross-validated AUC over
    folds by group (``StratifiedGroupKFold``: no group's trajectories on both sides of an inner split).

    ``fit(states, labels, groups)``: ``groups`` as ``LinearScorer.fit``'s (dict traj_id -> group or a list
    aligned with ``states``), the protocol passes the fold groups of its early-stopping split
    (``early_stopping_groups``: the run's fold group, or the task where all share one), so that no task has
    candidates on both sides. Learned: ``splits_``, the (train, validation) index pairs the choice used.
    """

    layers: tuple[int, ...] | None = None   # None: probe_layers(n_layers), the final and the middle layer
    Cs: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
    cv: int = 4
    seed: int = 0
    model_: object = field(default=None, repr=False)

    @blas_fixed
    def fit(self, states: Sequence[TrajectoryStates], labels: Sequence[int],
            groups: Mapping[str, str] | Sequence[str]) -> "LogisticProbe":
        from sklearn.linear_model import LogisticRegressionCV
        from sklearn.model_selection import StratifiedGroupKFold
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        y = np.asarray(labels, dtype=int)
        ids = [st.traj_id for st in states]
        by_id = check_groups(groups, ids, "LogisticProbe.fit")
        g = np.array([by_id[t] for t in ids])
        self.layers_ = tuple(self.layers or probe_layers(states[0].n_layers))
        X = probe_features(states, self.layers_)
        # every validation side needs both classes (its AUC): at most as many folds as groups holding each class,
        # fewer while a fold's groups hold one class only
        self.splits_ = []
        for n in range(min(self.cv, *(len(set(g[y == c].tolist())) for c in (0, 1))), 1, -1):
            splits = list(StratifiedGroupKFold(n_splits=n, shuffle=True, random_state=self.seed).split(X, y, g))
            if all(len(set(y[val].tolist())) == 2 for _, val in splits):
                self.splits_ = splits
                break
        if not self.splits_:
            raise LatentSiftError("LogisticProbe.fit needs resolved and unresolved trajectories in at least two "
                                  "groups each (its regularisation is chosen by cross-validation by group).")
        self.model_ = make_pipeline(StandardScaler(), LogisticRegressionCV(
            Cs=list(self.Cs), cv=self.splits_, scoring="roc_auc", max_iter=2000, l1_ratios=(0.0,),
            use_legacy_attributes=False))
        self.model_.fit(X, y)
        return self

    @blas_fixed
    def decision_function(self, states: Sequence[TrajectoryStates]) -> np.ndarray:
        if self.model_ is None:
            raise NotFittedError("This LogisticProbe is not fitted yet: call fit(...).")
        return self.model_.decision_function(probe_features(states, self.layers_))


def probe_once(fits: dict | None, states: Mapping, labels: Mapping[str, int], groups: Mapping[str, str], *,
               seed: int = 0) -> LogisticProbe:
    """``LogisticProbe(seed=seed).fit`` on the states of the trajectories ``labels`` names (sorted by id) with their
    ``groups`` (its inner split by group), or the probe that an identical call put in ``fits`` (its folds are
    seeded: the same inputs give the same coefficients); ``fits`` None fits every time (``scorer.fit_once``, for
    the gated head, tells states apart)."""
    ids = sorted(labels)
    by_id = check_groups(groups, ids, "probe_once")
    key = ("probe", int(seed), states_key(states, labels), tuple(str(by_id[t]) for t in ids))
    if fits is not None and key in fits:
        return fits[key]
    probe = LogisticProbe(seed=seed).fit([states[i] for i in ids], [labels[i] for i in ids], by_id)
    if fits is not None:
        fits[key] = probe
    return probe


# ------------------------------------------------------------------------ stacked fusion
def pool_rank_features(raw: Mapping[str, np.ndarray], instance: np.ndarray) -> np.ndarray:
    """(n, n_features) within-pool normalised ranks of every raw signal (rank normalisation per signal)."""
    return np.stack([grouped_normalized_ranks(raw[k], instance) for k in sorted(raw)], axis=1)


@blas_fixed
def fit_stack(raw: Mapping[str, np.ndarray], instance: np.ndarray, labels: np.ndarray, *, C: float = 1.0,
              mixed_only: bool = True) -> dict[str, float]:
    """Fusion weights: logistic regression of the label on within-pool ranks (bank pools only).

    Only mixed pools (a resolved and an unresolved candidate) carry information about *which*
    candidate to keep; ``mixed_only`` trains on those. Returns ``{signal: weight}``.
    """
    from sklearn.linear_model import LogisticRegression
    y = np.asarray(labels, dtype=int)
    X = pool_rank_features(raw, instance)
    keep = np.ones(len(y), dtype=bool)
    if mixed_only:
        _, inv = np.unique(instance, return_inverse=True)
        pos = np.bincount(inv, weights=y, minlength=inv.max() + 1)
        n = np.bincount(inv, minlength=inv.max() + 1)
        keep = (pos[inv] > 0) & (pos[inv] < n[inv])
    if keep.sum() < 4 or len(set(y[keep].tolist())) < 2:
        raise LatentSiftError("fit_stack: the bank has too few mixed pools to fit fusion weights.")
    m = LogisticRegression(C=C, max_iter=1000).fit(X[keep], y[keep])
    return {k: float(w) for k, w in zip(sorted(raw), m.coef_[0])}


class StackedFilter(Stage1Filter):
    """s = sum_k w_k * r_k, r_k the within-subset normalised rank of signal k (weights from the bank)."""

    name = "stacked"

    def __init__(self, raw: Mapping[str, Mapping[str, float]], weights: Mapping[str, float], *, seed: int = 0,
                 **kw):
        super().__init__(seed=seed, **kw)
        missing = sorted(set(weights) - set(raw))
        if missing:
            raise LatentSiftError(f"StackedFilter: no per-candidate values for signals {missing}.")
        self.raw = {k: raw[k] for k in sorted(weights)}
        self.weights = dict(sorted(weights.items()))

    def get_params(self) -> dict:
        return super().get_params() | {"weights": self.weights}

    def prepare_many(self, pools, states=None, *, fingerprint=None) -> dict[str, Prepared]:
        out = {}
        for p in pools:
            ids = sorted(c.traj_id for c in p.candidates)
            try:
                q = np.array([[self.raw[k][t] for k in self.weights] for t in ids], dtype=np.float64)
            except KeyError as e:
                raise LatentSiftError(f"StackedFilter: no value for candidate {e.args[0]!r}.") from None
            out[p.instance_id] = Prepared(p.instance_id, ids, channels=tuple(self.weights), q=q)
        return out

    def _rank(self, prepared: Prepared, idx: np.ndarray) -> dict[str, np.ndarray]:
        w = np.array(list(self.weights.values()))
        r = np.stack([normalized_ranks(prepared.q[idx, j]) for j in range(prepared.q.shape[1])], axis=1)
        return {"s": r @ w}


# ------------------------------------------------------------------------ fitted fusion weight
#: The fusion weights w (s = w s_dist + (1 - w) s_lin, Eq. 3) among which the inner cross-validation chooses.
FUSION_GRID = tuple(i / 10 for i in range(11))


def fit_fusion_weight(s_dist, s_lin, instance, labels, criterion, *,
                      grid: Sequence[float] = FUSION_GRID) -> tuple[float, dict[str, float]]:
    """(w, criterion per w): the w of ``grid`` whose fused score (Eq. 3) has the best ``criterion(instance,
    labels, s)`` (e.g. the within-pool AUC) on cross-fitted bank scores; ties go to the w nearest the paper's
    0.5, then the smaller. Refused when no w gives a finite criterion (no pool with both outcomes)."""
    got = {w: float(criterion(instance, labels, fuse(s_dist, s_lin, w))) for w in grid}
    ok = [w for w, v in got.items() if math.isfinite(v)]
    if not ok:
        raise LatentSiftError("fit_fusion_weight: the bank's cross-fitted pools have no pool with both outcomes.")
    best = max(ok, key=lambda w: (got[w], -abs(w - FUSION_WEIGHT), -w))
    return best, {f"{w:g}": v for w, v in got.items()}


def cross_fitted_branches(bank_trajs: Sequence[Trajectory], states, fingerprint, scorer_params: Mapping, *,
                          group, seed: int = 0, fits: dict | None = None) -> dict[str, np.ndarray]:
    """s_dist and s_lin of every bank trajectory scored by a bank and a scorer fitted on the other inner
    folds (``inner_folds`` by ``group``, as the outer folds are), with its instance and label; ``fits``: the
    run's scorers already fitted (``scorer.fit_once``)."""
    cols: dict[str, list] = {"s_dist": [], "s_lin": [], "instance": [], "label": []}
    for f in inner_folds(bank_trajs, group, seed=seed):
        labels = {t.traj_id: int(t.label) for t in f.bank_trajs}
        bank = Bank.from_trajectories(f.bank_trajs, states, fingerprint)
        sc = fit_once(fits, scorer_params, states, labels, fingerprint=fingerprint,
                      groups={t.traj_id: group(t) for t in f.bank_trajs})
        label_of = {c.traj_id: int(c.label) for p in f.eval_pools for c in p.candidates}
        for res in LatentSift(bank, sc, seed=seed, n_evidence=0).score_pools(f.eval_pools, states,
                                                                             fingerprint=fingerprint):
            for c in res.candidates:
                cols["s_dist"].append(c.s_dist)
                cols["s_lin"].append(c.s_lin)
                cols["instance"].append(c.instance_id)
                cols["label"].append(label_of[c.traj_id])
    return {k: np.asarray(v) for k, v in cols.items()}


def fitted_fusion(bank_trajs, eval_pools, states, fingerprint, scorer, *, seed: int, paper: Mapping[str, Prepared],
                  paper_filter: LatentSift, group, criterion, fits: dict | None = None, **_):
    """The paper's method (its bank and scorer of this fold) with the fusion weight chosen on the bank alone
    (``cross_fitted_branches`` then ``fit_fusion_weight``); ``eval_pools`` are only scored, with ``paper``'s
    q and q_lin. Returns (filter, instance -> Prepared); the filter's ``fitted_`` holds the weight's evidence."""
    if scorer is None:
        raise LatentSiftError("the fitted fusion needs the learned branch (a trained scorer)")
    cf = cross_fitted_branches(bank_trajs, states, fingerprint, scorer.get_params() | {"train_loss": False},
                               group=group, seed=seed, fits=fits)
    w, by_w = fit_fusion_weight(cf["s_dist"], cf["s_lin"], cf["instance"], cf["label"], criterion)
    filt = LatentSift(paper_filter.bank, scorer, seed=seed, fusion_weight=w)
    filt.fitted_ = {"fusion_weight": w, "inner_cv_criterion": by_w, "n_bank_candidates": int(len(cf["label"]))}
    return filt, {p.instance_id: paper[p.instance_id] for p in eval_pools}


# ------------------------------------------------------------------------ scaffold-conditioned banks
def split_pools_by_group(pools: Sequence[Pool], group_of) -> dict[str, list[Pool]]:
    """Each pool split into sub-pools of one group (scaffold) each."""
    out: dict[str, list[Pool]] = {}
    for p in pools:
        by: dict[str, list] = {}
        for c in p.candidates:
            by.setdefault(group_of(c), []).append(c)
        for g, cs in by.items():
            out.setdefault(g, []).append(Pool(p.instance_id, cs))
    return out


def merge_prepared(parts: Sequence[Prepared]) -> Prepared:
    """One pool's Prepared from the Prepared of its per-scaffold sub-pools (rows re-sorted by traj_id)."""
    ids = [t for p in parts for t in p.traj_ids]
    order = np.argsort(np.array(ids, dtype=object), kind="stable")
    cat = lambda name: None if getattr(parts[0], name) is None else np.concatenate(  # noqa: E731
        [getattr(p, name) for p in parts])[order]
    ev = {}
    for p in parts:
        ev.update(p.evidence)
    return Prepared(parts[0].instance_id, [ids[i] for i in order], channels=parts[0].channels,
                    q=cat("q"), q_lin=cat("q_lin"), raw=cat("raw"), evidence=ev)


# ------------------------------------------------------------------------ the registered variants
# Every beyond-paper variant is a registered filter of kind "variant" whose name ("variant:<setting>") is spelled
# here only; the protocol builds them in registration order (``latentsift.protocol.variants``). A variant
# without ``signals`` is a factory ``make(bank_trajs, eval_pools, states, fingerprint, scorer, *, seed, paper,
# paper_filter, group, criterion)`` -> (filter, instance -> Prepared), ``paper`` the paper's method's Prepared per
# instance of the fold, ``paper_filter`` its filter, ``group`` the fold group of a trajectory and ``criterion``
# the within-pool AUC (instance, label, score) -> float, for an inner cross-validation; a
# stacked fusion (``signals``: the per-candidate signals it fuses) is ``StackedFilter``, built from the
# cross-fitted bank signals and their fitted weights.
_VARIANT = "variant:"
#: The stacked fusions among which the inner-CV default is chosen: setting -> the signals they fuse.
STACK_CONFIGS: dict[str, list[str]] = {}
_STATES = ["q_cot", "q_obs", "q_fn", "probe"]
_LENGTH = ["neg_chars", "neg_steps"]


def variant_setting(name: str) -> str:
    """The setting a variant's name states ("variant:stack:length" -> "stack:length")."""
    return name.removeprefix(_VARIANT)


def _variant(name: str, make, **info) -> str:
    register_filter(name, key=name, kind="variant", **info)(make)
    return name


def _representation(name: str, params_of, *, center: bool = False) -> str:
    """Register a representation variant of the distance branch, fused with the paper's learned branch: its
    bank holds the states (centred per scaffold on the bank's means when ``center``) built with the settings
    ``params_of(states, bank_ids)``."""
    def make(bank_trajs, eval_pools, states, fingerprint, scorer, *, seed: int, paper: Mapping[str, Prepared], **_):
        bank_ids = sorted(t.traj_id for t in bank_trajs)
        if center:
            agent = {t.traj_id: t.agent for t in [*bank_trajs, *(c for p in eval_pools for c in p.candidates)]}
            states = center_by_group(states, agent, bank_ids, layers=[-1])
        bank_v = Bank.from_trajectories(bank_trajs, states, fingerprint, **params_of(states, bank_ids))
        # the distance branch on this representation; the learned branch keeps the paper's q_lin
        dist = LatentSift(bank_v, None, branches="distance", seed=seed)
        prep = {i: Prepared(i, p.traj_ids, p.channels, p.q, paper[i].q_lin, None, p.evidence)
                for i, p in dist.prepare_many(eval_pools, states, fingerprint=fingerprint).items()}
        return LatentSift(bank_v, scorer, seed=seed), prep

    make.__qualname__ = make.__name__ = f"variant[{name}]"
    return _variant(name, make)


def _scaffold_bank(bank_trajs, eval_pools, states, fingerprint, scorer, *, seed: int, paper=None, **_):
    """Scaffold-conditioned banks: a candidate is compared only with bank trajectories of its scaffold (the
    shared bank where the scaffold's bank lacks a class)."""
    base = LatentSift(Bank.from_trajectories(bank_trajs, states, fingerprint), scorer, seed=seed)
    parts: dict[str, list] = {}
    for g, sub in split_pools_by_group(eval_pools, lambda c: c.agent).items():
        g_trajs = [t for t in bank_trajs if t.agent == g]
        if len({int(t.label) for t in g_trajs}) < 2:  # no bank of both classes for this scaffold: shared bank
            filt_g = base
        else:
            filt_g = LatentSift(Bank.from_trajectories(g_trajs, states, fingerprint), scorer, seed=seed)
        for i, p in filt_g.prepare_many(sub, states, fingerprint=fingerprint).items():
            parts.setdefault(i, []).append(p)
    return base, {i: merge_prepared(ps) for i, ps in parts.items()}


def _stack(name: str, signals: Sequence[str], *, post_hoc: bool = True) -> str:
    STACK_CONFIGS[variant_setting(name)] = list(signals)
    return _variant(name, StackedFilter, signals=tuple(signals), post_hoc=post_hoc)


_representation("variant:layer:middle", lambda states, ids: {"layer": (states[ids[0]].n_layers // 2) - 1})
_representation("variant:norm:l2", lambda states, ids: {"normalize": "l2"})
_representation("variant:norm:whiten", lambda states, ids: {"normalize": "whiten"})
_representation("variant:center:scaffold", lambda states, ids: {}, center=True)
_variant("variant:scaffold-bank", _scaffold_bank)
#: The paper's method with the fusion weight fitted on the bank by inner cross-validation by group (Eq. 3's 0.5
#: stays the paper's method). Added after the premise's folds had been seen (its learned branch beat the 0.5/0.5
#: fusion there), so post hoc.
FITTED_FUSION = _variant("variant:fusion:fitted", fitted_fusion, post_hoc=True)
#: The logistic probe alone (the learned branch's alternative), chosen before the folds were seen.
PROBE = _stack("variant:probe", ["probe"], post_hoc=False)
_stack("variant:stack:states", _STATES)
#: The learned length stack (shortest chars and fewest steps fused with weights fitted on the bank): it uses no
#: state, so that the choice can say when states add nothing; a reference of the decision (``protocol.decide``).
STACK_LENGTH = _stack("variant:stack:length", _LENGTH)
#: The stacked fusion of every state signal and the length signals (a candidate of ``fit --method auto``).
STACK_STATES_LENGTH = _stack("variant:stack:states+length", _STATES + _LENGTH)
_stack("variant:stack:states+length+patch", _STATES + _LENGTH + ["patch_lines", "no_patch"])

#: The default's name among the filters: per outer fold, the stacked fusion that the inner cross-validation on
#: the bank chose (the paper's method where that is impossible); the protocol builds it (``protocol.variants``).
DEFAULT = words.DEFAULT
register_filter(DEFAULT, kind="choice", label="LatentSift default (inner-CV choice)", color="#17becf",
                post_hoc=True)(StackedFilter)
#: The recommendation's name among the filters: per outer fold, the method that ``fit --method auto`` chooses on the
#: fold's bank alone (``deploy.methods.recommend``), scoring the fold's pools; a declared rule, not a pick after the
#: folds were seen (``protocol.variants.recommended_filter``).
RECOMMENDED = "recommended"
register_filter(RECOMMENDED, kind="choice", label="recommended (fit --method auto, chosen per fold)",
                color="#bcbd22")(StackedFilter)


# ------------------------------------------------------------------------ the sweep's filters
def _sweep(bank: Bank, scorer=None, **settings) -> LatentSift:
    """The paper's method on a representation of the sweep (fitted on the states of its own extraction)."""
    return LatentSift(bank, scorer, **settings)


#: The family of a sweep representation's filters: "sweep:<representation>" (the paper's method on its states)
#: and "sweep:<representation>:<filter key>" (another filter on them, e.g. the default).
SWEEP = "sweep:*"
register_filter(SWEEP, kind="sweep", label="a representation of the sweep")(_sweep)


def sweep_name(representation: str, key: str) -> str:
    """The name of the filter ``key`` on the sweep's ``representation`` (see ``SWEEP``)."""
    return SWEEP.removesuffix("*") + representation + ("" if key == PAPER else f":{key}")


def sweep_filter(name: str) -> str:
    """The filter key a sweep filter's name states (``sweep_name``'s inverse): the paper's method or another."""
    rest = name.removeprefix(SWEEP.removesuffix("*"))
    return rest.split(":", 1)[1] if ":" in rest else PAPER
