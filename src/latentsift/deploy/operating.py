"""The recall-targeted keep rule in deployment: ``filter --target-recall R`` (``target_recall_filter``).

The rule itself, its guarantee (conformal risk control) and the calibration pools it is fitted on are
``latentsift.sift.keep`` (``RecallKeep``, ``CalibrationPools``). Here: the calibration pools scored as
new pools by the filter that ``filter`` runs (``calibration_pools_for_filter``: split or cross-fitted),
the one-line checks of the command's options before any work (``target_recall_options``), and the
rule applied to scored pools (``apply_operating_point``, ``sift.PoolResult``): a pool the shift guard
flags is never reported as guaranteed (``on_shift`` decides what it keeps).
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .._core.registry import registry_lookup
from .._core.validation import LatentSiftError, check_choice, check_positive_int, check_states_present
from ..bank.bank import Bank, inner_folds
from ..sift.calibration import DEFAULT_CALIBRATION, calibration_methods
from ..sift.keep import (CalibrationPools, FixedKeep, KeepRule, RecallKeep, apply_keep, check_calibration_size,
                         check_target_recall, keep_rule, keep_rules, min_calibration_pools, top_mask)
from ..sift.keep_confident import ConfidentRecallKeep, check_confidence, min_confident_pools
from ..sift.retain import MIN_KEEP, TARGET_MIN_KEEP
from ..sift.scorer import LinearScorer
from ..sift.rules import filter_entry, make_baseline
from ..sift.sift import LatentSift, load_selected_pools
from .library import open_stores
from .sifter import Sifter
from ..states.store import StateStore, check_recorded_settings
from .shift import Reference, guard

TARGET_RECALLS = (0.90, 0.95, 0.99)
ON_SHIFT_TARGET = ("keep-all", "warn")
#: What a pool needs to be reported as guaranteed (each failure is named in ``not_guaranteed``).
GUARANTEE_CONDITIONS = ("the calibration pools are disjoint from the bank, from the scorer's training data and from "
                        "the pools filtered (the last is refused)", "the pool's instance is not in the bank (no leak)",
                        "the shift check ran on the pool and passed",
                        "the pool's size K lies within the calibration pools' sizes")
PROMISE = ("expected pool recall >= R: averaged over the draw of the calibration pools and of a new pool holding a "
           "resolved candidate, when the two are exchangeable (same agent, same kind of task, scored the same way); "
           "not a promise for one set of pools")
COSTS = ("calls", "tokens")
_NEAREST = ("--bank-choice nearest with a target recall needs a threshold per sub-bank, each calibrated on pools "
            "that sub-bank scores, and the sifter holds one for its all-agent bank only: use --bank-choice all")
CONFIDENT_PROMISE = ("pool recall >= R with probability >= the confidence over the draw of the calibration pools: the "
                     "recall of new pools exchangeable with them (the probability that a new pool holding a resolved "
                     "candidate keeps one), not the realized recall of a finite set of pools")


def apply_operating_point(results: list, op: RecallKeep, *, shifted: Sequence[str] = (),
                          on_shift: str = "keep-all", shift_checked: bool = True,
                          failed: Mapping[str, Sequence[str]] | None = None, max_keep: int | None = None,
                          pool_sizes: Sequence[int] | None = None) -> list[dict]:
    """Apply ``op`` to scored pools (``sift.PoolResult``, changed in place: ``retained`` and ``n_keep``).

    Returns per pool: the number kept, the calibrated probability of each candidate, the reason, the
    shift check's outcome ("passed", "flagged" or "unchecked") and whether the guarantee applies, with
    ``not_guaranteed``: the conditions that failed (``GUARANTEE_CONDITIONS``). A pool in ``shifted``
    or unchecked (``shift_checked=False``) is never guaranteed; ``on_shift`` "keep-all" keeps a
    flagged pool's every candidate, "warn" applies the rule to it. ``failed``: instance -> the other
    conditions that failed for it ("" -> for every pool). ``max_keep``: at most that many per pool (the
    best of those the rule keeps); a pool the cap cuts is not guaranteed. ``pool_sizes``: [smallest K,
    largest K] of the calibration pools; a pool of another size is not guaranteed (the exchangeability
    the bound needs does not reach it). None: not checked.
    """
    flagged = set(shifted)
    failed = dict(failed or {})
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
            n_top = min(op.min_keep, len(ids))  # what top_mask marks, without sorting the pool again
            n_above = int((np.nan_to_num(op.threshold_scores(s), nan=-np.inf) >= op.threshold_).sum())
            if mask.all() and len(ids) > n_top:
                reason = "uncertain: every candidate reaches the threshold"
            elif n_above <= n_top:
                reason = f"confident: no candidate beyond the best {n_top} reaches the threshold"
            else:
                reason = f"{n_above} candidates reach the threshold"
            if shift:
                reason += " (shift guard flagged the pool: rule applied, no guarantee)"
        capped = max_keep is not None and int(mask.sum()) > max_keep
        if capped:
            reason += f" (capped at --max-keep {max_keep}: the rule kept {int(mask.sum())})"
            mask = top_mask(s, ids, max_keep, op.seed)
        for c, m in zip(res.candidates, mask):
            c.retained = bool(m)
        res.n_keep = int(mask.sum())
        state = "flagged" if shift else "passed" if shift_checked else "unchecked"
        why = list(failed.get("", ())) + list(failed.get(res.instance_id, ()))
        why += [f"capped at --max-keep {max_keep}"] if capped else []
        if pool_sizes is not None and not pool_sizes[0] <= len(ids) <= pool_sizes[1]:
            why.append(f"pool size K = {len(ids)} outside the calibration pools' sizes ({pool_sizes[0]} to "
                       f"{pool_sizes[1]})")
        why += {"flagged": ["shift guard flagged the pool"], "unchecked": ["shift unchecked"]}.get(state, [])
        out.append({"instance_id": res.instance_id, "k": len(ids), "n_keep": res.n_keep,
                    "probabilities": {t: float(v) for t, v in zip(ids, p)}, "reason": reason, "shift": state,
                    "guaranteed": not why, "not_guaranteed": why})
    return out


# ---------------------------------------------------------------------- files in, FILTER.json out
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
    of the sifter's ``states_dirs`` (what ``calibration_pools_for_filter`` would refuse after the fit)."""
    open_stores([*states_dirs, cal_states], owner)
    trajs = [c for p in labelled_calibration_pools(cal_path) for c in p.candidates]
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
    entry = filter_entry(method)
    if entry.kind != "state":
        if store is not None and states_dir is not None and Path(states_dir).resolve() != Path(cal_states).resolve():
            check_recorded_settings(StateStore(states_dir).open().settings, store, f"The states {states_dir}")
        results = make_baseline(method, **settings).score_pools(pools, store)
        extra |= {"n_in_bank": 0, "n_in_scorer_training": 0}
        return _from_results(results, trajs, "split (a rule: no bank)", extra)
    if store is None:
        raise LatentSiftError("filter --calibration needs the calibration candidates' states (--calibration-states "
                              "or the --states store).")
    if sifter_dir is not None:
        sifter = Sifter.load(sifter_dir)
        bank, params, scorer = sifter.bank, sifter.get_params(), sifter.scorer
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
                                                                     fingerprint=store.fingerprint)
        results += entry.factory(b, sc, **params).score_pools(f.eval_pools, states, fingerprint=store.fingerprint)
    return _from_results(results, trajs, f"cross-fitted: {len(overlap)} calibration pools are in the bank; each "
                                         "scored by a bank and scorer of the other half of the repositories", extra)


