"""Per-pool retention for a stated pool recall, with a finite-sample guarantee (conformal risk control).

Pool recall: the share of pools that hold a resolved candidate and keep at least one of them.
A target recall R is a risk level alpha = 1 - R on the loss

    L_i(tau) = 1[pool i holds a resolved candidate and Stage 1 keeps none of them],

where pool i keeps its ``min_keep`` best candidates and every candidate whose score is at least the
threshold ``tau`` (``keep_mask``): a confident pool (one candidate far above the rest) keeps one,
an uncertain pool (every candidate above the threshold) keeps all. L_i grows with tau (a higher
threshold keeps fewer candidates) and is bounded by B = 1.

Conformal risk control (Angelopoulos, Bates, Fisch, Lei and Schuster, "Conformal Risk Control",
ICLR 2024, Theorem 1), on the n calibration pools that hold a resolved candidate: with
lambda = -tau (so the loss is non-increasing in lambda),

    tau_hat = sup{ tau : (n / (n + 1)) R_hat_n(tau) + B / (n + 1) <= alpha },

i.e. at most ``floor(alpha (n + 1) - 1)`` calibration pools may lose their resolved candidates
(``crc_threshold``, closed form: an order statistic of each pool's best resolved score,
``pool_miss_scores``). Then, when the calibration pools and a new pool holding a resolved
candidate are exchangeable, E[L_new(tau_hat)] <= alpha, i.e. the expected pool recall is at
least R. The bound needs ``alpha (n + 1) >= 1`` (``n >= 1 / alpha - 1``; a smaller calibration
set is refused, ``check_calibration_size``); R = 1 keeps every candidate (trivially guaranteed).

The keep decision is made on the score, and the calibrated probability (``latentsift.metrics.calibrate``,
a non-decreasing map) is reported with it: the candidates kept are those whose probability is at
least the threshold's, up to the plateaus of the isotonic step function, which a threshold on the
probability would keep whole (still valid, but it keeps more than the guarantee needs).
``apply_operating_point`` applies the rule to scored pools (``sift.PoolResult``), and a pool the
shift guard flags is never reported as guaranteed (``on_shift`` decides what it keeps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .._core.validation import LatentSiftError, check_choice, check_positive_int
from ..bank.bank import Bank, inner_folds
from ..metrics.calibrate import CALIBRATION_METHODS, CalibrationMap, fit_calibration
from ..sift.retain import order_by_score
from ..sift.scorer import LinearScorer
from ..sift.rules import make_baseline
from ..sift.sift import LatentSift, load_selected_pools
from .sifter import Sifter
from ..states.store import StateStore

TARGET_RECALLS = (0.90, 0.95, 0.99)
ON_SHIFT_TARGET = ("keep-all", "warn")
GUARANTEE = ("conformal risk control (Angelopoulos et al., Conformal Risk Control, Theorem 1): "
             "E[1 - pool recall] <= 1 - R for a new pool holding a resolved candidate, when it and the "
             "calibration pools holding one are exchangeable")


def check_target_recall(value: Any, owner: str = "filter") -> float:
    """A target pool recall in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 < float(value) <= 1.0:
        raise LatentSiftError(f"The 'target_recall' parameter of {owner} must be a number in (0, 1]. "
                              f"Got {value!r} instead.")
    return float(value)


def min_calibration_pools(target: float) -> int:
    """Fewest calibration pools holding a resolved candidate for which the bound can hold: n >= 1/alpha - 1."""
    alpha = 1.0 - target
    return 0 if alpha <= 0 else max(1, math.ceil(1.0 / alpha - 1.0 - 1e-9))


def check_calibration_size(n: int, target: float, owner: str = "filter") -> None:
    """Refuse a calibration set too small for conformal risk control at ``target``."""
    need = min_calibration_pools(target)
    if target < 1.0 and n < need:
        raise LatentSiftError(f"{owner}: --target-recall {target:g} needs at least {need} calibration pools that "
                              f"hold a resolved candidate (conformal risk control: n >= 1/(1 - R) - 1); the "
                              f"calibration set has {n}. Add labelled pools or lower the target.")


def top_mask(scores: np.ndarray, traj_ids: Sequence[str], n: int, seed: int = 0) -> np.ndarray:
    """The ``n`` best candidates under the retention tie rule (``retain.order_by_score``)."""
    mask = np.zeros(len(traj_ids), dtype=bool)
    mask[order_by_score(scores, traj_ids, seed=seed)[:max(0, n)]] = True
    return mask


def keep_mask(scores: Any, traj_ids: Sequence[str], threshold: float, min_keep: int = 1, seed: int = 0) -> np.ndarray:
    """Candidates kept: the ``min_keep`` best, and every candidate with score >= ``threshold``."""
    s = np.asarray(scores, dtype=np.float64)
    return top_mask(s, traj_ids, min_keep, seed) | (np.nan_to_num(s, nan=-np.inf) >= threshold)


