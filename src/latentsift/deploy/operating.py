"""The recall-targeted keep rule in deployment: ``filter --target-recall R`` (``target_recall_filter``).

The rule itself, its guarantee (conformal risk control) and the calibration pools it is fitted on are
``latentsift.sift.keep`` (``RecallKeep``, ``CalibrationPools``). Here: the calibration pools scored as
new pools by the filter that ``filter`` runs (``calibration_pools_for_filter``: split or cross-fitted),
the one-line checks of the command's options before any work (``target_recall_options``), and the
rule applied to scored pools (``apply_operating_point``, ``sift.PoolResult``): a pool the shift guard
flags is never reported as guaranteed (``on_shift`` decides what it keeps).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .._core.validation import LatentSiftError, check_choice, check_positive_int
from ..bank.bank import Bank, inner_folds
from ..sift.calibration import DEFAULT_CALIBRATION, calibration_methods
from ..sift.keep import (CalibrationPools, FixedKeep, RecallKeep, apply_keep, check_calibration_size,
                         check_target_recall, keep_rule, keep_rules, top_mask)
from ..sift.scorer import LinearScorer
from ..sift.rules import filter_entry, make_baseline
from ..sift.sift import LatentSift, load_selected_pools
from .sifter import Sifter
from ..states.store import StateStore

TARGET_RECALLS = (0.90, 0.95, 0.99)
ON_SHIFT_TARGET = ("keep-all", "warn")


def apply_operating_point(results: list, op: RecallKeep, *, shifted: Sequence[str] = (),
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
        p = op.predict_proba(s)
        shift = res.instance_id in flagged
        if shift and on_shift == "keep-all":
            mask = np.ones(len(ids), dtype=bool)
            reason = "shift guard flagged the pool: keep-all (no guarantee)"
        else:
            mask = op.keep(s, ids)
            n_top = int(top_mask(s, ids, op.min_keep, op.seed).sum())
            n_above = int((np.nan_to_num(s, nan=-np.inf) >= op.threshold_).sum())
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


def calibration_pools_for_filter(cal_path, cal_states, *, method: str = LatentSift.name, bank_dir=None, scorer_dir=None,
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
    entry = filter_entry(method)
    if entry.kind != "state":
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
        filt = entry.factory(bank, None if params.get("branches") == "distance" else
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
        results += entry.factory(b, sc, **params).score_pools(f.eval_pools, states, fingerprint=store.fingerprint)
    return _from_results(results, trajs, f"cross-fitted: {len(overlap)} calibration pools are in the bank; each "
                                         "scored by a bank and scorer of the other half of the repositories")


def _from_results(results, trajs, how: str) -> CalibrationPools:
    lab = {t.traj_id: int(t.label) for t in trajs}
    results = sorted(results, key=lambda r: r.instance_id)
    return CalibrationPools([r.instance_id for r in results], [[c.traj_id for c in r.candidates] for r in results],
                            [np.array([c.s for c in r.candidates], dtype=np.float64) for r in results],
                            [np.array([lab[c.traj_id] for c in r.candidates]) for r in results], how=how)


def target_recall_options(*, target_recall=None, calibration=None, bank_choice: str = "all",
                          calibration_method: str = DEFAULT_CALIBRATION, calibration_epochs: int = 40, on_shift=None,
                          min_keep=None, keep_rule: str = FixedKeep.name) -> dict:
    """Check ``filter``'s --target-recall options before any work (one-line refusals); resolve the defaults.

    Returns ``{"target_recall", "on_shift", "min_keep"}``: without a target, "warn" and 3 (the paper's
    rule); with one, "keep-all" and 1. The calibration file is read for its labels only.
    """
    check_choice(keep_rule, "keep_rule", "filter (--keep-rule)", keep_rules())
    if keep_rule != FixedKeep.name and (target_recall is not None or keep_rule == RecallKeep.name):
        raise LatentSiftError("--keep-rule names another retention than the paper's; the recall-targeted one is "
                              "--target-recall R: pass one of them.")
    if target_recall is None:
        if calibration is not None and keep_rule == FixedKeep.name:
            raise LatentSiftError("--calibration is used with --target-recall only (or with a --keep-rule to fit "
                                  "on it); pass --target-recall R.")
        return {"target_recall": None, "on_shift": on_shift or "warn", "min_keep": 3 if min_keep is None else min_keep}
    target_recall = check_target_recall(target_recall, "filter (--target-recall)")
    if calibration is None:
        raise LatentSiftError("--target-recall needs --calibration (labelled pools to choose the threshold on).")
    if bank_choice != "all":
        raise LatentSiftError("--target-recall calibrates on the sifter's all-agent bank: use --bank-choice all "
                              "(per-pool sub-banks would need a calibration each).")
    check_choice(calibration_method, "calibration_method", "filter (--calibration-method)", calibration_methods())
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


def keep_rule_filter(run, name: str, cal: CalibrationPools | None = None) -> dict:
    """Apply the registered keep rule ``name`` (fitted on ``cal`` when given) to a ``FilterRun`` (in place)
    and record it in its ``keep_rule`` section."""
    rule = keep_rule(name)
    if cal is not None:
        rule.fit(cal)
    apply_keep(run.pools, rule)
    section = rule.to_dict() | {"calibration_pools": None if cal is None else
                                {"how": cal.how, "n_pools": len(cal.scores), "n_with_resolved": cal.n_positive()}}
    run.extra["keep_rule"] = section
    return section


def target_recall_filter(run, target: float, cal: CalibrationPools, *, method: str = DEFAULT_CALIBRATION, min_keep: int = 1,
                         on_shift: str = "keep-all") -> dict:
    """Apply the recall-targeted rule to a ``FilterRun`` (in place) and add its ``operating_point`` section."""
    op = RecallKeep(target, min_keep=min_keep, calibration=method, seed=run.settings.get("seed", 0)).fit(cal)
    shift = run.extra.get("shift")
    shifted = [x["instance_id"] for x in (shift or {}).get("pools", []) if x.get("shifted")]
    rows = apply_operating_point(run.pools, op, shifted=shifted, on_shift=on_shift)
    section = op.to_dict() | {"calibration_pools": {"how": cal.how, "n_pools": len(cal.scores),
                                                    "n_with_resolved": cal.n_positive()},
                              "shift_checked": shift is not None, "on_shift": on_shift, "pools": rows}
    run.settings = dict(run.settings) | {"min_keep": min_keep, "target_recall": target}
    run.extra["operating_point"] = section
    return section
