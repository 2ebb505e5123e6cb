"""The calibration pools of ``filter`` and ``fit --target-recall``: the labelled pools of ``--calibration``
read and checked, scored as new pools by the filter the command runs (``calibration_pools_for_filter``:
split or cross-fitted), kept disjoint from the pools filtered, and, for a rule filter (no bank), the shift
guard against them (``calibration_guard``). The rule fitted on them is ``latentsift.sift.keep``; applied
to the pools, ``latentsift.deploy.operating``."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .._core.validation import LatentSiftError, check_states_present
from ..bank.bank import Bank, inner_folds
from ..deploy.library import open_stores
from ..deploy.shift import Reference, guard
from ..deploy.sifter import Sifter
from ..sift.keep import CalibrationPools
from ..sift.rules import filter_entry, make_baseline
from ..sift.scorer import LinearScorer, early_stopping_groups
from ..sift.sift import LatentSift, load_selected_pools
from ..states.store import StateStore, check_recorded_settings

__all__ = ["calibration_guard", "calibration_pools_for_filter", "check_calibration_disjoint",
           "check_calibration_disjoint_ids", "check_calibration_inputs", "count_positive_pools",
           "labelled_calibration_pools"]


CALIBRATION_MODES = ("split", "cross-fitted")


def labelled_calibration_pools(cal_path, instances=None) -> list:
    """The pools of the --calibration file, refused when a candidate has no reward."""
    pools = load_selected_pools(cal_path, instances)
    unlabelled = [c.traj_id for p in pools for c in p.candidates if c.label is None]
    if unlabelled:
        raise LatentSiftError(f"--calibration: {len(unlabelled)} candidates of {cal_path} have no reward, "
                              f"e.g. {unlabelled[0]!r}; calibration pools must be labelled.")
    return pools


def check_calibration_inputs(cal_path, cal_states, states_dirs: Sequence, owner: str) -> None:
    """Before a sifter is fitted for an operating point (``fit --target-recall``): the calibration pools are
    labelled and their states are in ``cal_states``, extracted with the model and the value-changing settings
    of the sifter's ``states_dirs`` (what ``calibration_pools_for_filter`` would refuse after the fit); without
    ``cal_states`` (a method that needs no states), the labels only."""
    if cal_states is not None:
        open_stores([*states_dirs, cal_states], owner)
    trajs = [c for p in labelled_calibration_pools(cal_path) for c in p.candidates]
    if cal_states is not None:
        check_states_present(StateStore(cal_states).open(), trajs, f"{owner} (--calibration-states)")


def calibration_pools_for_filter(cal_path, cal_states, *, method: str = LatentSift.name, bank_dir=None, scorer_dir=None,
                                 sifter_dir=None, settings: dict | None = None, scorer_epochs: int = 40,
                                 instances=None, states_dir=None) -> CalibrationPools:
    """Labelled calibration pools scored as new pools by the filter that ``filter`` runs.

    "split": no calibration pool's instance is in the bank (or a baseline, which has none): the pools
    are scored by the same bank, scorer and settings as the pools to filter (split conformal).
    "cross-fitted": some are in the bank (e.g. the bank's own pools): each pool is scored by a bank
    and scorer fitted on the calibration trajectories of the other half of their repositories
    (``bank.inner_folds``, 2 repository-disjoint halves; ``scorer_epochs`` per half); no pool is
    then guaranteed (half-size banks stand in for the deployed one). ``cal_states`` extracted with
    other value-changing settings than the bank's, the scorer's or (a rule) ``states_dir``'s are
    refused, as every states input is. ``extra`` records the file, its states and the overlaps.
    """
    settings = dict(settings or {})
    pools = labelled_calibration_pools(cal_path, instances)
    trajs = [c for p in pools for c in p.candidates]
    store = None if cal_states is None else StateStore(cal_states).open()
    extra = {"file": str(Path(cal_path).resolve()),
             "states": None if store is None else str(Path(cal_states).resolve()),
             "states_settings": None if store is None else store.settings,
             "states_fingerprint": None if store is None else store.fingerprint.to_dict()}
    sifter = None if sifter_dir is None else Sifter.load(sifter_dir)
    if sifter is not None and not sifter.method_.needs_scorer:  # a stack or a rule: its own method
        return _sifter_calibration(sifter, pools, trajs, store, extra, scorer_epochs)
    entry = filter_entry(method)
    if sifter is None and entry.kind != "state":
        if store is not None and states_dir is not None and Path(states_dir).resolve() != Path(cal_states).resolve():
            check_recorded_settings(StateStore(states_dir).open().settings, store, f"The states {states_dir}")
        results = make_baseline(method, **settings).score_pools(pools, store)
        extra |= {"n_in_bank": 0, "n_in_scorer_training": 0}
        return _from_results(results, trajs, "split (a rule: no bank)", extra)
    if store is None:
        raise LatentSiftError("filter --calibration needs the calibration candidates' states (--calibration-states "
                              "or the --states store).")
    if sifter is not None:
        bank, params, scorer = sifter.bank, sifter.filter_params(), sifter.scorer
        check_recorded_settings(bank.source_.get("store_settings"), store, f"The sifter {sifter_dir}")
        trained_on = bank.instance_ids_   # a sifter's scorer is fitted on its bank's trajectories
    else:
        bank = Bank.load(bank_dir)
        params = dict(settings)
        check_recorded_settings(bank.source_.get("store_settings"), store, f"The bank {bank_dir}")
        scorer = None if params.get("branches") == "distance" else LinearScorer.load(scorer_dir)
        if scorer is not None:
            check_recorded_settings(scorer.source_.get("store_settings"), store, f"The scorer {scorer_dir}")
        trained_on = set() if scorer is None else scorer_training_instances(scorer, bank_dir, bank)
    ids = {p.instance_id for p in pools}
    overlap = sorted(ids & bank.instance_ids_)
    extra |= {"n_in_bank": len(overlap),
              "n_in_scorer_training": None if trained_on is None else len(ids & trained_on)}
    if not overlap:
        filt = entry.factory(bank, scorer, **params)
        return _from_results(filt.score_pools(pools, store.load([t.traj_id for t in trajs]),
                                              fingerprint=store.fingerprint), trajs,
                             "split: calibration pools disjoint from the bank, scored by the same bank and scorer", extra)
    states = store.load([t.traj_id for t in trajs])
    folds = list(inner_folds(trajs, seed=params.get("seed", 0)))
    results = []
    for f in folds:
        labels = {t.traj_id: int(t.label) for t in f.bank_trajs}
        if len(set(labels.values())) < 2 or not f.eval_pools:
            raise LatentSiftError(f"filter --calibration: {len(overlap)} calibration pools are in the bank, so they are "
                                  "cross-fitted over two repository-disjoint halves, and a half has one class only or "
                                  "no pools; give calibration pools from more repositories.")
        tids = sorted(labels)
        b = Bank.from_trajectories(f.bank_trajs, states, store.fingerprint, **bank.get_params())
        sc = None if params.get("branches") == "distance" else LinearScorer(
            max_epochs=scorer_epochs, seed=params.get("seed", 0)).fit([states[i] for i in tids],
                                                                     [labels[i] for i in tids],
                                                                     fingerprint=store.fingerprint,
                                                                     groups=early_stopping_groups(f.bank_trajs))
        results += entry.factory(b, sc, **params).score_pools(f.eval_pools, states, fingerprint=store.fingerprint)
    return _from_results(results, trajs, f"cross-fitted: {len(overlap)} calibration pools are in the bank; each "
                                         "scored by a bank and scorer of the other half of the repositories", extra)


def _sifter_calibration(sifter: Sifter, pools, trajs, store, extra: dict, scorer_epochs: int) -> CalibrationPools:
    """The calibration pools of a sifter whose method is a stack or a rule (``deploy.methods``): "split" when no
    calibration pool's instance is among the runs it was fitted on (or the method is a rule, which learned
    nothing per pool), else each pool scored by the method refitted on the other half of the repositories."""
    if store is None and sifter.method_.needs_states:
        raise LatentSiftError(f"filter --calibration: the sifter's method {sifter.method_.name!r} scores states: pass "
                              "--calibration-states (or --states).")
    states = None if store is None else store.load([t.traj_id for t in trajs])
    fp = None if store is None else store.fingerprint
    overlap = sorted({p.instance_id for p in pools} & set(sifter.seen_bank.instances_.values()))
    extra |= {"n_in_bank": len(overlap), "n_in_scorer_training": len(overlap)}
    if not overlap or sifter.method_.family == "rule":
        return _from_results(sifter.score_pools(pools, states, fingerprint=fp), trajs,
                             f"split: scored by the sifter's {sifter.method_.name} as fitted", extra)
    results = []
    for f in inner_folds(trajs, seed=sifter.seed):
        half = Sifter(**(sifter.get_params(deep=False) | {"scorer_epochs": scorer_epochs})).fit(f.bank_trajs, states,
                                                                                                 fingerprint=fp)
        results += half.score_pools(f.eval_pools, states, fingerprint=fp)
    return _from_results(results, trajs, f"cross-fitted: {len(overlap)} calibration pools are in the sifter's runs; "
                                         "each scored by its method refitted on the other half of the repositories",
                         extra)


def scorer_training_instances(scorer, bank_dir, bank) -> set[str] | None:
    """The instances a scorer was trained on: those of the bank it records (``scorer train``), None when
    it records none (then the calibration set's overlap with them is unknown)."""
    src = (getattr(scorer, "source_", None) or {}).get("bank_dir")
    if not src:
        return None
    if bank_dir is not None and Path(src).resolve() == Path(bank_dir).resolve():
        return bank.instance_ids_
    return Bank.load(src).instance_ids_ if Path(src).is_dir() else None


def check_calibration_disjoint(cal_path, pools_path, instances=None) -> None:
    """Refuse calibration pools that are also pools to filter (the calibration set must be disjoint from
    the pools its guarantee is for)."""
    check_calibration_disjoint_ids([p.instance_id for p in load_selected_pools(cal_path)], pools_path, instances)


def check_calibration_disjoint_ids(cal_ids, pools_path, instances=None) -> None:
    """``check_calibration_disjoint`` with the calibration pools' instance ids."""
    both = sorted(set(cal_ids) & {p.instance_id for p in load_selected_pools(pools_path, instances)})
    if both:
        raise LatentSiftError(f"filter --calibration: {len(both)} of its pools are also pools to filter (e.g. "
                              f"{both[0]!r}); calibration pools must be disjoint from the pools they calibrate.")


def calibration_guard(run, pools_path, states_dir, cal: CalibrationPools, on_shift: str, instances=None) -> None:
    """The shift guard for a rule filter (it has no bank): the pools to filter against a bank of the
    calibration pools' states (are the new pools like the calibration pools?); adds ``shift`` to ``run``.
    Without states (or calibration states) nothing is checked and every pool says "shift unchecked"."""
    if states_dir is None or not cal.extra.get("states"):
        return
    cal_pools = load_selected_pools(cal.extra["file"])
    trajs = [c for p in cal_pools for c in p.candidates]
    cal_store = StateStore(cal.extra["states"]).open()
    bank = Bank.from_trajectories(trajs, cal_store.load([t.traj_id for t in trajs]), cal_store.fingerprint)
    pools = load_selected_pools(pools_path, instances)
    store = StateStore(states_dir).open()
    states = store.load([c.traj_id for p in pools for c in p.candidates])
    shift, warnings = guard(run.pools, pools, states, bank, Reference.from_bank(bank), on_shift)
    run.extra["shift"] = {**shift, "reference_of": "the calibration pools (a rule filter has no bank)",
                          "warnings": warnings}


def _from_results(results, trajs, how: str, extra: dict) -> CalibrationPools:
    lab = {t.traj_id: int(t.label) for t in trajs}
    results = sorted(results, key=lambda r: r.instance_id)
    return CalibrationPools([r.instance_id for r in results], [[c.traj_id for c in r.candidates] for r in results],
                            [np.array([c.s for c in r.candidates], dtype=np.float64) for r in results],
                            [np.array([lab[c.traj_id] for c in r.candidates]) for r in results], how=how, extra=extra)


def count_positive_pools(cal_path, instances=None) -> int:
    """Calibration pools holding a resolved candidate (read from the labels, before any scoring)."""
    return sum(any(c.label == 1 for c in p.candidates) for p in load_selected_pools(cal_path, instances))