def scorer_training_instances(scorer, bank_dir, bank) -> set[str] | None:
    """The instances a scorer was trained on: those of the bank it records (``scorer train``), None when
    it records none (then the calibration set's overlap with them is unknown)."""
    src = (getattr(scorer, "source_", None) or {}).get("bank_dir")
    if not src:
        return None
    if bank_dir is not None and Path(src).resolve() == Path(bank_dir).resolve():
        return bank.instance_ids_
    return Bank.load(src).instance_ids_ if Path(src).is_dir() else None


def calibration_failures(cal: CalibrationPools) -> list[str]:
    """The guarantee's calibration conditions that ``cal`` fails (``GUARANTEE_CONDITIONS``), in words."""
    out = []
    if cal.extra.get("n_in_bank"):
        out.append(f"{cal.extra['n_in_bank']} calibration pools are in the bank (cross-fitted scores of half-size "
                   "banks stand in for the deployed bank's)")
    n_sc = cal.extra.get("n_in_scorer_training", 0)
    if n_sc is None:
        out.append("the scorer records no training data: the calibration set's overlap with it is unchecked")
    elif n_sc and not cal.extra.get("n_in_bank"):
        out.append(f"{n_sc} calibration pools are in the scorer's training data")
    return out


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


def _takes(cls: type, param: str) -> bool:
    return param in inspect.signature(cls.__init__).parameters


