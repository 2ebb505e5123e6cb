"""Leak guard per pool: a candidate pool whose instance the bank (or a saved sifter's bank) holds.

In evaluation that overlap is leakage (the bank has seen the hidden tests' outcome of other attempts
at the same task), and the paper's protocol forbids it. In deployment, a bank that has seen other
attempts at the same task is knowledge a team may want to use. ``on_leak`` decides per pool:

- "error": refuse the run, naming the overlapping instances (nothing is written);
- "skip": leave those pools out (named in the output); the other pools are scored and written;
- "allow": score them against the bank as it is (named in the output). A candidate that is itself a
  bank entry is refused under every mode (its nearest bank trajectory would be itself).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .._core.validation import LatentSiftError, check_choice

ON_LEAK = ("error", "skip", "allow")
ACTIONS = {"skip": "pool skipped: not scored", "allow": "scored with its instance in the bank"}


@dataclass
class PoolLeak:
    """One pool whose instance the bank holds, and what was done with it."""

    instance_id: str
    overlapping_instances: list[str]
    bank_trajectories: list[str]      # the bank's trajectories of those instances
    action: str = "none"

    def to_dict(self) -> dict:
        return asdict(self)


def shared_repos(pools, bank) -> list[str]:
    """The named repositories that both the pools' candidates and ``bank`` hold (an unknown one, "", is no overlap)."""
    return sorted({c.repo for p in pools for c in p.candidates if c.repo} & set(bank.repo_names_))


def check_leaks(pools, bank) -> list[PoolLeak]:
    """The pools (sorted by instance) whose candidates' instances are in ``bank``."""
    by_inst: dict[str, list[str]] = {}
    for t, i in bank.instances_.items():
        by_inst.setdefault(i, []).append(t)
    out = []
    for p in sorted(pools, key=lambda p: p.instance_id):
        inst = sorted({c.instance_id for c in p.candidates} & set(by_inst))
        if inst:
            out.append(PoolLeak(p.instance_id, inst, sorted(t for i in inst for t in by_inst[i])))
    return out


def apply_on_leak(pools: Sequence, bank, on_leak: str, *, owner: str = "filter") -> tuple[list, dict, list[str]]:
    """(pools to score, the ``leak`` section of the output, warning lines) under ``on_leak``.

    "allow" marks the overlapping instances as allowed on ``bank`` (``allowed_instances_``), so its
    instance check lets those candidates through; "error" raises before anything is scored.
    """
    check_choice(on_leak, "on_leak", owner, ON_LEAK)
    leaks = check_leaks(pools, bank)
    if leaks and on_leak == "error":
        named = "; ".join(f"{x.instance_id} ({len(x.bank_trajectories)} bank trajectories)" for x in leaks[:5])
        raise LatentSiftError(f"{owner}: {len(leaks)} of {len(pools)} pools have their instance in the bank "
                              f"({named}{'; ...' if len(leaks) > 5 else ''}): in evaluation that is leakage. Rebuild "
                              "the bank without them, or pass --on-leak skip (leave those pools out) or "
                              "--on-leak allow (score them: deployment with a bank that has seen the task).")
    bad = {x.instance_id for x in leaks}
    for x in leaks:
        x.action = ACTIONS[on_leak]
    if on_leak == "allow":
        bank.allowed_instances_ = set(getattr(bank, "allowed_instances_", set())) | \
            {i for x in leaks for i in x.overlapping_instances}
        keep = list(pools)
    else:
        keep = [p for p in pools if p.instance_id not in bad]
    warnings = [f"{x.instance_id}: instance in the bank ({len(x.bank_trajectories)} bank trajectories); {x.action}"
                for x in leaks]
    section = {"on_leak": on_leak, "n_overlapping": len(leaks), "n_pools": len(pools),
               "pools": [x.to_dict() for x in leaks]}
    return keep, section, warnings
