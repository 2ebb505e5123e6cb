"""Agent transfer: the paper's method with banks and scorer from one agent's trajectories only.

(Not ``latentsift.protocol.transfer``, the bank-transfer matrix across pools sets.)
"""
from __future__ import annotations

import time
from typing import Any

from ..sift.sift import LatentSift
from ..trajectories.trajectory import group_pools
from .stage1 import DrawScorer


def agent_slug(agent: str) -> str:
    """The agent's name as a folder name (OUT/folds/fold-k/agent-<slug>)."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in agent)


def agent_transfer(run, trajs, folds, states, fingerprint) -> tuple[dict, dict]:
    """The paper's method with banks and scorer from one agent's trajectories only, per fold.

    Same folds as the main table; the bank side keeps only agent A's trajectories of the bank
    groups, the evaluation pools stay mixed. Named ``transfer:<agent>``; an agent whose bank has
    one class only in some fold has no row (the reason is recorded). Cost: one bank and one
    scorer per agent and fold; ablations, variants and baselines are not refitted (the
    baselines need no training, so their rows of the main table apply unchanged).
    """
    t0 = time.perf_counter()
    agents = sorted({t.agent for t in trajs})
    info: dict[str, Any] = {"agents": agents, "reference": LatentSift.name, "filters": {}, "unavailable": {},
                            "rule": "banks and scorer trained on one agent's trajectories of the bank folds; "
                                    "evaluated on the mixed pools of the held-out folds (paper's method only)"}
    if len(agents) < 2:
        info["note"] = "one agent only: the transfer table is the main table"
        return {}, info
    pools = group_pools(trajs)
    scorers: dict[str, DrawScorer] = {}
    for a in agents:
        table: dict[str, tuple] = {}
        reason = None
        for fold in run.iter_folds(trajs, folds, pools=pools, bank_filter=lambda t, a=a: t.agent == a):
            n_pos = sum(t.label == 1 for t in fold.bank_trajs)
            if n_pos == 0 or n_pos == len(fold.bank_trajs):
                reason = (f"fold {fold.k}: {a}'s bank trajectories ({len(fold.bank_trajs)}) have {n_pos} resolved; "
                          "a bank needs both classes")
                break
            bank, scorer = run.fit_fold(fold.k, fold.bank_trajs, states, fingerprint, {}, f"agent-{agent_slug(a)}")
            filt = LatentSift(bank, scorer, seed=run.settings.seed)
            table.update({i: (filt, p) for i, p in
                          filt.prepare_many(fold.eval_pools, states, fingerprint=fingerprint).items()})
        if reason is not None:
            info["unavailable"][a] = reason
            run.log(f"[agent transfer] no row for {a}: {reason}")
            continue
        info["filters"][a] = f"transfer:{a}"
        scorers[f"transfer:{a}"] = DrawScorer(table)
    run.timed("agent_transfer", t0)
    return scorers, info