def keep_rule_choice(keep_rule: str | None = None, *, target_recall=None, confidence=None, calibration=None,
                     saved: bool = False, given: Mapping[str, object] | None = None) -> str:
    """The registered keep rule ``filter`` applies, from ``--keep-rule`` (None: not given) and the options it
    needs or excludes; contradictions refused in one line before any work.

    The rule: a recall-targeted rule (a ``RecallKeep``: ``target-recall``, ``confident-recall``, ``gap-recall``)
    keeps for ``--target-recall R`` and is fitted on ``--calibration`` (or is a saved operating point's);
    ``--target-recall`` alone is ``target-recall`` (``confident-recall`` with ``--confidence``); any other
    rule (``fixed``, a plugin's) takes no ``--target-recall`` / ``--confidence``, and one that learns from
    labelled pools (it has its own ``fit``) needs ``--calibration``. ``given``: the rule's settings given on the
    command line (``{"min_keep": 2, "frac": None}``, None = not given); one the rule does not take is refused.
    """
    name = _keep_rule_name(keep_rule, target_recall=target_recall, confidence=confidence, calibration=calibration,
                           saved=saved)
    cls = registry_lookup("keep_rule", name)
    for setting, value in (given or {}).items():
        if value is not None and isinstance(cls, type) and not _takes(cls, setting):
            raise LatentSiftError(f"--{setting.replace('_', '-')} is not a setting of the keep rule {name}: drop it.")
    return name


def _keep_rule_name(keep_rule: str | None = None, *, target_recall=None, confidence=None, calibration=None,
                    saved: bool = False) -> str:
    recall = target_recall is not None or saved
    if keep_rule is None:
        return (ConfidentRecallKeep.name if confidence is not None else RecallKeep.name) if recall else FixedKeep.name
    check_choice(keep_rule, "keep_rule", "filter (--keep-rule)", keep_rules())
    cls = registry_lookup("keep_rule", keep_rule)
    if keep_rule == RecallKeep.name and confidence is not None:
        keep_rule, cls = ConfidentRecallKeep.name, ConfidentRecallKeep  # the rule's high-probability mode
    if not (isinstance(cls, type) and issubclass(cls, RecallKeep)):
        if recall:
            raise LatentSiftError(f"--keep-rule {keep_rule} does not target a recall, and --target-recall (or "
                                  "--operating-point) picks the recall-targeted rule: pass one of them.")
        if confidence is not None:
            raise LatentSiftError(f"--confidence is a setting of the recall-targeted rules; --keep-rule {keep_rule} "
                                  "has none: drop it.")
        if isinstance(cls, type) and cls.fit is not KeepRule.fit and calibration is None:
            raise LatentSiftError(f"--keep-rule {keep_rule} is fitted on labelled pools: pass --calibration CAL.jsonl.")
        return keep_rule
    if not recall:
        raise LatentSiftError(f"--keep-rule {keep_rule} keeps the fewest candidates that reach a target pool recall: "
                              "pass --target-recall R (with --calibration CAL.jsonl, or --sifter with a saved "
                              "operating point).")
    if confidence is not None and not _takes(cls, "confidence"):
        raise LatentSiftError(f"--keep-rule {keep_rule} has no --confidence (its guarantee is in expectation); drop "
                              "--confidence, or use --keep-rule target-recall.")
    if confidence is None and _takes(cls, "confidence"):
        raise LatentSiftError(f"--keep-rule {keep_rule} needs --confidence C (the probability of reaching the target).")
    return keep_rule