def pool_miss_score(scores: Any, labels: Any, traj_ids: Sequence[str], min_keep: int = 1, seed: int = 0) -> float:
    """u such that the pool loses its resolved candidates exactly when the threshold exceeds u.

    +inf when a resolved candidate is among the ``min_keep`` best (never lost); else the best score of
    a resolved candidate (NaN scores count as -inf); NaN when the pool holds no resolved candidate.
    """
    raw = np.asarray(scores, dtype=np.float64)
    s = np.nan_to_num(raw, nan=-np.inf)
    y = np.asarray(labels).astype(bool)
    if not y.any():
        return float("nan")
    if (top_mask(raw, traj_ids, min_keep, seed) & y).any():
        return float("inf")
    return float(s[y].max())


def crc_threshold(u: Any, alpha: float) -> float:
    """The conformal-risk-control threshold for the 0/1 pool loss 1[tau > u_i] (module docstring).

    ``u``: ``pool_miss_score`` of the n calibration pools holding a resolved candidate. Returns the
    largest threshold at which at most floor(alpha (n + 1) - 1) of them are lost: +inf keeps only
    ``min_keep`` per pool, -inf keeps everything (alpha = 0).
    """
    u = np.sort(np.asarray(u, dtype=np.float64))
    n = u.size
    if alpha <= 0:
        return float("-inf")
    allowed = math.floor(alpha * (n + 1) - 1 + 1e-9)
    if allowed < 0:
        raise LatentSiftError(f"conformal risk control at alpha {alpha:g} needs n >= {min_calibration_pools(1 - alpha)} "
                              f"calibration pools; got {n}.")
    return float("inf") if allowed >= n else float(u[allowed])


@dataclass
class OperatingPoint:
    """A keep rule chosen for ``target_recall`` on calibration pools (``fit_operating_point``).

    ``threshold``: on the filter's score; ``p_threshold``: the calibrated probability there;
    ``n_calibration_pools``: calibration pools holding a resolved candidate (the n of the bound);
    ``n_lost_allowed``: of those, how many the threshold may lose.
    """

    target_recall: float
    threshold: float
    p_threshold: float
    n_calibration_pools: int
    n_lost_allowed: int
    min_keep: int
    calibration: CalibrationMap
    seed: int = 0
    guarantee: str = GUARANTEE

    @property
    def alpha(self) -> float:
        return 1.0 - self.target_recall

    def keep(self, scores: Any, traj_ids: Sequence[str]) -> np.ndarray:
        return keep_mask(scores, traj_ids, self.threshold, self.min_keep, self.seed)

    def to_dict(self) -> dict:
        fin = (lambda v: None if not np.isfinite(v) else float(v))
        return {"target_recall": self.target_recall, "alpha": round(self.alpha, 12),
                "threshold": fin(self.threshold),
                "threshold_meaning": "keep all" if self.threshold == -np.inf else
                "keep min_keep only" if self.threshold == np.inf else "keep score >= threshold",
                "p_threshold": fin(self.p_threshold), "n_calibration_pools": self.n_calibration_pools,
                "n_lost_allowed": self.n_lost_allowed, "min_keep": self.min_keep,
                "calibration": self.calibration.to_dict(), "guarantee": self.guarantee}


@dataclass
class CalibrationPools:
    """Labelled pools scored as new pools: per pool its traj_ids, scores and 0/1 labels."""

    instance_ids: list[str]
    traj_ids: list[list[str]]
    scores: list[np.ndarray]
    labels: list[np.ndarray]
    how: str = ""
    extra: dict = field(default_factory=dict)

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.scores:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(self.scores), np.concatenate(self.labels)

    def n_positive(self) -> int:
        return int(sum(np.asarray(y).any() for y in self.labels))


def fit_operating_point(cal: CalibrationPools, calibration: CalibrationMap, target: float, *, min_keep: int = 1,
                        seed: int = 0, owner: str = "filter") -> OperatingPoint:
    """The keep rule for ``target`` pool recall on the calibration pools (refused when too few)."""
    target = check_target_recall(target, owner)
    min_keep = check_positive_int(min_keep, "min_keep", owner)
    u = np.array([pool_miss_score(s, y, t, min_keep, seed) for s, y, t in zip(cal.scores, cal.labels, cal.traj_ids)])
    u = u[~np.isnan(u)]
    check_calibration_size(u.size, target, owner)
    tau = crc_threshold(u, 1.0 - target)
    allowed = -1 if target >= 1 else math.floor((1.0 - target) * (u.size + 1) - 1 + 1e-9)
    p_tau = float(calibration.predict([tau])[0]) if np.isfinite(tau) else float("nan")
    return OperatingPoint(target, tau, p_tau, int(u.size), int(max(allowed, 0)), min_keep, calibration, seed)


