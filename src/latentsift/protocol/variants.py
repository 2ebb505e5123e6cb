"""Beyond-paper variants of one outer fold, and the inner-CV default chosen on the bank alone.

Representation variants of the distance branch (middle layer, l2, whitening, scaffold centering),
scaffold-conditioned banks, the logistic probe, and stacked fusions whose weights are fitted on
cross-fitted bank signals; the default is the stack with the best cross-fitted within-pool AUC on
the bank. Every variant is a filter registered (kind "variant") in ``latentsift.sift.variants``, with the
estimators; this module builds them per fold, in registration order.
"""
from __future__ import annotations

import time

import numpy as np

from .._core.validation import LatentSiftError
from ..metrics.diagnostics import within_pool_auc
from ..sift.rules import PAPER, filters
from ..sift.scorer import early_stopping_groups
from ..deploy.methods import (auto_candidates, cross_fitted_signals, get_method, latentsift_evidence, recommend,
                              rule_auc, stack_inner_auc)
from ..deploy.sifter import distance_auc
from ..sift.variants import (DEFAULT, FITTED_FUSION, RECOMMENDED, fit_stack, probe_once, trajectory_signals,
                             variant_setting)
from .curves import learning_curves

def variant_filters(run, k, bank_trajs, eval_pools, states, fingerprint, scorer, per_instance, put, *,
                    curves: bool = True) -> dict:
    """Beyond-paper variants of one outer fold, the registered filters of kind "variant"
    (``latentsift.sift.variants``) in registration order; returns what was chosen (and, when the inner
    cross-validation is impossible in this fold, ``missing``: variant name -> reason; ``fitted``: what a variant
    fitted on the bank, e.g. the fitted fusion's weight)."""
    seed = run.settings.seed
    labels = {t.traj_id: int(t.label) for t in bank_trajs}
    eval_ids = sorted(c.traj_id for p in eval_pools for c in p.candidates)
    variants = filters("variant")
    paper = {i: prep for i, (_, prep) in per_instance[PAPER].items()}
    context = {"paper_filter": per_instance[PAPER][eval_pools[0].instance_id][0], "group": run.group,
               "criterion": lambda inst, y, s: within_pool_auc(inst, y, s).auc, "fits": run.fits}
    missing: dict[str, str] = {}
    fitted: dict[str, dict] = {}
    for e in variants:  # representation variants, scaffold-conditioned banks, the fitted fusion: on the fold's bank
        if e.signals is None:
            try:
                filt, prep = e.factory(bank_trajs, eval_pools, states, fingerprint, scorer, seed=seed, paper=paper,
                                       **context)
            except LatentSiftError as err:  # e.g. an inner fold whose bank lacks a class: missing, never replaced
                run.log(f"[variants] fold {k}: {e.key} not fitted ({err})")
                missing[e.key] = f"fold {k}: {err}"
                continue
            put(e.key, filt, prep)
            if getattr(filt, "fitted_", None):
                fitted[e.key] = filt.fitted_
    out = _stacks(run, k, bank_trajs, eval_pools, states, fingerprint, labels, eval_ids, per_instance, put,
                  variants, curves)
    if fitted:
        out["fitted"] = fitted
    if missing:
        out["missing"] = {**out.get("missing", {}), **missing}
    return out


def _stacks(run, k, bank_trajs, eval_pools, states, fingerprint, labels, eval_ids, per_instance, put, variants,
            curves) -> dict:
    """The probe, the training-size curves and the stacked variants of one fold, with the inner-CV default."""
    seed = run.settings.seed
    stacks = [e for e in variants if e.signals is not None]
    try:
        # the learned branch: regularised logistic probe vs the paper's gated head
        probe = probe_once(run.fits, states, labels, early_stopping_groups(bank_trajs, run.group), seed=seed)
        probe_eval = dict(zip(eval_ids, probe.decision_function([states[i] for i in eval_ids])))
        if curves:
            learning_curves(run, k, bank_trajs, eval_ids, states, fingerprint, probe_eval, per_instance)
        return stacked_variants(run, bank_trajs, eval_pools, states, fingerprint, labels, probe_eval,
                                per_instance, put, stacks)
    except LatentSiftError as e:  # e.g. a bank with too few resolved trajectories (tiny runs)
        # the stacked variants (stack:length, a reference, among them) cannot be fitted in this fold: they are
        # missing from the run (``stage1_filters`` drops them, with this reason), never replaced by another
        # filter; the default (a choice, not a reference) keeps the paper's method, named as a fallback
        tbl = per_instance[PAPER]
        put(DEFAULT, tbl[eval_pools[0].instance_id][0], {p.instance_id: tbl[p.instance_id][1] for p in eval_pools})
        run.log(f"[variants] fold {k}: inner cross-validation impossible ({e}); the stacked variants are missing "
                "from this run and the default falls back to the paper's method in this fold")
        why = f"fold {k}: inner cross-validation impossible ({e})"
        return {"chosen_default": "latentsift (fallback)", "reason": str(e),
                "missing": {s.key: why for s in stacks}}


