"""Calibration scores for the operating points that do not depend on the held-out fold's labels (nested).

The operating points of outer fold k are chosen on the other folds' pools. Scored by their own
folds' banks and scorers, those pools would be scored by models trained on fold k (cross-fitting):
fold k's threshold would then depend on fold k's labels, and the conformal bound would not apply.
Here, for every pair of outer folds {j, k}, every Stage-1 filter fitted on labels (the paper's
method and its ablations, the variants and the inner-CV default, agent transfer) is fitted once
more on the groups of neither fold, and scores both folds' pools: fold j's pools are fold k's
calibration pools, and fold k's pools fold j's. Fold k's calibration set is thus every other
fold's pools, each scored by a model that saw neither that pool nor fold k.

Cost: one Stage-1 fit per pair of folds, K (K - 1) / 2 of them (6 for the default 4 folds; each
on a bank of K - 2 folds, scoring 2 folds' pools), cached in OUT/nested/pair-<j>-<k>/ like the
outer folds'. The rule filters and the EF verifier use no labels, so their calibration pools need
no refit. What remains approximate: the calibration scores come from banks of K - 2 folds, the
held-out fold's from a bank of K - 1 (slightly stronger), so the two are exchangeable only up to
that difference in bank size. With 2 folds a bank without both is empty: no trained filter has a
clean calibration set, and its operating points keep every candidate (said per fold).
"""
from __future__ import annotations

import copy
import time
from itertools import combinations
from typing import Sequence

from ..cascade.verifier import EF
from ..trajectories.trajectory import Trajectory, group_pools
from .stage1 import stage1_filters
from .transfer_agents import agent_transfer

LABEL_FREE = EF  # besides the registry's rule filters: the scores that no label trained


def pair_split(folds, j: int, k: int) -> tuple[list, list]:
    """(bank groups, evaluation groups) of the pair {j, k}: the groups of neither fold, and both folds'."""
    drop = set(folds[j][1]) | set(folds[k][1])
    groups = sorted({g for b, e in folds for g in (*b, *e)} - drop)
    return groups, sorted(drop)


def _pair_run(run, j: int, k: int):
    """A copy of ``run`` whose fold cache is OUT/nested/pair-<j>-<k>/ and whose log stays quiet."""
    sub = copy.copy(run)
    sub.out = run.out / "nested" / f"pair-{j}-{k}"
    sub.timings, sub.curve_scores, sub.curve_sizes = {}, {}, {}
    sub.log = lambda m: None
    sub.progress = lambda stage, done, total, info: None  # the outer stage says each pair
    return sub


def nested_calibration(run, trajs: Sequence[Trajectory], folds, states, fingerprint, tokenizer=None, *,
                       transfer: bool = True) -> dict:
    """Per outer fold k: filter -> instance -> draw scorer for the pools of the other folds, each that
    filter fitted without the pool's fold and without fold k (module docstring).

    Returns ``{"scorers": {k: {name: {instance: scorer}}}, "pairs": [...]}`` (``scorer(instance_id,
    traj_ids)`` -> traj_id -> score, as ``stage1.DrawScorer``); a pair whose bank lacks a class is
    skipped (named in ``pairs``), so fold k's calibration set lacks that fold.
    """
    t0 = time.perf_counter()
    pools = group_pools(trajs)
    eval_pools = {f.k: f.eval_pools for f in run.iter_folds(trajs, folds, pools=pools)}
    scorers: dict[int, dict[str, dict]] = {k: {} for k in eval_pools}
    pairs = []
    todo = list(combinations(sorted(eval_pools), 2))
    run.progress("operating_nested", 0, len(todo), "pairs of folds")
    for j, k in todo:
        split = pair_split(folds, j, k)
        bank = [t for t in trajs if run.group(t) in set(split[0])]
        n_pos = sum(t.label == 1 for t in bank)
        if n_pos == 0 or n_pos == len(bank):
            pairs.append({"folds": [j, k], "status": f"skipped: the bank without folds {j} and {k} holds "
                                                     f"{len(bank)} trajectories, {n_pos} resolved (needs both classes)"})
            run.progress("operating_nested", len(pairs), len(todo), "pairs of folds")
            continue
        sub = _pair_run(run, j, k)
        ds, _, _ = stage1_filters(sub, trajs, [split], states, fingerprint, tokenizer, trained_only=True)
        if transfer:
            ds |= agent_transfer(sub, trajs, [split], states, fingerprint)[0]
        for name, filt in ds.items():
            for held, cal in ((k, j), (j, k)):   # fold j's pools calibrate fold k, and the other way round
                scorers[held].setdefault(name, {}).update({p.instance_id: filt for p in eval_pools[cal]})
        pairs.append({"folds": [j, k], "status": "ok", "n_bank_trajectories": len(bank), "filters": len(ds)})
        run.progress("operating_nested", len(pairs), len(todo), "pairs of folds")  # minutes a pair on a large run
    run.timed("operating_nested", t0)
    return {"scorers": scorers, "pairs": pairs}
