"""Banks that transfer: several runs as one, a bank library per agent, and the bank chosen per pool.

- ``open_stores(dirs)``: several state stores read as one (``StoreUnion``); refused before any work
  unless they share the model fingerprint and every value-changing extraction setting
  (``store.MATCHED_SETTINGS``), with an error naming the difference.
- ``load_runs(pools_paths, states_dirs)``: the labelled trajectories of several canonical pools files
  (trajectory ids must be distinct) and the union of their stores.
- ``library_groups`` / ``fit_sub_banks``: a sub-bank and a scorer per agent, and per scaffold where
  a scaffold's trajectories are not one agent's, each with its shift guard's reference
  (``shift.Reference.from_bank``); saved inside a sifter (``sifter.Sifter.fit(per_agent=True)``).
- ``nearest_choice``: per pool, the median nearest-bank distance of its candidates' trajectory
  vectors to each sub-bank (the shift guard's distance, ``shift.check_pools``) and the sub-bank with
  the smallest one (ties: the first name).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._core.io import member
from .._core.validation import FingerprintMismatch, LatentSiftError, check_labelled, check_states_present
from ..bank.bank import Bank
from ..sift.scorer import LinearScorer, early_stopping_groups
from .shift import Reference, check_pools, scaffold_of
from ..states.states import TrajectoryStates
from ..states.extract import select_instances
from ..states.store import MATCHED_SETTINGS, SETTING_DEFAULTS, StateStore
from ..trajectories.trajectory import Trajectory, load_jsonl

BANK_CHOICES = ("all", "nearest")
LIBRARY_DIR = "library"


# ---------------------------------------------------------------------- several stores as one
class StoreUnion:
    """Several opened ``StateStore`` of one model and settings, read as one (``load``, ``has``)."""

    def __init__(self, stores: Sequence[StateStore]):
        self.stores = list(stores)
        self.path = ", ".join(str(s.path) for s in self.stores)

    @property
    def fingerprint(self):
        return self.stores[0].fingerprint

    @property
    def settings(self) -> dict:
        return self.stores[0].settings

    def has(self, traj_id: str) -> bool:
        return any(s.has(traj_id) for s in self.stores)

    def load(self, traj_ids=None, **kw) -> dict[str, TrajectoryStates]:
        out: dict[str, TrajectoryStates] = {}
        for s in self.stores:
            want = None if traj_ids is None else [t for t in traj_ids if t not in out and s.has(t)]
            if want is None or want:
                out |= s.load(want, **kw)
        return out


def store_difference(a: StateStore, b: StateStore) -> str | None:
    """One line naming how two stores' model or value-changing settings differ; None if they match."""
    fa, fb = a.fingerprint, b.fingerprint
    if fa.digest != fb.digest:
        diff = [f"{k} {getattr(fa, k)!r} vs {getattr(fb, k)!r}" for k in fa.__dataclass_fields__
                if k != "digest" and getattr(fa, k) != getattr(fb, k)]
        return f"another model ({', '.join(diff) or 'fingerprint ' + fa.digest + ' vs ' + fb.digest})"
    diff = settings_difference(a.settings, b.settings)
    return f"other settings ({', '.join(diff)})" if diff else None


def settings_difference(sa: dict, sb: dict, keys: Sequence[str] = MATCHED_SETTINGS) -> list[str]:
    """``key=a vs b`` for each of ``keys`` whose value differs between two stores' settings (a store written
    before a setting existed: its default)."""
    return [f"{k}={sa.get(k, SETTING_DEFAULTS.get(k))!r} vs {sb.get(k, SETTING_DEFAULTS.get(k))!r}"
            for k in keys if sa.get(k, SETTING_DEFAULTS.get(k)) != sb.get(k, SETTING_DEFAULTS.get(k))]