def apply_operating_point(results: list, op: OperatingPoint, *, shifted: Sequence[str] = (),
                          on_shift: str = "keep-all") -> list[dict]:
    """Apply ``op`` to scored pools (``sift.PoolResult``, changed in place: ``retained`` and ``n_keep``).

    Returns per pool: the number kept, the calibrated probability of each candidate, the reason and
    whether the guarantee applies (never for a pool in ``shifted``; ``on_shift`` "keep-all" keeps its
    every candidate, "warn" applies the rule without the guarantee).
    """
    flagged = set(shifted)
    out = []
    for res in results:
        ids = [c.traj_id for c in res.candidates]
        s = np.array([c.s for c in res.candidates], dtype=np.float64)
        p = op.calibration.predict(s)
        shift = res.instance_id in flagged
        if shift and on_shift == "keep-all":
            mask = np.ones(len(ids), dtype=bool)
            reason = "shift guard flagged the pool: keep-all (no guarantee)"
        else:
            mask = op.keep(s, ids)
            n_top = int(top_mask(s, ids, op.min_keep, op.seed).sum())
            n_above = int((np.nan_to_num(s, nan=-np.inf) >= op.threshold).sum())
            if mask.all() and len(ids) > n_top:
                reason = "uncertain: every candidate reaches the threshold"
            elif n_above <= n_top:
                reason = f"confident: no candidate beyond the best {n_top} reaches the threshold"
            else:
                reason = f"{n_above} candidates reach the threshold"
            if shift:
                reason += " (shift guard flagged the pool: rule applied, no guarantee)"
        for c, m in zip(res.candidates, mask):
            c.retained = bool(m)
        res.n_keep = int(mask.sum())
        out.append({"instance_id": res.instance_id, "k": len(ids), "n_keep": res.n_keep,
                    "probabilities": {t: float(v) for t, v in zip(ids, p)}, "reason": reason,
                    "guaranteed": not shift})
    return out


# ---------------------------------------------------------------------- files in, FILTER.json out
CALIBRATION_MODES = ("split", "cross-fitted")


def calibration_pools_for_filter(cal_path, cal_states, *, method: str = "latentsift", bank_dir=None, scorer_dir=None,
                                 sifter_dir=None, settings: dict | None = None, scorer_epochs: int = 40,
                                 instances=None) -> CalibrationPools:
    """Labelled calibration pools scored as new pools by the filter that ``filter`` runs.

    "split": no calibration pool's instance is in the bank (or a baseline, which has none): the pools
    are scored by the same bank, scorer and settings as the pools to filter (split conformal).
    "cross-fitted": some are in the bank (e.g. the bank's own pools): each pool is scored by a bank
    and scorer fitted on the calibration trajectories of the other half of their repositories
    (``bank.inner_folds``, 2 repository-disjoint halves; ``scorer_epochs`` per half).
    """
    settings = dict(settings or {})
    pools = load_selected_pools(cal_path, instances)
    trajs = [c for p in pools for c in p.candidates]
    unlabelled = [t.traj_id for t in trajs if t.label is None]
    if unlabelled:
        raise LatentSiftError(f"filter --calibration: {len(unlabelled)} candidates of {cal_path} have no reward, "
                              f"e.g. {unlabelled[0]!r}; calibration pools must be labelled.")
    if method != "latentsift":
        results = make_baseline(method, **settings).score_pools(pools, None if cal_states is None else
                                                                StateStore(cal_states).open())
        return _from_results(results, trajs, "split (a rule: no bank)")
    if cal_states is None:
        raise LatentSiftError("filter --calibration needs the calibration candidates' states (--calibration-states "
                              "or the --states store).")
    if sifter_dir is not None:
        sifter = Sifter.load(sifter_dir)
        bank, params = sifter.bank, sifter.get_params()
    else:
        bank = Bank.load(bank_dir)
        params = dict(settings)
    overlap = sorted({p.instance_id for p in pools} & bank.instance_ids_)
    store = StateStore(cal_states).open()
    if not overlap:
        filt = LatentSift(bank, None if params.get("branches") == "distance" else
                          (sifter.scorer if sifter_dir is not None else LinearScorer.load(scorer_dir)), **params)
        return _from_results(filt.score_pools(pools, store.load([t.traj_id for t in trajs]),
                                              fingerprint=store.fingerprint), trajs,
                             "split: calibration pools disjoint from the bank, scored by the same bank and scorer")
    states = store.load([t.traj_id for t in trajs])
    folds = list(inner_folds(trajs, seed=params.get("seed", 0)))
    results = []
    for f in folds:
        labels = {t.traj_id: int(t.label) for t in f.bank_trajs}
        if len(set(labels.values())) < 2 or not f.eval_pools:
            raise LatentSiftError(f"filter --calibration: {len(overlap)} calibration pools are in the bank, so they are "
                                  "cross-fitted over two repository-disjoint halves, and a half has one class only or "
                                  "no pools; give calibration pools from more repositories.")
        ids = sorted(labels)
        b = Bank.from_trajectories(f.bank_trajs, states, store.fingerprint, **bank.get_params())
        sc = None if params.get("branches") == "distance" else LinearScorer(
            max_epochs=scorer_epochs, seed=params.get("seed", 0)).fit([states[i] for i in ids], [labels[i] for i in ids],
                                                                     fingerprint=store.fingerprint)
        results += LatentSift(b, sc, **params).score_pools(f.eval_pools, states, fingerprint=store.fingerprint)
    return _from_results(results, trajs, f"cross-fitted: {len(overlap)} calibration pools are in the bank; each "
                                         "scored by a bank and scorer of the other half of the repositories")