def stacked_variants(run, bank_trajs, eval_pools, states, fingerprint, labels, probe_eval, per_instance,
                     put, stacks) -> dict:
    """Stacked fusions (``stacks``: the registered variants with ``signals``) with weights fitted on
    cross-fitted bank signals, and the inner-CV choice among them."""
    names = {variant_setting(e.key): e for e in stacks}
    seed = run.settings.seed
    # cross-fitted bank signals for the stacked fusion and the choice: inner folds of the bank split by the
    # run's own fold groups (repository, agent or instance: ``run.group``), as the outer folds are
    signals = sorted({s_ for e in stacks for s_ in e.signals} | {"q_cot", "q_obs", "q_fn"})
    bank_raw, inner_fold_of, n_inner = cross_fitted_signals(bank_trajs, states, fingerprint, run.group,
                                                            signals=signals, seed=seed, fits=run.fits)
    traj_by_id = {t.traj_id: t for t in bank_trajs}
    eval_raw: dict[str, dict[str, float]] = {}
    lat = per_instance[PAPER]
    eval_traj = {c.traj_id: c for p in eval_pools for c in p.candidates}
    for p in eval_pools:
        prep = lat[p.instance_id][1]
        for r, t in enumerate(prep.traj_ids):
            eval_raw[t] = {f"q_{c}": float(prep.q[r, jj]) for jj, c in enumerate(prep.channels)}
            eval_raw[t] |= {"probe": float(probe_eval[t])} | trajectory_signals(eval_traj[t])
    ids_b = sorted(bank_raw)
    inst_b = np.array([traj_by_id[t].instance_id for t in ids_b])
    y_b = np.array([labels[t] for t in ids_b])
    fold_b = np.array([inner_fold_of[t] for t in ids_b])
    choice_evidence = {}
    chosen_weights = {}
    for name, entry in names.items():
        sig = list(entry.signals)
        raw_b = {s_: np.array([bank_raw[t][s_] for t in ids_b]) for s_ in sig}
        # cross-fitted within-pool AUC on the bank: weights from one inner fold, scored on the other
        choice_evidence[name] = stack_inner_auc(raw_b, inst_b, y_b, fold_b, n_inner)
        chosen_weights[name] = fit_stack(raw_b, inst_b, y_b)
        flat = {s_: {t: eval_raw[t][s_] for t in eval_raw} for s_ in sig}
        filt = entry.factory(flat, chosen_weights[name], seed=seed)
        put(entry.key, filt, filt.prepare_many(eval_pools))
    # the paper's distance branch, judged the same way on the bank (cross-fitted)
    choice_evidence["paper-distance"] = distance_auc({t: {c: bank_raw[t][f"q_{c}"] for c in ("cot", "obs", "fn")}
                                                      for t in ids_b}, bank_trajs)
    best = max(names, key=lambda n: (np.nan_to_num(choice_evidence[n], nan=-1.0), n))
    for i, (f, p) in per_instance[names[best].key].items():
        if i in {pp.instance_id for pp in eval_pools}:
            per_instance.setdefault(DEFAULT, {})[i] = (f, p)
    return {"chosen_default": best, "inner_cv_within_pool_auc": choice_evidence,
            "stack_weights": chosen_weights}


def recommended_filter(run, k, bank_trajs, eval_pools, states, info: dict, per_instance, put) -> dict:
    """The recommendation of ``fit --method auto`` nested in outer fold ``k``: chosen among
    ``deploy.methods.auto_candidates`` on the fold's bank alone (``recommend``), from the inner-CV numbers this
    fold already computed on the bank (``info``: the fitted fusion's criterion per weight gives the paper's method
    at w = 0.5 and its branches at w = 1 and 0; the stacks' cross-fitted AUCs) and the free rules' AUC on the bank's
    pools; the chosen method's scores of the fold's pools become the filter ``RECOMMENDED``. The scored fold's labels
    and states are never read here. Returns the choice (``chosen``, ``reason``, ``inner_cv_within_pool_auc``, and
    ``seconds``: what the choice added to the fold)."""
    t0 = time.perf_counter()
    cands = auto_candidates(bank_trajs, states=True)
    ev: dict = {m.name: rule_auc(m, bank_trajs, states if m.needs_states else None) for m in cands
                if m.family == "rule"}
    fused = (info.get("fitted") or {}).get(FITTED_FUSION)
    if fused:
        ev |= latentsift_evidence(fused["inner_cv_criterion"], fused["fusion_weight"], cands)
    ev |= {f"variant:{n}": v for n, v in (info.get("inner_cv_within_pool_auc") or {}).items()}
    insts = [p.instance_id for p in eval_pools]
    ev = {m.name: (ev.get(m.name) if m.family == "rule" or all(i in per_instance.get(m.key, {}) for i in insts)
                   else None) for m in cands}
    chosen, why = recommend(ev, cands)
    m = get_method(chosen)
    table = per_instance.get(m.key, {})
    if m.family == "rule" and not all(i in table for i in insts):  # a run without the rules (nested calibration)
        filt = m.entry.factory(seed=run.settings.seed)
        table = {i: (filt, p) for i, p in filt.prepare_many(eval_pools, states).items()}
    for i in insts:
        per_instance.setdefault(RECOMMENDED, {})[i] = table[i]
    run.log(f"[recommended] fold {k}: {chosen} ({why})")
    return {"chosen": chosen, "reason": why, "inner_cv_within_pool_auc": ev,
            "seconds": round(time.perf_counter() - t0, 3)}
