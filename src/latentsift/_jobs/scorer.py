"""``latentsift scorer train`` on files: fit the learned head (``latentsift.sift.scorer.LinearScorer``) on a
bank's trajectories and labels, with the states the bank was built from, and save it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .._core.outputs import owned_output
from .._core.validation import LatentSiftError
from ..bank.bank import Bank
from ..sift.scorer import CURVE_PNG, LinearScorer, check_split
from ..states.store import StateStore, check_recorded_settings

__all__ = ["CURVE_PNG", "LinearScorer", "train_scorer", "train_scorer_to_file"]


def train_scorer(bank_dir: str | Path, *, states_dir: str | Path | None = None,
                 scorer: LinearScorer | None = None,
                 callback: Callable[[dict], None] | None = None,
                 log: Callable[[str], None] | None = None) -> LinearScorer:
    """``latentsift scorer train``: fit the head on the bank's trajectories and labels.

    The states come from ``states_dir`` or, by default, the store the bank was built from
    (recorded in its manifest); their fingerprint must be the bank's. The split is checked first
    (``check_split``; ``log`` gets its notes).
    """
    bank = Bank.load(bank_dir)
    scorer = scorer if scorer is not None else LinearScorer()
    scorer._check_params()
    check_split(scorer, bank.labels_, log)
    sdir = states_dir if states_dir is not None else bank.source_.get("states_dir")
    if not sdir:
        raise LatentSiftError(f"The bank {bank_dir} does not record its states directory; pass --states.")
    store = StateStore(sdir).open()
    bank.check_fingerprint(store.fingerprint, f"states in {sdir}")
    check_recorded_settings(bank.source_.get("store_settings"), store, f"The bank {bank_dir}")
    states = store.load(bank.traj_ids_, dtype="float16")
    scorer.fit([states[t] for t in bank.traj_ids_], bank.labels_, fingerprint=bank.fingerprint_, callback=callback)
    scorer.source_ = {"bank_dir": str(Path(bank_dir).resolve()), "states_dir": str(Path(sdir).resolve()),
                      "n_trajectories": len(bank.traj_ids_), "label_counts": bank.label_counts(),
                      "store_settings": store.settings}  # 'filter' refuses states of other span settings
    return scorer


def train_scorer_to_file(bank_dir: str | Path, out: str | Path, *, states_dir: str | Path | None = None,
                         callback: Callable[[dict], None] | None = None, log: Callable[[str], None] | None = None,
                         **params) -> LinearScorer:
    """``latentsift scorer train``: ``train_scorer`` with a ``LinearScorer(**params)``, saved to ``out``
    (refused before any work when it would touch an input; every setting checked before the bank and the
    states load; a second writer to the same ``out`` is refused, not lost)."""
    with owned_output(out, [bank_dir, states_dir], kind="scorer"):  # a second 'scorer train' to it is refused
        val_frac = params.get("val_frac", LinearScorer().val_frac)
        if not 0.0 <= val_frac < 1.0:
            raise LatentSiftError(f"--val-frac is the share of bank trajectories held out for validation and must "
                                  f"lie in [0, 1) (the paper: 0.2). Got {val_frac:g} instead.")
        scorer = LinearScorer(**params)
        scorer._check_params()  # every option refused before the bank and the states load
        scorer = train_scorer(bank_dir, states_dir=states_dir, scorer=scorer, callback=callback, log=log)
        scorer.save(out)
    return scorer
