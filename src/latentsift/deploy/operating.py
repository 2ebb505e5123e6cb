"""The recall-targeted keep rule in deployment: applied to scored pools, with what it guarantees.

The rule itself, its guarantee (conformal risk control) and the calibration pools it is fitted on are
``latentsift.sift.keep`` (``RecallKeep``, ``CalibrationPools``). Here: the rule applied to scored pools
(``apply_operating_point``, ``sift.PoolResult``; a pool the shift guard flags is never reported as
guaranteed, ``on_shift`` decides what it keeps) and to a whole ``FilterRun`` with its ``operating_point``
section (``target_recall_filter``). The command's side (its options checked, the calibration pools
scored by the filter it runs) is ``latentsift._jobs.operating`` and ``latentsift._jobs.calibration``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..sift.calibration import DEFAULT_CALIBRATION
from ..sift.keep import CalibrationPools, RecallKeep, keep_rule, top_mask
from ..sift.keep_confident import ConfidentRecallKeep
from ..sift.retain import TARGET_MIN_KEEP

TARGET_RECALLS = (0.90, 0.95, 0.99)
#: What a pool needs to be reported as guaranteed (each failure is named in ``not_guaranteed``).
GUARANTEE_CONDITIONS = ("the calibration pools are disjoint from the bank, from the scorer's training data and from "
                        "the pools filtered (the last is refused)", "the pool's instance is not in the bank (no leak)",
                        "the shift check ran on the pool and passed",
                        "the pool's size K lies within the calibration pools' sizes")
PROMISE = ("expected pool recall >= R: averaged over the draw of the calibration pools and of a new pool holding a "
           "resolved candidate, when the two are exchangeable (same agent, same kind of task, scored the same way); "
           "not a promise for one set of pools")
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