def _from_results(results, trajs, how: str) -> CalibrationPools:
    lab = {t.traj_id: int(t.label) for t in trajs}
    results = sorted(results, key=lambda r: r.instance_id)
    return CalibrationPools([r.instance_id for r in results], [[c.traj_id for c in r.candidates] for r in results],
                            [np.array([c.s for c in r.candidates], dtype=np.float64) for r in results],
                            [np.array([lab[c.traj_id] for c in r.candidates]) for r in results], how=how)


def target_recall_options(*, target_recall=None, calibration=None, bank_choice: str = "all",
                          calibration_method: str = "isotonic", calibration_epochs: int = 40, on_shift=None,
                          min_keep=None) -> dict:
    """Check ``filter``'s --target-recall options before any work (one-line refusals); resolve the defaults.

    Returns ``{"target_recall", "on_shift", "min_keep"}``: without a target, "warn" and 3 (the paper's
    rule); with one, "keep-all" and 1. The calibration file is read for its labels only.
    """
    if target_recall is None:
        if calibration is not None:
            raise LatentSiftError("--calibration is used with --target-recall only; pass --target-recall R.")
        return {"target_recall": None, "on_shift": on_shift or "warn", "min_keep": 3 if min_keep is None else min_keep}
    target_recall = check_target_recall(target_recall, "filter (--target-recall)")
    if calibration is None:
        raise LatentSiftError("--target-recall needs --calibration (labelled pools to choose the threshold on).")
    if bank_choice != "all":
        raise LatentSiftError("--target-recall calibrates on the sifter's all-agent bank: use --bank-choice all "
                              "(per-pool sub-banks would need a calibration each).")
    check_choice(calibration_method, "calibration_method", "filter (--calibration-method)", CALIBRATION_METHODS)
    check_positive_int(calibration_epochs, "calibration_epochs", "filter (--calibration-epochs)")
    if on_shift is not None:
        check_choice(on_shift, "on_shift", "filter (--on-shift with --target-recall)", (*ON_SHIFT_TARGET, "error"))
    if min_keep is not None:
        check_positive_int(min_keep, "min_keep", "filter (--min-keep)")
    check_calibration_size(count_positive_pools(calibration), target_recall, "filter")
    return {"target_recall": target_recall, "on_shift": on_shift or "keep-all", "min_keep": 1 if min_keep is None
            else min_keep}


def count_positive_pools(cal_path, instances=None) -> int:
    """Calibration pools holding a resolved candidate (read from the labels, before any scoring)."""
    return sum(any(c.label == 1 for c in p.candidates) for p in load_selected_pools(cal_path, instances))


def target_recall_filter(run, target: float, cal: CalibrationPools, *, method: str = "isotonic", min_keep: int = 1,
                         on_shift: str = "keep-all") -> dict:
    """Apply the recall-targeted rule to a ``FilterRun`` (in place) and add its ``operating_point`` section."""
    cmap = fit_calibration(*cal.flat(), method=method)
    op = fit_operating_point(cal, cmap, target, min_keep=min_keep, seed=run.settings.get("seed", 0))
    shift = run.extra.get("shift")
    shifted = [x["instance_id"] for x in (shift or {}).get("pools", []) if x.get("shifted")]
    rows = apply_operating_point(run.pools, op, shifted=shifted, on_shift=on_shift)
    section = op.to_dict() | {"calibration_pools": {"how": cal.how, "n_pools": len(cal.scores),
                                                    "n_with_resolved": cal.n_positive()},
                              "shift_checked": shift is not None, "on_shift": on_shift, "pools": rows}
    run.settings = dict(run.settings) | {"min_keep": min_keep, "target_recall": target}
    run.extra["operating_point"] = section
    return section
