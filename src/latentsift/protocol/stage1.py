"""Stage-1 filters of the protocol, prepared per fold and scored within each draw.

Per fold: the paper's method and its ablations on the fold's bank and scorer, the baselines, and
(``settings.variants``) the beyond-paper variants with the inner-CV default (``protocol.variants``).
"""
from __future__ import annotations

import time
from typing import Sequence

from .._core.validation import LatentSiftError
from ..sift.variants import DEFAULT, RECOMMENDED, SWEEP, sweep_name
from ..sift.rules import PAPER, filter_entry, filters, rules
from ..sift.sift import LatentSift
from ..trajectories.trajectory import group_pools
from .variants import recommended_filter, variant_filters

class DrawScorer:
    """``score_draw(instance_id, traj_ids)``: a filter's scores ranked within the draw."""

    def __init__(self, table: dict[str, tuple]):
        self.table = table

    def __call__(self, instance_id: str, traj_ids: Sequence[str]) -> dict[str, float]:
        if instance_id not in self.table:
            raise LatentSiftError(f"No Stage-1 scores were prepared for instance {instance_id!r}.")
        filt, prep = self.table[instance_id]
        return filt.rank_subset(prep, traj_ids)


def rule_scorers(pools, *, seed: int = 0, states=None, fingerprint=None, tokenizer=None) -> dict[str, DrawScorer]:
    """key -> draw scorer of every registered rule filter on ``pools`` (label-free: no bank, no scorer); a rule
    that needs a tokenizer is left out when none is given and the states are not either, and so are the premise's
    free references (built in premise runs only)."""
    out = {}
    for rule in rules():
        if rule.premise_only or (rule.tokenizer and tokenizer is None and states is None):
            continue
        filt = rule.factory(seed=seed, **({"tokenizer": tokenizer} if rule.tokenizer else {}))
        out[rule.key] = DrawScorer({i: (filt, p) for i, p in
                                    filt.prepare_many(pools, states, fingerprint=fingerprint).items()})
    return out


def latentsift_variants(ablations: bool = True) -> dict[str, dict]:
    """The paper's method and its registered ablations (``latentsift.sift.ablations``: all on the paper's banks
    and scorer), name -> the settings it changes."""
    v = {PAPER: {}}
    if ablations:
        v |= {e.key: e.params for e in filters("ablation")}
    return v


