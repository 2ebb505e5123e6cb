"""Beyond-paper variants of one outer fold, and the inner-CV default chosen on the bank alone.

Representation variants of the distance branch (middle layer, l2, whitening, scaffold centering),
scaffold-conditioned banks, the logistic probe, and stacked fusions whose weights are fitted on
cross-fitted bank signals; the default is the stack with the best cross-fitted within-pool AUC on
the bank (``STACK_CONFIGS``). The estimators themselves live in ``latentsift.sift.variants``.
"""
from __future__ import annotations

import numpy as np

from .._core.validation import LatentSiftError
from ..bank.bank import Bank, inner_folds
from ..metrics.diagnostics import within_pool_auc
from ..sift.sift import LatentSift, Prepared
from ..deploy.sifter import distance_auc, fold_distance
from ..sift.variants import (LogisticProbe, StackedFilter, center_by_group, fit_stack, merge_prepared,
                             pool_rank_features, split_pools_by_group, trajectory_signals)
from .curves import learning_curves

_STATES = ["q_cot", "q_obs", "q_fn", "probe"]
# Candidates of the inner-CV default choice: signals of a stacked fusion (weights learned on the bank).
# 'stack:length' uses no state: it is there so that the choice can say when states add nothing.
STACK_CONFIGS: dict[str, list[str]] = {
    "probe": ["probe"],
    "stack:states": _STATES,
    "stack:length": ["neg_chars", "neg_steps"],
    "stack:states+length": _STATES + ["neg_chars", "neg_steps"],
    "stack:states+length+patch": _STATES + ["neg_chars", "neg_steps", "patch_lines", "no_patch"],
}


def trajs_of(bank_trajs, eval_pools):
    return list(bank_trajs) + [c for p in eval_pools for c in p.candidates]