def target_recall_options(*, target_recall=None, calibration=None, bank_choice: str = "all",
                          calibration_method: str = DEFAULT_CALIBRATION, calibration_epochs: int = 40, on_shift=None,
                          min_keep=None, pools=None, instances=None, confidence=None, saved: bool = False,
                          max_keep=None, cost: str = "calls", keep_rule: str | None = None,
                          command: str = "filter", frac=None) -> dict:
    """Check ``filter``'s --target-recall options before any work (one-line refusals); resolve the defaults.

    Returns ``{"target_recall", "on_shift", "min_keep", "confidence", "needed", "have"}``: without a
    target, "warn" and ``MIN_KEEP`` (the paper's rule); with one, "keep-all" and ``TARGET_MIN_KEEP``, and the
    calibration pools holding a resolved candidate that the bound needs (``confidence``: the high-probability mode,
    ``keep_confident``) and that the file has. The calibration file is read for its labels and
    instances only (refused when it shares a pool with ``pools``, the pools to filter). ``saved``: a
    saved operating point will be applied (``operating_file``; checked there): no ``calibration``
    needed. ``max_keep``: a cap per pool (with a target only); ``cost``: "calls" ("tokens" is refused:
    no filter input holds the verifier's tokens per candidate). ``command``: the command whose options
    these are, named in the messages ("filter" or "fit"); ``frac``: the fixed rule's, refused with another.
    """
    rule = keep_rule_choice(keep_rule, target_recall=target_recall, confidence=confidence, calibration=calibration,
                            saved=saved, given={"min_keep": min_keep, "frac": frac})
    check_choice(cost, "cost", f"{command} (--cost)", COSTS)
    if cost == "tokens":
        raise LatentSiftError("--cost tokens needs each candidate's verifier token count, which no input of 'filter' "
                              "holds (the verifier runs after Stage 1); use --cost calls, the candidates kept.")
    if max_keep is not None and target_recall is None and not saved:
        raise LatentSiftError("--max-keep caps the recall-targeted rule: pass --target-recall R (or --operating-point).")
    if max_keep is not None:
        check_positive_int(max_keep, "max_keep", f"{command} (--max-keep)")
        if min_keep is not None and min_keep > max_keep:
            raise LatentSiftError(f"--min-keep {min_keep} exceeds --max-keep {max_keep}: a pool cannot keep at least "
                                  f"{min_keep} and at most {max_keep}; lower --min-keep or raise --max-keep.")
    if saved:
        if calibration is not None:
            raise LatentSiftError("Pass --calibration (fit the rule now) or a saved operating point, not both.")
        if bank_choice != "all":
            raise LatentSiftError(_NEAREST)
        return {"target_recall": target_recall, "on_shift": on_shift or "keep-all", "min_keep": min_keep,
                "confidence": confidence, "max_keep": max_keep, "rule": rule}
    if target_recall is None:
        if confidence is not None:
            raise LatentSiftError("--confidence is used with --target-recall only; pass --target-recall R.")
        if calibration is not None and rule == FixedKeep.name:
            raise LatentSiftError("--calibration is used with --target-recall only"
                                  + (" (or with a --keep-rule to fit on it)" if command == "filter" else "")
                                  + "; pass --target-recall R.")
        return {"target_recall": None, "on_shift": on_shift or "warn", "min_keep": MIN_KEEP if min_keep is None
                else min_keep,
                "confidence": None, "max_keep": None, "rule": rule}
    target_recall = check_target_recall(target_recall, f"{command} (--target-recall)")
    if calibration is None:
        raise LatentSiftError("--target-recall needs --calibration (labelled pools to choose the threshold on), or a "
                              "sifter with a saved operating point ('latentsift fit --target-recall R --calibration').")
    if bank_choice != "all":
        raise LatentSiftError(_NEAREST)
    check_choice(calibration_method, "calibration_method", f"{command} (--calibration-method)", calibration_methods())
    check_positive_int(calibration_epochs, "calibration_epochs", f"{command} (--calibration-epochs)")
    if on_shift is not None:
        check_choice(on_shift, "on_shift", f"{command} (--on-shift with --target-recall)", (*ON_SHIFT_TARGET, "error"))
    if min_keep is not None:
        check_positive_int(min_keep, "min_keep", f"{command} (--min-keep)")
    if confidence is not None:
        confidence = check_confidence(confidence, f"{command} (--confidence)")
    if pools is not None:
        check_calibration_disjoint(calibration, pools, instances)
    have = count_positive_pools(calibration)
    if confidence is None:
        check_calibration_size(have, target_recall, command)
        needed = min_calibration_pools(target_recall)
    else:
        needed = min_confident_pools(target_recall, confidence)
        if target_recall < 1 and have < needed:
            raise LatentSiftError(f"{command}: --target-recall {target_recall:g} --confidence {confidence:g} needs at "
                                  f"least {needed} calibration pools that hold a resolved candidate (Learn then Test: "
                                  f"n >= log(1 - confidence) / log(R)); the calibration set has {have}. Add labelled "
                                  "pools, lower the target or the confidence.")
    return {"target_recall": target_recall, "on_shift": on_shift or "keep-all",
            "min_keep": TARGET_MIN_KEEP if min_keep is None else min_keep, "confidence": confidence, "needed": needed,
            "have": have, "max_keep": max_keep, "rule": rule}


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
    section = rule.to_dict() | {"rule": name, "calibration_pools": None if cal is None else
                                {"how": cal.how, "n_pools": len(cal.scores), "n_with_resolved": cal.n_positive()}}
    run.extra["keep_rule"] = section
    return section


