"""A saved operating point: the recall-targeted keep rule fitted once, applied by ``filter`` without refitting.

``latentsift fit --target-recall R --calibration CAL.jsonl`` scores the calibration pools with the
new sifter, fits the rule (``RecallKeep``, or ``ConfidentRecallKeep`` with ``--confidence``) and
writes SIFTER_DIR/operating_point.json beside the sifter:

    rule                     the rule's settings and what was fitted (threshold, calibration map, n, bound)
    calibration_pools        how the pools were scored, their file and states, overlaps with the bank, and
                             their sizes (pool_sizes: [smallest K, largest K]; a pool outside is not guaranteed)
    calibration_fingerprint  sha256 of the calibration file's bytes, its states' model and settings
    calibration_instances    the calibration pools' instance ids (``filter`` refuses pools among them)
    not_guaranteed           the guarantee's calibration conditions that failed ([] when none)
    sifter                   the sha256 of the sifter's sifter.json it was fitted for

``filter --sifter S --target-recall R`` (no ``--calibration``) or ``filter --operating-point FILE``
applies it: nothing is scored but the pools to filter. In Python::

    rule, record = load_operating_point("SIFTER/operating_point.json")
    mask = rule.keep(scores, traj_ids)          # per pool, the candidates kept
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from .._core.io import atomic_write_json, read_json, sha256_hex
from .._core.manifests import OperatingPointManifest, check_manifest, manifest_error, manifest_values
from .._core.validation import LatentSiftError
from ..sift.calibration import CalibrationMap
from ..sift.keep import CalibrationPools, RecallKeep
from ..sift.keep_confident import ConfidentRecallKeep
from .operating import calibration_failures

OPERATING_POINT_JSON = "operating_point.json"
FORMAT, VERSION = "latentsift-operating-point", 1


def sifter_digest(sifter_dir) -> str:
    """The sha256 of a sifter's sifter.json (what an operating point is tied to)."""
    return sha256_hex(Path(sifter_dir, "sifter.json").read_bytes())


def calibration_fingerprint(cal: CalibrationPools) -> str:
    """sha256 of the calibration file's bytes and its states' model fingerprint and settings."""
    h = hashlib.sha256(Path(cal.extra["file"]).read_bytes())
    h.update(json.dumps({"fp": cal.extra.get("states_fingerprint"), "settings": cal.extra.get("states_settings")},
                        sort_keys=True, default=str).encode())
    return h.hexdigest()


def save_operating_point(path, rule: RecallKeep, cal: CalibrationPools, *, sifter_dir) -> dict:
    """Write the fitted ``rule`` and its calibration record to ``path`` (module docstring); returns the record."""
    rec = {"format": FORMAT, "version": VERSION, "rule": rule.to_dict(), "params": rule.get_params(),
           "calibration_pools": {"how": cal.how, "n_pools": len(cal.scores), "n_with_resolved": cal.n_positive(),
                                 "pool_sizes": cal.pool_sizes(), **cal.extra},
           "calibration_fingerprint": calibration_fingerprint(cal),
           "calibration_instances": sorted(cal.instance_ids), "not_guaranteed": calibration_failures(cal),
           "sifter": {"path": str(Path(sifter_dir).resolve()), "sifter_json_sha256": sifter_digest(sifter_dir)}}
    atomic_write_json(path, rec)
    return rec


def load_operating_point(path, *, sifter_dir=None) -> tuple[RecallKeep, dict]:
    """(the fitted rule, the record) of a saved operating point; with ``sifter_dir``, refused when it was
    fitted for another sifter (its sifter.json differs)."""
    path = Path(path)
    if not path.is_file():
        raise LatentSiftError(f"No operating point at {str(path)!r}; write one with 'latentsift fit --target-recall R "
                              "--calibration CAL.jsonl'.")
    rec = read_json(path)
    if not isinstance(rec, dict) or rec.get("format") != FORMAT or rec.get("version") != VERSION:
        raise LatentSiftError(f"{path}: not a {FORMAT} v{VERSION} file.")
    redo = "fit it again with 'latentsift fit --target-recall R --calibration CAL.jsonl'"
    check_manifest(rec, OperatingPointManifest, path, redo)
    if sifter_dir is not None and rec["sifter"]["sifter_json_sha256"] != sifter_digest(sifter_dir):
        raise LatentSiftError(f"The operating point {str(path)!r} was fitted for another sifter "
                              f"({rec['sifter']['path']}) than {str(sifter_dir)!r}; refit it with 'latentsift fit "
                              "--target-recall R --calibration CAL.jsonl'.")
    params, fitted = {k: v for k, v in rec["params"].items() if v is not None}, rec["rule"]
    with manifest_values(path, "params", redo):  # a value the schema lets through but the rule refuses
        rule = (ConfidentRecallKeep if "confidence" in params else RecallKeep)(**params)
    meaning = fitted["threshold_meaning"]
    rule.threshold_ = (fitted["threshold"] if fitted["threshold"] is not None else
                       -math.inf if meaning == "keep all" else math.inf)
    rule.p_threshold_ = math.nan if fitted["p_threshold"] is None else fitted["p_threshold"]
    rule.n_calibration_pools_, rule.n_lost_allowed_ = fitted["n_calibration_pools"], fitted["n_lost_allowed"]
    with manifest_values(path, "rule.calibration", redo):
        rule.calibration_ = CalibrationMap.from_dict(fitted["calibration"])
        rule.calibration_.domain()  # a registered method
    problem = fitted_problem(rule, fitted)
    if problem:
        raise manifest_error(path, problem, redo)
    return rule, rec


def fitted_problem(rule: RecallKeep, fitted: dict) -> str | None:
    """What in a saved rule's fitted values (``rule``, rebuilt from them) no fit could have produced, in words;
    None when they agree: enough calibration pools for the bound, the losses it allows for that many, a
    threshold among the calibration scores and its probability on the calibration map."""
    n, need = rule.n_calibration_pools_, rule.min_pools()
    if rule.target_recall < 1 and n < need:
        return (f"field 'rule.n_calibration_pools': {n} is fewer than the {need} the target recall "
                f"{rule.target_recall:g} needs")
    allowed = max(rule.allowed_losses(n), 0)
    if rule.n_lost_allowed_ != allowed:
        return (f"field 'rule.n_lost_allowed': {rule.n_lost_allowed_} is not what {n} calibration pools allow at "
                f"the target recall {rule.target_recall:g} ({allowed})")
    t = fitted["threshold"]
    if t is None:
        return None
    lo, hi = rule.calibration_.domain()
    if not lo <= t <= hi:
        return f"field 'rule.threshold': {t!r} lies outside the calibration scores ({lo:g} to {hi:g})"
    p = float(rule.calibration_.predict([t])[0])
    if not math.isclose(p, fitted["p_threshold"], rel_tol=1e-6, abs_tol=1e-9):
        return (f"field 'rule.p_threshold': {fitted['p_threshold']!r} is not the calibration map's probability at "
                f"the threshold ({p:g})")
    return None