def open_stores(dirs: Sequence[str | Path], owner: str) -> StoreUnion:
    """Open every store and refuse (before any work) stores of another model or other settings."""
    if not dirs:
        raise LatentSiftError(f"{owner}: pass at least one --states STATES_DIR.")
    stores = []
    for d in dirs:
        if not Path(d).is_dir():
            raise LatentSiftError(f"{owner}: no state store at {str(d)!r}; run 'latentsift extract' first.")
        stores.append(StateStore(d).open())
    for s in stores[1:]:
        why = store_difference(stores[0], s)
        if why is not None:
            cls = FingerprintMismatch if why.startswith("another model") else LatentSiftError
            raise cls(f"{owner}: the state stores {str(stores[0].path)!r} and {str(s.path)!r} hold states of {why}; "
                      "extract every pools file with the same model and settings to combine them.")
    return StoreUnion(stores)


def load_runs(pools_paths: Sequence[str | Path], states_dirs: Sequence[str | Path], owner: str, *,
              instances: int | None = None, sources: dict | None = None) -> tuple[list[Trajectory], StoreUnion | None]:
    """The labelled trajectories of every pools file (ids distinct) and their stores as one (None without
    ``states_dirs``: a method that needs no states).

    ``sources``: a dict filled with traj_id -> the index of its pools file."""
    union = open_stores(states_dirs, owner) if states_dirs else None  # refused before the pools are read
    trajs: list[Trajectory] = []
    seen: dict[str, str] = {}
    seen_files: list[str] = []
    for p in pools_paths:
        for t in select_instances(load_jsonl(p), instances):
            if t.traj_id in seen:
                raise LatentSiftError(f"{owner}: the trajectory id {t.traj_id!r} is in both {seen[t.traj_id]} and "
                                      f"{p}; pass each run once.")
            seen[t.traj_id] = str(p)
            if sources is not None:
                sources[t.traj_id] = len(seen_files)
            trajs.append(t)
        seen_files.append(str(p))
    check_labelled(trajs, owner)
    if union is not None:
        check_states_present(union, trajs, owner)
    return trajs, union


# ---------------------------------------------------------------------- the bank library
@dataclass
class SubBank:
    """One entry of a sifter's bank library: the bank, scorer and shift reference of one group."""

    name: str                      # "agent:<agent>" or "scaffold:<scaffold>"
    agents: list[str]
    scaffolds: list[str]
    bank: Bank
    scorer: LinearScorer
    reference: Reference
    n_trajectories: int
    label_counts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "agents": self.agents, "scaffolds": self.scaffolds,
                "n_trajectories": self.n_trajectories, "label_counts": self.label_counts,
                "shift_reference": self.reference.to_dict(), "parts": {"bank": f"{self.dir_name}/bank",
                                                                       "scorer": f"{self.dir_name}/scorer"}}

    @property
    def dir_name(self) -> str:
        return f"{LIBRARY_DIR}/" + "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name.replace(":", "-"))


