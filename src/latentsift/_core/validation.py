"""One shared place for input checks at public entry points.

Error messages have one shape:
    "The 'k' parameter of retain_count must be a positive int. Got 0 instead."
Inner functions trust their arguments; never ``assert`` on user input.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import FingerprintMismatch, LatentSiftError, NotFittedError  # noqa: F401 (their home for callers)

#: The package's name: its cache folder, the key of its metadata in saved files, the first word of its commands.
PACKAGE = __name__.partition(".")[0]


def param_error(name: str, owner: str, expected: str, got: Any) -> LatentSiftError:
    return LatentSiftError(f"The '{name}' parameter of {owner} must be {expected}. Got {got!r} instead.")


def check_positive_int(value: Any, name: str, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise param_error(name, owner, "a positive int", value)
    return int(value)


def check_choice(value: Any, name: str, owner: str, choices) -> Any:
    if value not in choices:
        raise param_error(name, owner, f"one of {sorted(choices)}", value)
    return value


def check_scores(scores: Any, name: str, owner: str, *, allow_nan: bool = False) -> np.ndarray:
    """A 1-D float array of scores (NaN allowed only where the caller documents a rule for it)."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 1:
        raise param_error(name, owner, "a 1-D sequence of numbers", f"an array of shape {arr.shape}")
    bad = np.isinf(arr) if allow_nan else ~np.isfinite(arr)
    if bad.any():
        raise param_error(name, owner, "finite numbers" + (" (NaN = missing)" if allow_nan else ""),
                          f"a non-finite value at index {int(np.flatnonzero(bad)[0])}")
    return arr


def check_states(states: Any, name: str, owner: str, *, d: int | None = None,
                 allow_empty: bool = False) -> np.ndarray:
    """A 2-D (n, d_model) float array of finite states."""
    if hasattr(states, "detach"):  # torch tensor
        states = states.detach().cpu().numpy()
    arr = np.asarray(states)
    if arr.ndim != 2:
        raise param_error(name, owner, "a 2-D array of shape (n, d_model)", f"an array of shape {arr.shape}")
    if arr.shape[0] == 0 and not allow_empty:
        raise param_error(name, owner, "a non-empty array of states", "an empty array")
    if d is not None and arr.shape[1] != d:
        raise LatentSiftError(f"The '{name}' parameter of {owner} has d_model={arr.shape[1]} "
                              f"but {d} was expected (dimension mismatch).")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float32)
    if arr.size and not np.isfinite(arr).all():
        row = int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])
        raise LatentSiftError(f"The '{name}' parameter of {owner} contains NaN or inf (first in row {row}).")
    return arr


def check_labelled(trajs, owner: str) -> None:
    """Every candidate needs a test outcome (reward) to be evaluated or banked."""
    if not trajs:
        raise LatentSiftError(f"{owner}: the pools file holds no trajectory.")
    missing = [t.traj_id for t in trajs if t.label is None]
    if missing:
        raise LatentSiftError(f"{owner}: {len(missing)} of {len(trajs)} candidates have no label (reward), "
                              f"e.g. {missing[0]!r}. Cross-validation and fitting need the test outcome of every "
                              "candidate: import the pools with --labels, or leave the unlabelled pools out.")


def check_states_present(store, trajs, owner: str) -> None:
    """Every candidate of ``trajs`` has states in ``store`` (said before any work)."""
    missing = [t.traj_id for t in trajs if not store.has(t.traj_id)]
    if missing:
        raise LatentSiftError(f"{owner}: the state store {str(store.path)!r} has no states for {len(missing)} of "
                              f"{len(trajs)} candidates, e.g. {missing[0]!r}; run 'latentsift extract' on the "
                              "same pools file first.")
