"""The recall-targeted rule's drivers for ``fit`` and ``filter``: the keep-rule options checked before any
work (``target_recall_options``, ``keep_rule_choice``), a registered keep rule applied to a run
(``keep_rule_filter``), an operating point fitted beside a sifter, and the saved one that ``filter``
applies without refitting found, checked and loaded."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from .._core.outputs import owned_output
from .._core.params import (FLAG, OUT, POSITIVE, RATE, RECALL, SEED, STATE_STORE, CommandOptions, Each, ExistingPath,
                            Named, OneOf, Registered, Rule, option)
from .._core.registry import registry_lookup
from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError
from ..deploy.operating_file import OPERATING_POINT_JSON, load_operating_point, save_operating_point
from ..sift.calibration import DEFAULT_CALIBRATION
from ..sift.keep import (CalibrationPools, FixedKeep, KeepRule, RecallKeep, apply_keep, check_calibration_size,
                         keep_rule, min_calibration_pools)
from ..sift.keep_confident import ConfidentRecallKeep, min_confident_pools
from ..sift.retain import MIN_KEEP, TARGET_MIN_KEEP
from .calibration import (calibration_pools_for_filter, check_calibration_disjoint, check_calibration_disjoint_ids,
                          check_calibration_inputs, count_positive_pools)
from ..deploy.methods import AUTO, get_method, method_names
from ..sift.rules import PAPER
from .sifter import FALSE_ALARM, _fit_sifter

__all__ = ["COSTS", "FitOptions", "GUARD_REFERENCES", "check_saved_rule", "fit_command", "fit_operating_point_file",
           "keep_rule_choice", "keep_rule_filter", "saved_operating_point",
           "target_recall_options"]


#: The values of ``fit --guard-reference``: the command line's word (as in --group-by) -> the guard's kind.
GUARD_REFERENCES = {"repo": "repository", "instance": "instance"}


@dataclass(frozen=True, kw_only=True)
class FitOptions(CommandOptions):
    """The options of ``latentsift fit``, each declared once with the values it allows (``_core.params``), and
    its cross-option rule (the calibration states of several stores); built = validated, before any file is
    read."""

    command: ClassVar[str] = "fit"
    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(lambda s: s.target_recall is not None and s.calibration_states is None and len(s.states) > 1,
             "fit --target-recall with several --states stores needs --calibration-states."),
        Rule(lambda s: not s.states and s.method != AUTO and get_method(s.method).needs_states,
             lambda s: f"fit --method {s.method} scores the candidates' states: pass --states (a store from "
                       "'latentsift extract'), or a method that needs none (a free rule, or auto)."),)

    pools: Sequence[Path] = option("POOLS", Each(ExistingPath("file")))
    states: Sequence[Path] = option("--states", Each(STATE_STORE), default=())
    out: Path = option("--out", OUT)
    method: str = option("--method", Named("a deployable method (a registered filter) or auto", method_names),
                         default=PAPER)
    scorer_epochs: int = option("--scorer-epochs", POSITIVE, default=40)
    seed: int = option("--seed", SEED, default=0)
    instances: int | None = option("--max-instances", POSITIVE, None, default=None)
    per_agent: bool = option("--per-agent", FLAG, default=False)
    guard_false_alarm: float = option("--guard-false-alarm", RATE, default=FALSE_ALARM)
    guard_reference: str = option("--guard-reference", OneOf(tuple(GUARD_REFERENCES)), default="repo")
    target_recall: float | None = option("--target-recall", RECALL, None, default=None)
    calibration: Path | None = option("--calibration", ExistingPath("file"), None, default=None)
    calibration_states: Path | None = option("--calibration-states", STATE_STORE, None, default=None)
    confidence: float | None = option("--confidence", RATE, None, default=None)
    calibration_method: str = option("--calibration-method", Registered("calibration"), default=DEFAULT_CALIBRATION)
    calibration_epochs: int = option("--calibration-epochs", POSITIVE, default=40)


def fit_command(o: FitOptions, *, log=print) -> tuple:
    """``latentsift fit`` [``--target-recall R --calibration CAL``] with the options ``o`` (checked when built,
    its paths once the output is held, before any input is read): what the bound needs checked against the
    calibration file and logged before any work, the sifter fitted and saved (``fit_sifter`` without its
    checks, which ``FitOptions`` made), then, with a target, its operating point (``fit_operating_point_file``).
    Returns (sifter, the operating point's record or None)."""
    states, out, target_recall, confidence = list(o.states), o.out, o.target_recall, o.confidence
    fit_kw = dict(method=o.method, scorer_epochs=o.scorer_epochs, seed=o.seed, instances=o.instances,
                  per_agent=o.per_agent, false_alarm=o.guard_false_alarm,
                  reference_kind=GUARD_REFERENCES[o.guard_reference], log=log, locked=True)
    # one writer lock over the sifter and its operating point: no second 'fit' between the two
    with owned_output(out, [o.pools, o.states, o.calibration, o.calibration_states], kind="sifter"):
        o.check_paths()
        target = target_recall_options(target_recall=target_recall, calibration=o.calibration, confidence=confidence,
                                       calibration_method=o.calibration_method,
                                       calibration_epochs=o.calibration_epochs, command="fit")
        if target_recall is None:
            return _fit_sifter(o.pools, o.states, out, **fit_kw), None
        log(f"--target-recall {target_recall:g}" + ("" if confidence is None else f" --confidence {confidence:g}")
            + f" needs at least {target['needed']} calibration pools holding a resolved candidate; {o.calibration} "
            f"has {target['have']}.")
        cal_states = o.calibration_states or (states[0] if states else None)  # none: a method without states
        check_calibration_inputs(o.calibration, cal_states, states, "fit --target-recall")  # before the fit
        sifter = _fit_sifter(o.pools, o.states, out, **fit_kw)
        return sifter, fit_operating_point_file(out, o.calibration, cal_states, target_recall, confidence=confidence,
                                                method=o.calibration_method, calibration_epochs=o.calibration_epochs)


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


# ---------------------------------------------------------------- the keep rule's options
#: The values of ``--cost``: what the keep rule saves.
COSTS = ("calls", "tokens")


_NEAREST = ("--bank-choice nearest with a target recall needs a threshold per sub-bank, each calibrated on pools "
            "that sub-bank scores, and the sifter holds one for its all-agent bank only: use --bank-choice all")


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
    cls = registry_lookup("keep_rule", keep_rule)  # a registered name: FilterOptions' --keep-rule
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
                          max_keep=None, keep_rule: str | None = None,
                          command: str = "filter", frac=None) -> dict:
    """Check ``filter``'s and ``fit``'s --target-recall options against each other and the calibration file
    before any work (one-line refusals; each option's own values are ``FilterOptions``' and ``FitOptions``'
    constraints); resolve the defaults.

    Returns ``{"target_recall", "on_shift", "min_keep", "confidence", "needed", "have"}``: without a
    target, "warn" and ``MIN_KEEP`` (the paper's rule); with one, "keep-all" and ``TARGET_MIN_KEEP``, and the
    calibration pools holding a resolved candidate that the bound needs (``confidence``: the high-probability mode,
    ``keep_confident``) and that the file has. The calibration file is read for its labels and
    instances only (refused when it shares a pool with ``pools``, the pools to filter). ``saved``: a
    saved operating point will be applied (``operating_file``; checked there): no ``calibration``
    needed. ``max_keep``: a cap per pool (with a target only: ``FILTER_RULES``). ``command``: the command
    whose options these are, named in the messages ("filter" or "fit"); ``frac``: the fixed rule's, refused
    with another.
    """
    rule = keep_rule_choice(keep_rule, target_recall=target_recall, confidence=confidence, calibration=calibration,
                            saved=saved, given={"min_keep": min_keep, "frac": frac})
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
    if calibration is None:
        raise LatentSiftError("--target-recall needs --calibration (labelled pools to choose the threshold on), or a "
                              "sifter with a saved operating point ('latentsift fit --target-recall R --calibration').")
    if bank_choice != "all":
        raise LatentSiftError(_NEAREST)
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