def stage1_filters(run, trajs, folds, states, fingerprint, tokenizer, *,
                   sweep: str | None = None, trained_only: bool = False) -> tuple[dict, dict, dict]:
    """name -> draw scorer for every filter; per-candidate full-pool scores; fold bookkeeping (``folds``, and
    ``missing``: filter -> why it could not be fitted in every fold; such a filter is left out, never replaced).

    ``run``: the ``protocol.Run``; ``sweep``: a representation of the sweep (states of its own): only
    the paper's method (the registered family ``SWEEP``'s factory) and the inner-CV default are built, named
    ``sweep_name(<name>, key)`` ("sweep:<name>" and "sweep:<name>:default"); ``trained_only``: only the
    filters fitted on labels (no rule filters, no training-size curves: the nested calibration of
    ``protocol.nested``).
    """
    s = run.settings
    t0 = time.perf_counter()
    stage = "stage1" if sweep is None else f"stage1:{sweep}"
    per_instance: dict[str, dict[str, tuple]] = {}   # filter -> instance -> (filter obj, prepared)
    fold_info = []
    evaluated: set[str] = set()  # the instances the folds score (all of trajs' but in a nested pair's run)

    run.progress(stage, 0, len(folds), "folds")

    def put(name, filt, prep):
        per_instance.setdefault(name, {}).update({i: (filt, p) for i, p in prep.items()})

    # the registry's rule filters (baselines); the premise's free references in premise runs only, and only
    # where their record is present (else named missing, never replaced)
    absent = {e.key: e.factory.absent(list(trajs)) for e in rules()
              if e.premise_only and getattr(s, "premise", False)}
    use_rules = [] if sweep is not None or trained_only else \
        [e for e in rules() if not e.premise_only or (e.key in absent and absent[e.key] is None)]

    for fold in run.iter_folds(trajs, folds, pools=group_pools(trajs), eval_order="group"):
        k, bank_trajs, eval_pools = fold.k, fold.bank_trajs, fold.eval_pools
        evaluated |= {p.instance_id for p in eval_pools}
        info = {"fold": k, "bank_repos": fold.bank_groups, "eval_repos": fold.eval_groups,
                "n_bank_trajectories": len(bank_trajs),
                "n_bank_positive": sum(t.label == 1 for t in bank_trajs),
                "n_eval_instances": len(eval_pools)}
        bank, scorer = run.fit_fold(k, bank_trajs, states, fingerprint, {},
                                    "paper" if sweep is None else f"sweep-{sweep}")
        make = LatentSift if sweep is None else filter_entry(SWEEP).factory
        for name, params in latentsift_variants(ablations=sweep is None).items():
            filt = make(bank, scorer, seed=s.seed, **params)
            put(name, filt, filt.prepare_many(eval_pools, states, fingerprint=fingerprint))
        for rule in use_rules:
            filt = rule.factory(seed=s.seed, **({"tokenizer": tokenizer} if rule.tokenizer else {}))
            put(rule.key, filt, filt.prepare_many(eval_pools, states, fingerprint=fingerprint))
        if s.variants or sweep is not None:
            info["variants"] = variant_filters(run, k, bank_trajs, eval_pools, states, fingerprint, scorer,
                                               per_instance, put, curves=sweep is None and not trained_only)
            if sweep is None:  # fit --method auto, chosen on this fold's bank only
                try:
                    info["recommendation"] = recommended_filter(run, k, bank_trajs, eval_pools, states,
                                                             info["variants"], per_instance, put)
                except LatentSiftError as e:
                    info["variants"].setdefault("missing", {})[RECOMMENDED] = f"fold {k}: {e}"
        fold_info.append(info)
        run.progress(stage, len(fold_info), len(folds), "folds")  # minutes a fold on a large run
    missing = _drop_incomplete(per_instance, fold_info, evaluated)
    missing |= {k: f"not run: {why}" for k, why in absent.items() if why is not None}
    if sweep is not None:
        per_instance = {sweep_name(sweep, n): per_instance[n]
                        for n in (PAPER, DEFAULT) if n in per_instance}
    draw_scorers = {name: DrawScorer(table) for name, table in per_instance.items()}
    full = {name: {t: v for i, (f, p) in table.items() for t, v in f.rank_subset(p, p.traj_ids).items()}
            for name, table in per_instance.items()}
    if sweep is not None:
        run.timed(stage, t0)
        return draw_scorers, full, {"folds": fold_info, "missing": missing}
    full |= run.curve_scores  # training-set size curves: per-candidate scores, diagnostics only
    channels = {}
    for i, (f, p) in per_instance[PAPER].items():
        for j, c in enumerate(p.channels):
            channels.setdefault(f"q_{c}", {}).update(dict(zip(p.traj_ids, p.q[:, j].tolist())))
        if p.q_lin is not None:
            channels.setdefault("q_lin", {}).update(dict(zip(p.traj_ids, p.q_lin.tolist())))
    run.timed(stage, t0)
    return draw_scorers, full | {"_components": channels}, {"folds": fold_info, "missing": missing}


def _drop_incomplete(per_instance: dict, fold_info: list[dict], instances: set[str]) -> dict[str, str]:
    """Remove (in place) every filter that some fold could not fit, so that no filter is evaluated on part of
    the evaluated ``instances`` or stands in for another; returns name -> the first fold's reason (summary.json
    names them)."""
    missing: dict[str, str] = {}
    for info in fold_info:
        for name, why in info.get("variants", {}).get("missing", {}).items():
            missing.setdefault(name, why)
    for name in list(per_instance):
        if name in missing or set(per_instance[name]) != instances:
            missing.setdefault(name, "not fitted in every fold")
            per_instance.pop(name, None)
    return missing