def variant_filters(run, k, bank_trajs, eval_pools, states, fingerprint, scorer, per_instance, put, *,
                    curves: bool = True) -> dict:
    """Beyond-paper variants of one outer fold (``latentsift.sift.variants``); returns what was chosen (and,
    when the inner cross-validation is impossible in this fold, ``missing``: variant name -> reason)."""
    seed = run.settings.seed
    bank_ids = sorted(t.traj_id for t in bank_trajs)
    labels = {t.traj_id: int(t.label) for t in bank_trajs}
    agent = {t.traj_id: t.agent for t in trajs_of(bank_trajs, eval_pools)}
    eval_ids = sorted(c.traj_id for p in eval_pools for c in p.candidates)
    # representation variants of the distance branch, fused with the paper's learned branch
    reps = {"layer:middle": ({"layer": (states[bank_ids[0]].n_layers // 2) - 1}, states),
            "norm:l2": ({"normalize": "l2"}, states), "norm:whiten": ({"normalize": "whiten"}, states)}
    centered = center_by_group(states, agent, bank_ids, layers=[-1])
    reps["center:scaffold"] = ({}, centered)
    for name, (params, sts) in reps.items():
        bank_v = Bank.from_trajectories(bank_trajs, sts, fingerprint, **params)
        # the distance branch on this representation; the learned branch keeps the paper's q_lin
        dist = LatentSift(bank_v, None, branches="distance", seed=seed)
        raw = per_instance[LatentSift.name]
        prep = {i: Prepared(i, p.traj_ids, p.channels, p.q, raw[i][1].q_lin, None, p.evidence)
                for i, p in dist.prepare_many(eval_pools, sts, fingerprint=fingerprint).items()}
        put(f"variant:{name}", LatentSift(bank_v, scorer, seed=seed), prep)
    # scaffold-conditioned banks: retrieve only among bank trajectories of the candidate's scaffold
    base = LatentSift(Bank.from_trajectories(bank_trajs, states, fingerprint), scorer, seed=seed)
    parts: dict[str, list] = {}
    for g, sub in split_pools_by_group(eval_pools, lambda c: c.agent).items():
        g_trajs = [t for t in bank_trajs if agent[t.traj_id] == g]
        if len({labels[t.traj_id] for t in g_trajs}) < 2:  # no bank of both classes for this scaffold: shared bank
            filt_g = base
        else:
            filt_g = LatentSift(Bank.from_trajectories(g_trajs, states, fingerprint), scorer, seed=seed)
        for i, p in filt_g.prepare_many(sub, states, fingerprint=fingerprint).items():
            parts.setdefault(i, []).append(p)
    put("variant:scaffold-bank", base, {i: merge_prepared(ps) for i, ps in parts.items()})
    try:
        # the learned branch: regularised logistic probe vs the paper's gated head
        probe = LogisticProbe(seed=seed).fit([states[i] for i in bank_ids], [labels[i] for i in bank_ids])
        probe_eval = dict(zip(eval_ids, probe.decision_function([states[i] for i in eval_ids])))
        if curves:
            learning_curves(run, k, bank_trajs, eval_ids, states, fingerprint, probe_eval, per_instance)
        return stacked_variants(run, bank_trajs, eval_pools, states, fingerprint, labels, probe_eval,
                                per_instance, put)
    except LatentSiftError as e:  # e.g. a bank with too few resolved trajectories (tiny runs)
        # the stacked variants (stack:length, a reference, among them) cannot be fitted in this fold: they are
        # missing from the run (``stage1_filters`` drops them, with this reason), never replaced by another
        # filter; the default (a choice, not a reference) keeps the paper's method, named as a fallback
        tbl = per_instance[LatentSift.name]
        put("default", tbl[eval_pools[0].instance_id][0], {p.instance_id: tbl[p.instance_id][1] for p in eval_pools})
        run.log(f"[variants] fold {k}: inner cross-validation impossible ({e}); the stacked variants are missing "
                "from this run and the default falls back to the paper's method in this fold")
        why = f"fold {k}: inner cross-validation impossible ({e})"
        return {"chosen_default": "latentsift (fallback)", "reason": str(e),
                "missing": {f"variant:{n}": why for n in STACK_CONFIGS}}


def stacked_variants(run, bank_trajs, eval_pools, states, fingerprint, labels, probe_eval, per_instance,
                     put) -> dict:
    """Stacked fusions with weights fitted on cross-fitted bank signals, and the inner-CV choice."""
    seed = run.settings.seed
    # cross-fitted bank signals for the stacked fusion and the choice: inner folds of the bank split by the
    # run's own fold groups (repository, agent or instance: ``run.group``), as the outer folds are
    inner = list(inner_folds(bank_trajs, run.group, seed=seed))
    bank_raw: dict[str, dict[str, float]] = {}
    inner_fold_of: dict[str, int] = {}
    for f in inner:
        bank_raw |= {t: {f"q_{c}": v for c, v in q.items()}
                     for t, q in fold_distance(f, states, fingerprint, seed=seed).items()}
        ib_ids = sorted(t.traj_id for t in f.bank_trajs)
        ie_ids = sorted(c.traj_id for p in f.eval_pools for c in p.candidates)
        ip = LogisticProbe(seed=seed).fit([states[i] for i in ib_ids], [labels[i] for i in ib_ids])
        for t, v in zip(ie_ids, ip.decision_function([states[i] for i in ie_ids])):
            bank_raw[t]["probe"] = float(v)
            inner_fold_of[t] = f.k
    traj_by_id = {t.traj_id: t for t in bank_trajs}
    for t, d in bank_raw.items():
        d |= trajectory_signals(traj_by_id[t])
    eval_raw: dict[str, dict[str, float]] = {}
    lat = per_instance[LatentSift.name]
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
    for name, sig in STACK_CONFIGS.items():
        raw_b = {s_: np.array([bank_raw[t][s_] for t in ids_b]) for s_ in sig}
        # cross-fitted within-pool AUC on the bank: weights from one inner fold, scored on the other
        pred = np.full(len(ids_b), np.nan)
        for j in range(len(inner)):
            tr, te = fold_b != j, fold_b == j
            try:
                w = fit_stack({s_: v[tr] for s_, v in raw_b.items()}, inst_b[tr], y_b[tr])
            except LatentSiftError:
                w = {s_: 1.0 for s_ in sig}
            pred[te] = pool_rank_features({s_: v[te] for s_, v in raw_b.items()}, inst_b[te]) @ \
                np.array([w[s_] for s_ in sorted(raw_b)])
        choice_evidence[name] = within_pool_auc(inst_b, y_b, pred).auc
        chosen_weights[name] = fit_stack(raw_b, inst_b, y_b)
        flat = {s_: {t: eval_raw[t][s_] for t in eval_raw} for s_ in sig}
        filt = StackedFilter(flat, chosen_weights[name], seed=seed)
        put(f"variant:{name}", filt, filt.prepare_many(eval_pools))
    # the paper's distance branch, judged the same way on the bank (cross-fitted)
    choice_evidence["paper-distance"] = distance_auc({t: {c: bank_raw[t][f"q_{c}"] for c in ("cot", "obs", "fn")}
                                                      for t in ids_b}, bank_trajs)
    best = max(STACK_CONFIGS, key=lambda n: (np.nan_to_num(choice_evidence[n], nan=-1.0), n))
    for i, (f, p) in per_instance[f"variant:{best}"].items():
        if i in {pp.instance_id for pp in eval_pools}:
            per_instance.setdefault("default", {})[i] = (f, p)
    return {"chosen_default": best, "inner_cv_within_pool_auc": choice_evidence,
            "stack_weights": chosen_weights}