def library_groups(trajs: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """name -> trajectories: one group per agent, plus one per scaffold whose trajectories are not
    exactly one agent's (a scaffold shared by several agents, or an agent on several scaffolds)."""
    by_agent: dict[str, list[Trajectory]] = {}
    by_scaffold: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_agent.setdefault(t.agent, []).append(t)
        by_scaffold.setdefault(scaffold_of(t), []).append(t)
    out = {f"agent:{a}": ts for a, ts in sorted(by_agent.items())}
    agent_sets = [{t.traj_id for t in ts} for ts in by_agent.values()]
    for s, ts in sorted(by_scaffold.items()):
        if {t.traj_id for t in ts} not in agent_sets:
            out[f"scaffold:{s}"] = ts
    return out


def fit_sub_bank(name: str, trajs: Sequence[Trajectory], states: Mapping[str, TrajectoryStates], fingerprint, *,
                 scorer_epochs: int, seed: int, bank_params: Mapping[str, Any] | None = None,
                 reference_kw: Mapping[str, Any] | None = None) -> SubBank:
    """A bank, a gated scorer and the shift reference from one group's trajectories (both classes);
    ``reference_kw``: ``Reference.from_bank``'s ``kind`` / ``false_alarm``."""
    ids = sorted(t.traj_id for t in trajs)
    by = {t.traj_id: t for t in trajs}
    bank = Bank.from_trajectories(trajs, states, fingerprint, **dict(bank_params or {}))
    scorer = LinearScorer(max_epochs=scorer_epochs, seed=seed).fit([states[i] for i in ids],
                                                                   [int(by[i].label) for i in ids],
                                                                   fingerprint=fingerprint,
                                                                   groups=early_stopping_groups(trajs))
    agents = sorted({t.agent for t in trajs})
    scaffolds = sorted({scaffold_of(t) for t in trajs})
    ref = Reference.from_bank(bank, agents=agents, scaffolds=scaffolds, **dict(reference_kw or {}))
    return SubBank(name, agents, scaffolds, bank, scorer, ref, len(ids), bank.label_counts())


def fit_sub_banks(trajs: Sequence[Trajectory], states: Mapping[str, TrajectoryStates], fingerprint, *,
                  scorer_epochs: int, seed: int, bank_params: Mapping[str, Any] | None = None,
                  reference_kw: Mapping[str, Any] | None = None,
                  log: Callable[[str], None] = lambda m: None) -> tuple[list[SubBank], list[dict]]:
    """Every ``library_groups`` entry with both classes as a ``SubBank``; the others as skipped notes."""
    subs, skipped = [], []
    for name, ts in library_groups(trajs).items():
        n_pos = sum(int(t.label) for t in ts)
        if n_pos in (0, len(ts)):
            skipped.append({"name": name, "n_trajectories": len(ts),
                            "reason": f"one class only ({n_pos} resolved of {len(ts)}): no margin"})
            continue
        log(f"[fit] sub-bank {name}: {len(ts)} trajectories ({n_pos} resolved)")
        subs.append(fit_sub_bank(name, ts, states, fingerprint, scorer_epochs=scorer_epochs, seed=seed,
                                 bank_params=bank_params, reference_kw=reference_kw))
    return subs, skipped


def save_sub_banks(subs: Sequence[SubBank], root: Path) -> None:
    for s in subs:
        s.bank.save(root / s.dir_name / "bank", source={"sifter": True, "sub_bank": s.name})
        s.scorer.save(root / s.dir_name / "scorer", plot=False)


def load_sub_banks(entries: Sequence[dict], root: Path, manifest: Path) -> list[SubBank]:
    """The library entries of a sifter's ``manifest`` (checked by its schema), their parts read from
    inside the sifter folder ``root``."""
    return [SubBank(e["name"], e["agents"], e["scaffolds"], Bank.load(member(root, e["parts"]["bank"], manifest)),
                    LinearScorer.load(member(root, e["parts"]["scorer"], manifest)),
                    Reference(**e["shift_reference"]), e["n_trajectories"], e.get("label_counts", {}))
            for e in entries]


# ---------------------------------------------------------------------- the bank chosen per pool
def pool_distances(pools, states: Mapping[str, TrajectoryStates], subs: Sequence[SubBank]) -> dict[str, dict[str, float]]:
    """instance_id -> {sub-bank name: median nearest-bank distance of the pool's candidates}."""
    out: dict[str, dict[str, float]] = {p.instance_id: {} for p in pools}
    for s in subs:
        for ps in check_pools(pools, states, s.bank, s.reference):
            out[ps.instance_id][s.name] = ps.median_nearest_bank_distance
    return out


def nearest_choice(distances: Mapping[str, Mapping[str, float | None]]) -> dict[str, str]:
    """instance_id -> the sub-bank with the smallest median distance (ties and NaN: first name wins)."""
    out = {}
    for iid, d in distances.items():
        names = sorted(d)
        vals = np.array([np.inf if d[n] is None or not np.isfinite(d[n]) else d[n] for n in names])
        out[iid] = names[int(np.argmin(vals))]
    return out
