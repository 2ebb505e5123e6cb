"""Fold groups and the checks on them: which trajectories share a fold, and what a fold needs.

The fold loop itself is ``bank.iter_folds`` (one loop for Stage 1, agent transfer, pruning, the
shift guard and the inner cross-fits); this module names the groups (repository, agent or
instance), splits them into folds and refuses splits that cannot be evaluated.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .._core.validation import LatentSiftError
from ..bank.bank import split_by_repo
from ..trajectories.trajectory import Trajectory, group_pools

Split = tuple[list[str], list[str]]  # (bank groups, evaluation groups) of one fold


def group_of(traj: Trajectory, group_by: str) -> str:
    """The fold group of a trajectory: its repository, agent or instance."""
    return {"repo": traj.repo, "agent": traj.agent, "instance": traj.instance_id}[group_by]


def group_noun(group_by: str, n: int = 2) -> str:
    """'repository' / 'repositories', 'agent(s)', 'instance(s)': the fold group in messages."""
    one = {"repo": "repository", "agent": "agent", "instance": "instance"}.get(group_by, group_by)
    return one if n == 1 else ("repositories" if one == "repository" else one + "s")


def fold_splits(trajs: Sequence[Trajectory], group_by: str, n_folds: int, seed: int) -> list[Split]:
    """(bank groups, eval groups) per fold: disjoint groups, balanced by trajectory count."""
    groups = {t.traj_id: group_of(t, group_by) for t in trajs}
    n = len(set(groups.values()))
    if n < 2:
        raise LatentSiftError(f"Disjoint folds need at least 2 {group_noun(group_by, 2)}, but the selected "
                              f"trajectories come from {n} {group_noun(group_by, n)}: select more (each fold scores "
                              f"{group_noun(group_by, 2)} that its bank has not seen).")
    if not 2 <= n_folds <= n:
        raise LatentSiftError(f"{n_folds} disjoint folds need at least {max(n_folds, 2)} "
                              f"{group_noun(group_by, 2)}, but the selected trajectories come from {n} "
                              f"{group_noun(group_by, n)}: use --folds between 2 and {n} or select more instances.")
    return split_by_repo(groups, n_folds=n_folds, seed=seed)


def check_folds(trajs: Sequence[Trajectory], folds, group: Callable[[Trajectory], str], owner: str, *,
                fix: str = "Use fewer folds (--folds), another grouping (--group-by) or more labelled pools.") -> None:
    """Each fold's bank needs trajectories of both classes (a bank with one class has no margin)."""
    for k, (bank_groups, eval_groups) in enumerate(folds):
        bank = set(bank_groups)
        labels = [t.label for t in trajs if group(t) in bank]
        n_pos = sum(labels)
        if n_pos == 0 or n_pos == len(labels):
            cls = "resolved (label 1)" if n_pos == 0 else "unresolved (label 0)"
            raise LatentSiftError(f"{owner}: fold {k}'s bank (groups {list(bank_groups)[:5]}) has no {cls} "
                                  f"trajectory ({n_pos} resolved of {len(labels)}); every fold needs both classes. "
                                  + fix)


def check_group_by(trajs: Sequence[Trajectory], group_by: str, owner: str) -> None:
    """Pools must not straddle fold groups (a pool split across folds would leak its instance)."""
    for p in group_pools(trajs):
        gs = {group_of(c, group_by) for c in p.candidates}
        if len(gs) > 1:
            raise LatentSiftError(
                f"{owner}: the pool of {p.instance_id!r} holds candidates of several {group_by}s {sorted(gs)}; "
                f"folds by {group_by} must keep whole pools together (the bank refuses instances it holds). "
                "Use --group-by repo, or pools with one " + group_by + " each (the report's agent-transfer "
                "table already trains on one agent and evaluates on mixed pools).")


def leaking_pools(trajs: Sequence[Trajectory], group_by: str) -> list[dict]:
    """The pools that straddle fold groups (their instance would sit in a bank that scores them), with
    the groups they span, sorted by instance."""
    out = []
    for p in sorted(group_pools(trajs), key=lambda p: p.instance_id):
        gs = sorted({group_of(c, group_by) for c in p.candidates})
        if len(gs) > 1:
            out.append({"instance_id": p.instance_id, "groups": gs, "action": "pool skipped: not evaluated"})
    return out
