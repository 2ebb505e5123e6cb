"""``latentsift fit`` and ``latentsift filter --sifter`` on files: fit a sifter from pools files and
state stores and save it; load a saved sifter and score every pool of a pools file with the shift
and leak guards (``--bank-choice nearest``: each pool with its nearest sub-bank). The estimator is
``latentsift.deploy.Sifter``; these are its file drivers."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._core.threads import blas_fixed
from .._core.outputs import owned_output
from .._core.validation import LatentSiftError, check_choice
from ..deploy.leak import ON_LEAK, apply_on_leak, shared_repos
from ..deploy.library import BANK_CHOICES, load_runs, nearest_choice, pool_distances
from ..deploy.shift import FALSE_ALARM, ON_SHIFT, REFERENCE_KINDS, check_false_alarm, guard
from ..deploy.methods import check_records, check_states_given, method_line, method_names
from ..deploy.sifter import Sifter
from ..sift.sift import FilterRun, LatentSift, load_selected_pools
from ..states.store import StateStore, check_recorded_settings

__all__ = ["FALSE_ALARM", "fit_sifter", "method_line", "method_names", "run_sifter_filter", "run_sifter_filter_chosen"]


def fit_sifter(pools_path, states_dir, out, *, method: str = LatentSift.name, scorer_epochs: int = 40, seed: int = 0,
               instances: int | None = None, per_agent: bool = False, false_alarm: float | None = None,
               reference_kind: str | None = None, log=print, locked: bool = False) -> Sifter:
    """``latentsift fit``: a sifter from every labelled candidate of one or several pools files, saved to ``out``.

    ``pools_path`` / ``states_dir``: a path or a list of paths (several runs, e.g. the Lite pools and
    the Verified pairs); the stores must share the model fingerprint and the value-changing extraction
    settings (refused before any work otherwise, ``library.open_stores``). ``instances``: only the
    first N instances by id of each pools file (the rule of ``extract --max-instances N``). ``per_agent``:
    also a sub-bank and scorer per agent (``Sifter.fit``). ``locked``: the caller already holds ``out``'s
    writer lock (``fit --target-recall`` holds it over the sifter and its operating point). The guard's
    ``reference_kind`` and ``false_alarm`` are checked here, before the output is taken (the command line's
    ``fit_command`` checks them as ``FitOptions`` and calls ``_fit_sifter``). ``method``: a deployable method
    (``deploy.methods``) or "auto" (the recommendation); ``states_dir`` may be None (or empty) for a method that
    needs no states.
    """
    check_choice(method, "method", "fit (--method)", method_names())
    if reference_kind is not None:
        check_choice(reference_kind, "reference", "fit (--guard-reference)", REFERENCE_KINDS)
    if false_alarm is not None:
        check_false_alarm(false_alarm, "--guard-false-alarm", "fit")
    return _fit_sifter(pools_path, states_dir, out, method=method, scorer_epochs=scorer_epochs, seed=seed,
                       instances=instances, per_agent=per_agent, false_alarm=false_alarm,
                       reference_kind=reference_kind, log=log, locked=locked)


@blas_fixed
def _fit_sifter(pools_path, states_dir, out, *, method: str, scorer_epochs: int, seed: int, instances: int | None,
                per_agent: bool, false_alarm: float | None, reference_kind: str | None, log, locked: bool) -> Sifter:
    """``fit_sifter`` with checked arguments."""
    with owned_output(out, [pools_path, states_dir], kind="sifter", lock=not locked):  # a second 'fit' is refused
        pools_paths = [pools_path] if isinstance(pools_path, (str, Path)) else list(pools_path)
        states_dirs = [] if states_dir is None else [states_dir] if isinstance(states_dir, (str, Path)) \
            else list(states_dir)
        trajs, store = load_runs(pools_paths, states_dirs, "fit", instances=instances)
        sifter = Sifter(method=method, scorer_epochs=scorer_epochs, seed=seed).fit(
            trajs, store, per_agent=per_agent, log=log, false_alarm=false_alarm, reference_kind=reference_kind)
        sifter.store_settings_ = None if store is None else store.settings
        sifter.save(out)
        return sifter


def _pool_states(store: StateStore, states_dir, pools) -> dict:
    """The states of every candidate of ``pools``, refused with one message when some are not stored."""
    ids = [c.traj_id for p in pools for c in p.candidates]
    missing = [t for t in ids if not store.has(t)]
    if missing:
        raise LatentSiftError(f"filter: the state store {str(states_dir)!r} has no states for {len(missing)} "
                              f"candidates, e.g. {missing[0]!r}; run 'latentsift extract' on the pools first.")
    return store.load(ids)


def _check_guards(on_shift: str, on_leak: str) -> None:
    """The sifter filter drivers' guard settings, checked for Python callers (the command line checks them as
    ``FilterOptions``)."""
    check_choice(on_shift, "on_shift", "filter", ON_SHIFT)
    check_choice(on_leak, "on_leak", "filter", ON_LEAK)


def _open_sifter(pools_path, states_dir, sifter_dir, on_leak: str, instances, settings,
                 *, needs_library: str | None = None):
    """What both sifter filter drivers start with: the selected pools, the store (None without ``states_dir``,
    for a method that needs no states), the saved sifter (refused when its bank came from other extraction
    settings, or, with ``needs_library`` (the ``--bank-choice`` asked), when it has no bank library) and the
    leak rule applied (against the bank, or without one the instances of the runs it was fitted on): (pools,
    store, sifter, leak, leak warnings)."""
    pools = load_selected_pools(pools_path, instances)
    store = None if states_dir is None else StateStore(states_dir).open()
    sifter = Sifter.load(sifter_dir, fingerprint=None if store is None else store.fingerprint, **settings)
    check_states_given(sifter.method_, store, "filter --sifter")
    check_records(sifter.method_, pools, "filter --sifter")
    if needs_library is not None and not sifter.library_:
        raise LatentSiftError(f"filter --bank-choice {needs_library}: the sifter {str(sifter_dir)!r} has no bank "
                              "library; refit it with 'latentsift fit --per-agent', or use --bank-choice all.")
    if sifter.bank is not None:
        check_recorded_settings(sifter.bank.source_.get("store_settings"), store, f"The sifter {sifter_dir}")
    pools, leak, leak_warnings = apply_on_leak(pools, sifter.seen_bank, on_leak)
    return pools, store, sifter, leak, leak_warnings


def run_sifter_filter(pools_path, states_dir, sifter_dir, *, on_shift: str = "warn", on_leak: str = "allow",
                      instances: Sequence[str] | None = None, **settings):
    """``latentsift filter --sifter``: the saved sifter on every pool, with the shift guard.

    Returns the ``FilterRun`` (the format of ``filter``) with ``configuration`` (the sifter's
    config and what it has seen), ``shift`` (per pool: the decision and its numbers) and ``leak``.
    ``on_leak`` defaults to "allow": a sifter is a deployed filter, and a bank that has seen other
    attempts at a pool's task is knowledge, not leakage (``latentsift.deploy.leak``); each such pool is
    named in the output and in the warnings.
    """
    _check_guards(on_shift, on_leak)
    return _sifter_filter(pools_path, states_dir, sifter_dir, on_shift=on_shift, on_leak=on_leak, instances=instances,
                          **settings)


@blas_fixed
def _sifter_filter(pools_path, states_dir, sifter_dir, *, on_shift: str, on_leak: str, instances, **settings):
    """``run_sifter_filter`` with checked arguments."""
    pools, store, sifter, leak, leak_warnings = _open_sifter(pools_path, states_dir, sifter_dir, on_leak, instances,
                                                            settings)
    states = None if store is None else _pool_states(store, states_dir, pools)
    fingerprint = None if store is None else store.fingerprint
    results = sifter.score_pools(pools, states, fingerprint=fingerprint)
    if sifter.bank is not None:
        shift, warnings = guard(results, pools, states, sifter.bank, sifter.reference_, on_shift)
    else:  # no bank to compare with: with a target recall, the guard compares with the calibration pools
        shift, warnings = {"on_shift": on_shift, "n_shifted": 0, "pools": [],
                           "not_run": f"the method {sifter.method_.name!r} has no bank"}, []
    inputs = {"pools": str(Path(pools_path).resolve()),
              "states_dir": None if states_dir is None else str(Path(states_dir).resolve()),
              "sifter_dir": sifter.path_}
    if sifter.bank is not None:
        inputs |= {"bank_repos": sifter.bank.repo_names_, "bank_label_counts": sifter.bank.label_counts(),
                   "repos_shared_with_bank": shared_repos(pools, sifter.bank)}
    run = FilterRun(method=sifter.name, settings=sifter.filter_params(), inputs=inputs,
                    fingerprint=None if fingerprint is None else fingerprint.to_dict(), pools=results)
    run.extra = {"configuration": {"config": sifter.config_, "seen": {k: v for k, v in sifter.seen_.items()
                                                                      if k != "instances"}},
                 "shift": shift, "leak": {**leak, "warnings": leak_warnings}}
    return run, warnings


def run_sifter_filter_chosen(pools_path, states_dir, sifter_dir, *, bank_choice: str = "nearest",
                             on_shift: str = "warn", on_leak: str = "allow", instances: Sequence[str] | None = None,
                             **settings):
    """``latentsift filter --sifter --bank-choice nearest``: each pool scored with the sub-bank nearest to it.

    The sifter must have a bank library (``fit --per-agent``). Per pool: the median nearest-bank
    distance of its candidates to every sub-bank (the shift guard's distance), the nearest one's bank
    and scorer score it, and the shift guard judges it against that sub-bank's reference. The
    ``FilterRun`` gains ``bank_choice`` (mode, sub-banks, per pool the choice and the distances).
    ``bank_choice="all"`` is ``run_sifter_filter``. ``on_leak`` as there, against the all-agent bank
    (every sub-bank's trajectories are in it). ``bank_choice``, ``on_shift`` and ``on_leak`` are checked here
    (the command line checks them as ``FilterOptions`` and calls ``_sifter_filter_chosen``).
    """
    check_choice(bank_choice, "bank_choice", "filter", BANK_CHOICES)
    _check_guards(on_shift, on_leak)
    return _sifter_filter_chosen(pools_path, states_dir, sifter_dir, bank_choice=bank_choice, on_shift=on_shift,
                                 on_leak=on_leak, instances=instances, **settings)


@blas_fixed
def _sifter_filter_chosen(pools_path, states_dir, sifter_dir, *, bank_choice: str, on_shift: str, on_leak: str,
                          instances, **settings):
    """``run_sifter_filter_chosen`` with checked arguments."""
    if bank_choice == "all":
        return _sifter_filter(pools_path, states_dir, sifter_dir, on_shift=on_shift, on_leak=on_leak,
                              instances=instances, **settings)
    pools, store, sifter, leak, leak_warnings = _open_sifter(pools_path, states_dir, sifter_dir, on_leak, instances,
                                                            settings, needs_library=bank_choice)
    for sub in sifter.library_:  # the overlap allowed on the all-agent bank holds for its parts too
        sub.bank.allowed_instances_ = set(getattr(sifter.bank, "allowed_instances_", set()))
    states = _pool_states(store, states_dir, pools)
    dist = pool_distances(pools, states, sifter.library_)
    chosen = nearest_choice(dist)
    subs = {s.name: s for s in sifter.library_}
    params = sifter.filter_params()
    results, shift_pools, warnings = [], [], []
    for name in sorted(set(chosen.values())):
        sub = subs[name]
        group = [p for p in pools if chosen[p.instance_id] == name]
        res = LatentSift(sub.bank, sub.scorer, **params).score_pools(group, states, fingerprint=store.fingerprint)
        sh, w = guard(res, group, states, sub.bank, sub.reference, on_shift)
        shift_pools += [dict(x, bank=name) for x in sh["pools"]]
        warnings += w
        results += res
    results.sort(key=lambda r: r.instance_id)
    shift_pools.sort(key=lambda x: x["instance_id"])
    inputs = {"pools": str(Path(pools_path).resolve()), "states_dir": str(Path(states_dir).resolve()),
              "sifter_dir": sifter.path_}
    run = FilterRun(method=sifter.name, settings=params, inputs=inputs, fingerprint=store.fingerprint.to_dict(),
                    pools=results)
    run.extra = {"configuration": {"config": sifter.config_, "seen": sifter.seen_},
                 "bank_choice": {"mode": bank_choice,
                                 "rule": "per pool, the sub-bank with the smallest median nearest-bank distance of "
                                         "the pool's candidates (the shift guard's distance)",
                                 "sub_banks": [{k: v for k, v in s.to_dict().items() if k != "parts"}
                                               for s in sifter.library_],
                                 "pools": [{"instance_id": i, "chosen": chosen[i], "distances": dist[i]}
                                           for i in sorted(chosen)]},
                 "shift": {"on_shift": on_shift, "reference": "the chosen sub-bank's (sub_banks[].shift_reference)",
                           "n_shifted": sum(x["shifted"] for x in shift_pools), "pools": shift_pools},
                 "leak": {**leak, "warnings": leak_warnings}}
    return run, warnings