def target_recall_filter(run, target: float | None, cal: CalibrationPools | None = None, *, method: str = DEFAULT_CALIBRATION,
                         min_keep: int = TARGET_MIN_KEEP, on_shift: str = "keep-all", confidence: float | None = None,
                         saved: tuple | None = None, max_keep: int | None = None, rule: str | None = None) -> dict:
    """Apply the recall-targeted rule to a ``FilterRun`` (in place) and add its ``operating_point`` section:
    ``RecallKeep`` (expected pool recall >= R), or with ``confidence`` ``ConfidentRecallKeep``
    (P(pool recall >= R) >= confidence), fitted on ``cal``; or ``saved``, (rule, record) of a saved
    operating point (``operating_file.load_operating_point``), applied without refitting.

    Each pool is marked guaranteed only when every condition of ``GUARANTEE_CONDITIONS`` holds; else
    ``not_guaranteed`` names those that failed (the calibration's, a leak, the shift check's outcome,
    the ``max_keep`` cap). ``rule``: the registered recall-targeted keep rule to fit (default
    ``target-recall``, ``confident-recall`` with ``confidence``).
    """
    seed = run.settings.get("seed", 0)
    if saved is not None:
        op, rec = saved
        cal_record = dict(rec["calibration_pools"]) | {"operating_point": rec.get("path"),
                                                       "calibration_fingerprint": rec["calibration_fingerprint"]}
        cal_failed = list(rec["not_guaranteed"])
        confidence = getattr(op, "confidence", None)
    else:
        rule = rule or (RecallKeep.name if confidence is None else ConfidentRecallKeep.name)
        op = keep_rule(rule, target_recall=target, min_keep=min_keep, calibration=method, seed=seed,
                       **({} if confidence is None else {"confidence": confidence})).fit(cal)
        cal_record = {"how": cal.how, "n_pools": len(cal.scores), "n_with_resolved": cal.n_positive(),
                      "pool_sizes": cal.pool_sizes(), **cal.extra}
        cal_failed = calibration_failures(cal)
    shift = run.extra.get("shift")
    shifted = [x["instance_id"] for x in (shift or {}).get("pools", []) if x.get("shifted")]
    if not cal_record.get("pool_sizes"):  # an operating point saved before the sizes were recorded
        cal_failed.append("the calibration pools' sizes are unrecorded (refit the operating point)")
    failed: dict[str, list[str]] = {"": cal_failed}
    for x in run.extra.get("leak", {}).get("pools", []):
        failed.setdefault(x["instance_id"], []).append("leak: the pool's instance is in the bank")
    rows = apply_operating_point(run.pools, op, shifted=shifted, on_shift=on_shift, shift_checked=shift is not None,
                                 failed=failed, max_keep=max_keep, pool_sizes=cal_record.get("pool_sizes"))
    section = op.to_dict() | {"promise": PROMISE if confidence is None else CONFIDENT_PROMISE,
                              "conditions": list(GUARANTEE_CONDITIONS), "calibration_pools": cal_record,
                              "refitted": saved is None, "max_keep": max_keep,
                              "shift_checked": shift is not None, "on_shift": on_shift,
                              "n_guaranteed": sum(r["guaranteed"] for r in rows), "pools": rows}
    run.settings = dict(run.settings) | {"min_keep": op.min_keep, "target_recall": op.target_recall} | (
        {} if confidence is None else {"confidence": confidence})
    run.inputs = dict(run.inputs) | {"calibration": cal_record.get("file"), "calibration_states": cal_record.get("states")}
    run.extra["operating_point"] = section
    return section
