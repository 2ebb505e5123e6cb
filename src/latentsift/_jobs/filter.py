"""``latentsift filter`` on files, the one driver of the command: check the options, load the pools,
states, bank and scorer (or a sifter), score every pool with the chosen filter (``latentsift.sift.rules``),
apply the keep rule (the paper's, a registered one, or the recall-targeted one) and write FILTER.json
under the output guard and lock (``filter_to_file``)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

from .._core.outputs import owned_output
from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError, check_choice
from ..bank.bank import Bank
from ..deploy.leak import ON_LEAK, apply_on_leak
from ..deploy.library import BANK_CHOICES
from ..sift.rules import filter_entry, make_baseline, method_names
from ..scale.approx import approx_bank  # ray and faiss themselves load only when used
from ..scale.bank import shard_bank
from ..scale.cluster import RAY_LOCAL, require_ray
from ..sift.scorer import LinearScorer
from ..deploy.operating import target_recall_filter
from ..deploy.shift import ON_SHIFT, Reference, guard
from ..sift.calibration import DEFAULT_CALIBRATION, calibration_methods
from ..sift.keep import FixedKeep, keep_rules
from ..sift.retain import KEEP_FRAC, MIN_KEEP, TARGET_MIN_KEEP, check_retention
from ..sift.sift import FilterRun, LatentSift, Stage1Filter, check_sift_settings, load_selected_pools
from ..states.store import StateStore, check_recorded_settings
from ..deploy.operating_file import OPERATING_POINT_JSON
from .calibration import calibration_guard, calibration_pools_for_filter
from .operating import check_saved_rule, keep_rule_filter, saved_operating_point, target_recall_options
from .sifter import run_sifter_filter_chosen

#: ``filter --method`` by default: the paper's filter (a name: the registry is read, and the plugins loaded, only
#: when the command runs or its help is shown). ``--keep-rule`` by default: the paper's rule, or with
#: ``--target-recall`` the recall rule (decided when the command runs).
DEFAULT_METHOD = LatentSift.name

__all__ = ["DEFAULT_CALIBRATION", "DEFAULT_METHOD", "FilterOutcome", "KEEP_FRAC", "MIN_KEEP", "TARGET_MIN_KEEP",
           "calibration_methods", "filter_options", "filter_to_file", "keep_rules", "method_names", "run_filter"]


#: The filter's options of the LatentSift settings (named in their refusals).
SIFT_OPTIONS = {"channels": "filter (--channels)", "distance": "filter (--distance)",
                "weighting": "filter (--weighting)", "fusion_weight": "filter (--fusion-weight)",
                "n_evidence": "filter (--evidence)", "branches": "filter (--distance-only/--learned-only)"}


def filter_options(*, method: str = LatentSift.name, bank_dir=None, scorer_dir=None, sifter_dir=None,
                   bank_choice: str = "all", on_leak: str | None = None, ray_address: str | None = None,
                   bank_shards: int | None = None, approx: str | None = None, distance_only: bool = False,
                   learned_only: bool = False, channels: str | None = None, distance: str | None = None,
                   weighting: str | None = None, fusion_weight: float | None = None) -> dict:
    """Check a ``latentsift filter`` combination of options before any work; the settings they resolve to.

    A sifter (``sifter_dir``) replaces the bank, the scorer and the method, and runs in one process;
    ``bank_choice`` other than "all" needs a sifter; Ray (``ray_address`` / ``bank_shards``) and the
    approximate search (``approx``) exclude each other, and Ray must be installed. A conflict raises
    ``LatentSiftError`` naming the options. Returns ``{"branches", "on_leak"}``: the LatentSift
    branches (both, or one of ``distance_only`` / ``learned_only``) and ``on_leak``, which defaults
    to "error" with a bank (evaluation: a bank holding a pool's instance is leakage) and to "allow"
    with a sifter (deployment: a bank that has seen other attempts at the task is knowledge), and
    ``sift_settings``: the LatentSift settings given (``channels`` comma-separated, ``distance``,
    ``weighting``, ``fusion_weight``; None = the filter's default) with the branches. A sifter keeps
    its saved settings, so any of them given with ``sifter_dir`` is refused.
    """
    if distance_only and learned_only:
        raise LatentSiftError("Pass at most one of --distance-only and --learned-only.")
    if ray_address is not None or bank_shards is not None:
        require_ray()
        if approx is not None:
            raise LatentSiftError("Pass --approx or --ray/--bank-shards, not both.")
    if bank_choice != "all" and sifter_dir is None:
        raise LatentSiftError("--bank-choice needs --sifter (a sifter fitted with 'latentsift fit --per-agent').")
    if sifter_dir is not None:
        if bank_dir is not None or scorer_dir is not None or method != LatentSift.name:
            raise LatentSiftError("--sifter replaces --bank, --scorer and --method: pass only --sifter.")
        if ray_address is not None or bank_shards is not None or approx is not None:
            raise LatentSiftError("--sifter runs in one process: drop --ray, --bank-shards and --approx.")
        given = [o for o, v in (("--channels", channels), ("--distance", distance), ("--weighting", weighting),
                                ("--fusion-weight", fusion_weight), ("--distance-only", distance_only or None),
                                ("--learned-only", learned_only or None)) if v is not None]
        if given:
            raise LatentSiftError(f"--sifter scores with the settings it was fitted with: drop {', '.join(given)}.")
    branches = "distance" if distance_only else "learned" if learned_only else "both"
    chosen = {"channels": None if channels is None else tuple(c.strip() for c in channels.split(",") if c.strip()),
              "distance": distance, "weighting": weighting, "fusion_weight": fusion_weight}
    return {"branches": branches, "on_leak": on_leak or ("allow" if sifter_dir is not None else "error"),
            "sift_settings": {k: v for k, v in chosen.items() if v is not None} | {"branches": branches}}


@blas_fixed
def run_filter(pools_path, states_dir=None, *, bank_dir=None, scorer_dir=None, method: str = LatentSift.name,
               instances: Sequence[str] | None = None, ray_address: str | None = None, bank_shards: int | None = None,
               approx: str | None = None, on_shift: str | None = None, on_leak: str = "error",
               **settings) -> FilterRun:
    """``latentsift filter``: score every pool of a canonical JSONL file.

    ``method`` is a registered filter: a state filter (the paper's ``LatentSift``; built as
    ``factory(bank, scorer, **settings)``, needs ``bank_dir``, and ``scorer_dir`` unless
    ``branches="distance"``) or a rule filter (a baseline). ``settings`` go to the filter's constructor
    (``channels``, ``distance``, ``weighting``, ``branches``, ``fusion_weight``, ``min_keep``, ``frac``,
    ``seed``, ``n_evidence``). ``instances`` keeps only those pools. ``ray_address`` /
    ``bank_shards`` search the bank on Ray actors (same results, ``latentsift.scale``); ``approx``
    ("ivf" or "hnsw") searches it approximately with FAISS (off by default). ``on_shift``
    ("warn", "keep-all", "error"; None = no guard) runs the shift guard's state-space check against
    the bank (``latentsift.deploy.shift``; a bare bank records no agents, so that check is skipped).
    ``on_leak`` ("error", "skip", "allow"; ``latentsift.deploy.leak``) decides, per pool, what happens to a
    pool whose instance is in the bank; the decisions go to the output's ``leak`` section.
    """
    check_choice(method, "method", "run_filter", method_names())
    check_choice(on_leak, "on_leak", "filter", ON_LEAK)
    if on_shift is not None:
        check_choice(on_shift, "on_shift", "run_filter", ON_SHIFT)
    pools = load_selected_pools(pools_path, instances)
    store = StateStore(states_dir).open() if states_dir is not None else None
    inputs = {"pools": str(Path(pools_path).resolve()),
              "states_dir": None if states_dir is None else str(Path(states_dir).resolve())}
    entry = filter_entry(method)
    stateful = entry.kind == "state"
    if stateful:
        if bank_dir is None or store is None:
            raise LatentSiftError(f"The {entry.name} filter needs --bank and --states.")
        bank = base_bank = Bank.load(bank_dir)
        check_recorded_settings(base_bank.source_.get("store_settings"), store, f"The bank {bank_dir}")
        # scale-out: the same bank searched on Ray shards, or approximately with FAISS
        if approx is not None:
            bank = approx_bank(bank, approx)
            inputs["approx"] = approx
        elif ray_address is not None or bank_shards is not None:
            bank = shard_bank(bank, bank_shards or 2, ray_address=ray_address or RAY_LOCAL)
            inputs["bank_shards"] = bank.n_shards_
        scorer = None
        if settings.get("branches", "both") != "distance":
            if scorer_dir is None:
                raise LatentSiftError(f"The {entry.name} filter needs --scorer (or --distance-only).")
            scorer = LinearScorer.load(scorer_dir)
            check_recorded_settings(scorer.source_.get("store_settings"), store, f"The scorer {scorer_dir}")
        filt: Stage1Filter = entry.factory(bank, scorer, **settings)
        pools, leak, leak_warnings = apply_on_leak(pools, bank, on_leak)
        inputs |= {"bank_dir": str(Path(bank_dir).resolve()), "bank_repos": bank.repo_names_,
                   "bank_label_counts": bank.label_counts(),
                   "scorer_dir": None if scorer_dir is None or scorer is None else str(Path(scorer_dir).resolve())}
        eval_repos = sorted({c.repo for p in pools for c in p.candidates})
        inputs["repos_shared_with_bank"] = sorted(set(eval_repos) & set(bank.repo_names_))
    else:
        filt = make_baseline(method, **settings)
    try:
        results = filt.score_pools(pools, store, fingerprint=None)
    finally:
        if hasattr(getattr(filt, "bank", None), "close"):
            filt.bank.close()
    fp = store.fingerprint.to_dict() if store is not None else None
    run = FilterRun(method=filt.name, settings=filt.get_params(), inputs=inputs, fingerprint=fp, pools=results)
    if stateful:
        run.extra["leak"] = {**leak, "warnings": leak_warnings}
    if stateful and on_shift is not None:
        # shift guard with a bare bank: it records no agents or scaffolds, so only the
        # state-space check runs (candidates' nearest-bank distances against the bank's own
        # leave-one-instance-out distances)
        states = store.load([c.traj_id for p in pools for c in p.candidates])
        shift, warnings = guard(results, pools, states, base_bank, Reference.from_bank(base_bank), on_shift)
        run.extra["shift"] = {**shift, "warnings": warnings}
    return run


@dataclass
class FilterOutcome:
    """What ``filter_to_file`` wrote: the ``run`` (saved to ``out``), the shift ``warnings``, the ``settings``
    the filter ran with, the resolved ``on_shift`` and ``target_recall``, and the ``operating_point``
    section (with a target recall) or the ``keep_rule`` section (another registered keep rule)."""

    run: FilterRun
    out: Path
    warnings: list[str]
    settings: dict
    on_shift: str
    target_recall: float | None = None
    operating_point: dict | None = None
    keep_rule: dict | None = None


def filter_to_file(pools, out, *, states=None, bank=None, scorer=None, sifter=None, method: str = LatentSift.name,
                   bank_choice: str = "all", on_shift: str | None = None, on_leak: str | None = None,
                   ray: str | None = None, bank_shards: int | None = None, approx: str | None = None,
                   distance_only: bool = False, learned_only: bool = False, channels: str | None = None,
                   distance: str | None = None, weighting: str | None = None, fusion_weight: float | None = None,
                   min_keep: int | None = None, frac: float | None = None, seed: int = 0, evidence: int = 3,
                   instances: Sequence[str] | None = None, target_recall: float | None = None, calibration=None,
                   calibration_states=None, calibration_method: str = DEFAULT_CALIBRATION, calibration_epochs: int = 40,
                   keep_rule: str | None = None, confidence: float | None = None, operating_point=None,
                   max_keep: int | None = None, cost: str = "calls", log: Callable[[str], None] = lambda m: None,
                   status: Callable[[str], ContextManager[Any]] = lambda m: contextlib.nullcontext()) -> FilterOutcome:
    """``latentsift filter``: every option checked before any work (one-line refusals), the output guarded
    and locked, the pools scored (``run_filter``, or ``run_sifter_filter_chosen`` with a sifter), the keep
    rule applied and FILTER.json written to ``out``. ``status(message)``: a context manager around each
    long stage (the command line's spinner); ``log(line)``: what the recall-targeted rule needs, before
    any work. With a target recall: ``confidence`` (the high-probability mode), a saved operating point
    (``operating_point``, or the sifter's own without ``calibration``: ``_jobs.operating``), ``max_keep``
    and ``cost`` (``_jobs.operating.target_recall_options``); the calibration pools are scored before the
    pools to filter, so that their states are refused first; a rule filter's pools are checked against
    the calibration pools (``calibration_guard``)."""
    resolved = filter_options(method=method, bank_dir=bank, scorer_dir=scorer, sifter_dir=sifter,
                              bank_choice=bank_choice, on_leak=on_leak, ray_address=ray, bank_shards=bank_shards,
                              approx=approx, distance_only=distance_only, learned_only=learned_only,
                              channels=channels, distance=distance, weighting=weighting, fusion_weight=fusion_weight)
    check_sift_settings(resolved["sift_settings"] | {"n_evidence": evidence}, SIFT_OPTIONS)
    for name, value, allowed in (("on_shift", on_shift, ON_SHIFT), ("on_leak", on_leak, ON_LEAK),
                                 ("bank_choice", bank_choice, BANK_CHOICES)):
        if value is not None:
            check_choice(value, name, f"filter (--{name.replace('_', '-')})", allowed)
    saved = saved_operating_point(operating_point=operating_point, target_recall=target_recall, confidence=confidence,
                                  calibration=calibration, sifter_dir=sifter, pools=pools, instances=instances)
    target = target_recall_options(target_recall=target_recall, calibration=calibration, bank_choice=bank_choice,
                                   calibration_method=calibration_method, calibration_epochs=calibration_epochs,
                                   on_shift=on_shift, min_keep=min_keep, keep_rule=keep_rule, pools=pools,
                                   instances=instances, confidence=confidence, saved=saved is not None,
                                   max_keep=max_keep, cost=cost, frac=frac)
    target_recall, on_shift, min_keep = target["target_recall"], target["on_shift"], target["min_keep"]
    rule = target["rule"]
    if saved is not None:
        check_saved_rule(saved, operating_point or Path(sifter, OPERATING_POINT_JSON), keep_rule=keep_rule,
                         min_keep=min_keep, max_keep=max_keep)
        target_recall, min_keep, rule = saved[0].target_recall, saved[0].min_keep, saved[0].name
    frac = KEEP_FRAC if frac is None else frac
    check_retention(min_keep, frac, "filter (--min-keep/--frac)")  # the options', never blamed on a saved file
    with owned_output(out, [pools, states, bank, scorer, sifter, calibration, calibration_states, operating_point],
                      file="filter") as owned:  # a second filter to this --out is refused while this one runs
        out = owned.path
        if saved is not None:
            log(f"operating point {saved[1]['path']} (fitted on {saved[0].n_calibration_pools_} calibration pools "
                "with a resolved candidate): applied without refitting.")
        elif target_recall is not None:  # before any work: what the bound needs and what the calibration file has
            log(f"--target-recall {target_recall:g}" + ("" if confidence is None else f" --confidence {confidence:g}")
                + f" needs at least {target['needed']} calibration pools holding a resolved candidate; {calibration} "
                f"has {target['have']}.")
        settings: dict = {"min_keep": min_keep, "frac": frac, "seed": seed}
        stateful = sifter is not None or filter_entry(method).kind == "state"
        if sifter is None and stateful:
            settings |= resolved["sift_settings"]
        cal = None
        if (target_recall is not None and saved is None) or (rule != FixedKeep.name and calibration is not None):
            with status("calibrating ..."):  # first: its states are checked (and refused) before the pools are scored
                cal = calibration_pools_for_filter(calibration, calibration_states or states, method=method,
                                                   bank_dir=bank, scorer_dir=scorer, sifter_dir=sifter,
                                                   settings=dict(settings), scorer_epochs=calibration_epochs,
                                                   states_dir=states)
        if sifter is not None:
            settings["n_evidence"] = evidence
            with status("scoring ..."):
                run, warnings = run_sifter_filter_chosen(pools, states, sifter, bank_choice=bank_choice,
                                                         on_shift=on_shift, on_leak=resolved["on_leak"],
                                                         instances=instances, **settings)
            settings["channels"] = tuple(run.settings["channels"])
        else:
            if stateful:
                settings["n_evidence"] = evidence
            with status("scoring ..."):
                run = run_filter(pools, states, bank_dir=bank, scorer_dir=scorer, method=method, instances=instances,
                                 ray_address=ray, bank_shards=bank_shards, approx=approx,
                                 on_shift=on_shift if stateful else None, on_leak=resolved["on_leak"], **settings)
            warnings = list(run.extra.get("shift", {}).get("warnings", []))
        if cal is not None and target_recall is not None and not stateful:  # a rule has no bank: the guard
            calibration_guard(run, pools, states, cal, on_shift, instances)     # compares with the calibration pools
            warnings = list(run.extra.get("shift", {}).get("warnings", []))
        outcome = FilterOutcome(run, out, warnings, settings, on_shift, target_recall)
        if target_recall is not None:
            outcome.operating_point = target_recall_filter(run, target_recall, cal, method=calibration_method,
                                                           min_keep=min_keep, on_shift=on_shift,
                                                           confidence=target["confidence"], saved=saved,
                                                           max_keep=target["max_keep"], rule=rule)
        elif rule != FixedKeep.name:
            outcome.keep_rule = keep_rule_filter(run, rule, cal if calibration is not None else None)
        run.save(out)
    return outcome
