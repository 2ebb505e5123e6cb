"""The recall-targeted rule's drivers for ``fit`` and ``filter``: fit an operating point beside a sifter,
and find, check and load the saved one that ``filter`` applies without refitting."""
from __future__ import annotations

from pathlib import Path

from .._core.outputs import owned_output
from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError, check_positive_int
from ..deploy.operating import (calibration_pools_for_filter, check_calibration_disjoint_ids, check_calibration_inputs,
                                target_recall_options)
from ..deploy.operating_file import OPERATING_POINT_JSON, load_operating_point, save_operating_point
from ..sift.calibration import DEFAULT_CALIBRATION
from ..sift.keep import RecallKeep
from ..sift.keep_confident import ConfidentRecallKeep
from .sifter import fit_sifter

__all__ = ["check_saved_rule", "fit_operating_point_file", "fit_sifter_with_operating_point", "saved_operating_point"]


def fit_sifter_with_operating_point(pools, states, out, *, target_recall=None, calibration=None,
                                    calibration_states=None, confidence=None, calibration_method: str = DEFAULT_CALIBRATION,
                                    calibration_epochs: int = 40, log=print, **fit_kw) -> tuple:
    """``latentsift fit`` [``--target-recall R --calibration CAL``]: the options checked before any work (what
    the bound needs logged), the sifter fitted and saved (``sifter.fit_sifter``), then, with a target, its
    operating point (``fit_operating_point_file``). Returns (sifter, the operating point's record or None)."""
    check_positive_int(fit_kw.get("scorer_epochs", 40), "scorer_epochs", "fit (--scorer-epochs)")
    target = target_recall_options(target_recall=target_recall, calibration=calibration, confidence=confidence,
                                   calibration_method=calibration_method, calibration_epochs=calibration_epochs,
                                   command="fit")
    several = not isinstance(states, (str, Path)) and len(list(states)) != 1
    if target_recall is not None and calibration_states is None and several:
        raise LatentSiftError("fit --target-recall with several --states stores needs --calibration-states.")
    if target_recall is not None:
        log(f"--target-recall {target_recall:g}" + ("" if confidence is None else f" --confidence {confidence:g}")
            + f" needs at least {target['needed']} calibration pools holding a resolved candidate; {calibration} "
            f"has {target['have']}.")
    if target_recall is None:
        return fit_sifter(pools, states, out, log=log, **fit_kw), None
    states_dirs = [states] if isinstance(states, (str, Path)) else list(states)
    cal_states = calibration_states or states_dirs[0]
    # one writer lock over the sifter and its operating point: no second 'fit' between the two
    with owned_output(out, [pools, states, calibration, calibration_states], kind="sifter"):
        check_calibration_inputs(calibration, cal_states, states_dirs, "fit --target-recall")  # before the fit
        sifter = fit_sifter(pools, states, out, log=log, locked=True, **fit_kw)
        return sifter, fit_operating_point_file(out, calibration, cal_states, target_recall, confidence=confidence,
                                                method=calibration_method, calibration_epochs=calibration_epochs)


@blas_fixed
def fit_operating_point_file(sifter_dir, calibration, calibration_states, target_recall: float, *,
                             confidence: float | None = None, method: str = DEFAULT_CALIBRATION,
                             calibration_epochs: int = 40) -> dict:
    """``fit --target-recall R --calibration CAL``: score the calibration pools with the saved sifter, fit
    the rule and write SIFTER_DIR/operating_point.json (``deploy.operating_file``); returns its record."""
    cal = calibration_pools_for_filter(calibration, calibration_states, sifter_dir=sifter_dir,
                                       scorer_epochs=calibration_epochs)
    rule = (RecallKeep(target_recall, calibration=method) if confidence is None else
            ConfidentRecallKeep(target_recall, confidence, calibration=method)).fit(cal)
    return save_operating_point(Path(sifter_dir) / OPERATING_POINT_JSON, rule, cal, sifter_dir=sifter_dir)


def saved_operating_point(*, operating_point=None, target_recall=None, confidence=None, calibration=None,
                          sifter_dir=None, pools=None, instances=None) -> tuple | None:
    """(rule, record) of the saved operating point ``filter`` applies, or None (fit on --calibration, or none).

    ``operating_point``: a file; else, with ``--target-recall`` and no ``--calibration``, the sifter's own
    (SIFTER_DIR/operating_point.json). Refused with one line: without ``--sifter``, for another sifter,
    another target or confidence than it was fitted for, or calibration pools among the pools to filter.
    """
    path = operating_point
    if path is None and target_recall is not None and calibration is None and sifter_dir is not None:
        path = Path(sifter_dir) / OPERATING_POINT_JSON
        if not path.is_file():
            raise LatentSiftError(f"--target-recall needs --calibration (labelled pools to fit the rule on) or a saved "
                                  f"operating point: the sifter {str(sifter_dir)!r} has none (write it with 'latentsift "
                                  "fit --target-recall R --calibration CAL.jsonl').")
    if path is None:
        return None
    if sifter_dir is None:
        raise LatentSiftError("--operating-point applies to the sifter it was fitted for: pass --sifter.")
    rule, rec = load_operating_point(path, sifter_dir=sifter_dir)
    rec["path"] = str(Path(path).resolve())
    if target_recall is not None and abs(float(target_recall) - rule.target_recall) > 1e-12:
        raise LatentSiftError(f"The saved operating point {str(path)!r} is for --target-recall {rule.target_recall:g}, "
                              f"not {target_recall:g}; refit it with 'latentsift fit --target-recall {target_recall:g}' "
                              "or pass --calibration.")
    if confidence is not None and confidence != getattr(rule, "confidence", None):
        raise LatentSiftError(f"The saved operating point {str(path)!r} has no --confidence {confidence:g} rule "
                              f"(it has {getattr(rule, 'confidence', 'none, the expected mode')}); refit it or pass "
                              "--calibration.")
    if pools is not None:
        check_calibration_disjoint_ids(rec["calibration_instances"], pools, instances)
    return rule, rec


def check_saved_rule(saved: tuple, path, *, keep_rule: str | None = None, min_keep: int | None = None,
                     max_keep: int | None = None) -> None:
    """Refuse options that contradict the saved operating point ``saved`` (rule, record) read from ``path``:
    another ``--keep-rule`` or ``--min-keep`` than it was fitted with (it is applied as fitted), or a
    ``--max-keep`` below its ``min_keep``."""
    rule = saved[0]
    if keep_rule is not None and keep_rule not in (rule.name, RecallKeep.name if rule.name == ConfidentRecallKeep.name
                                                   else rule.name):
        raise LatentSiftError(f"The saved operating point {str(path)!r} is the keep rule {rule.name}, not --keep-rule "
                              f"{keep_rule}; drop --keep-rule or pass --calibration to fit {keep_rule}.")
    if min_keep is not None and min_keep != rule.min_keep:
        raise LatentSiftError(f"The saved operating point {str(path)!r} was fitted with --min-keep {rule.min_keep}, "
                              f"not {min_keep} (its threshold holds for that one); drop --min-keep or pass "
                              "--calibration.")
    if max_keep is not None and rule.min_keep > max_keep:
        raise LatentSiftError(f"--max-keep {max_keep} is below the saved operating point's min_keep {rule.min_keep} "
                              f"({str(path)!r}): raise --max-keep.")

