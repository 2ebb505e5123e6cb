"""``latentsift bank build`` on files: a fitted bank from a state store and a canonical pools JSONL
(the estimator is ``latentsift.bank.Bank``; this is its file driver)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._core.outputs import owned_output
from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError
from ..bank.bank import Bank, select_by_repo
from ..bank.knn import TORCH_KNN, knn_backends
from ..states.store import StateStore
from ..trajectories.trajectory import load_jsonl

__all__ = ["TORCH_KNN", "build_bank", "build_bank_to_file", "knn_backends"]


@blas_fixed
def build_bank(states_dir: str | Path, pools: str | Path, *, repos: Sequence[str] | None = None,
               exclude_repos: Sequence[str] | None = None, **params) -> Bank:
    """``latentsift bank build``: a fitted bank from a state store and a canonical pools JSONL.

    Every trajectory of ``pools`` whose repository is selected (``repos`` / ``exclude_repos``)
    becomes a bank entry; it must carry a reward (label = 1[reward >= 0.5]) and stored states.
    The states directory, pools file and repository selection are recorded in ``bank.source_``;
    ``params``: the ``Bank`` settings.
    """
    trajs = {t.traj_id: t for t in load_jsonl(pools)}
    if not trajs:
        raise LatentSiftError(f"{pools} holds no trajectory: nothing to build a bank from.")
    ids = select_by_repo({t: x.repo for t, x in trajs.items()}, include=repos, exclude=exclude_repos)
    if not ids:
        raise LatentSiftError(f"No trajectory of {pools} is left after the repository selection.")
    unlabelled = [t for t in ids if trajs[t].label is None]
    if unlabelled:
        raise LatentSiftError(f"{pools}: {len(unlabelled)} selected trajectories have no reward (e.g. "
                              f"{unlabelled[0]!r}); bank entries need outcome labels.")
    n_pos = sum(trajs[t].label for t in ids)
    if n_pos in (0, len(ids)):  # the same check as Bank.fit, before loading any state
        raise LatentSiftError(f"The bank would have an empty {'positive' if n_pos == 0 else 'negative'} class: "
                              f"the {len(ids)} selected trajectories of {pools} are all "
                              f"{'unresolved' if n_pos == 0 else 'resolved'}. Select repositories with both "
                              "outcomes.")
    store = StateStore(states_dir).open()
    states = store.load(ids, dtype="float16")
    bank = Bank.from_trajectories([trajs[t] for t in ids], states, store.fingerprint, **params)
    bank.source_ = {"states_dir": str(Path(states_dir).resolve()), "pools": str(Path(pools).resolve()),
                    "repos": list(repos) if repos is not None else None,
                    "exclude_repos": list(exclude_repos) if exclude_repos is not None else None,
                    "store_settings": store.settings}
    return bank


def build_bank_to_file(states_dir: str | Path, pools: str | Path, out: str | Path, *,
                       repos: Sequence[str] | None = None, exclude_repos: Sequence[str] | None = None,
                       **params) -> Bank:
    """``latentsift bank build``: ``build_bank`` saved to ``out`` (refused before any work when it would
    touch an input; ``repos`` and ``exclude_repos`` exclude each other)."""
    if repos is not None and exclude_repos is not None:
        raise LatentSiftError("Pass either --repos or --exclude-repos, not both.")
    with owned_output(out, [states_dir, pools], kind="bank"):  # a second 'bank build' to it is refused, not lost
        bank = build_bank(states_dir, pools, repos=repos, exclude_repos=exclude_repos, **params)
        bank.save(out)
    return bank
