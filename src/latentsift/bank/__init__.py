"""The reference bank: ``Bank`` (labelled trajectories' states, whitened, per channel), the fold splits
by repository (``bank``), and exact nearest-neighbour search (``knn``, Eq. 1's distances)."""
from .bank import Bank, Fold, iter_folds, leave_one_repo_out, split_by_repo
from .knn import nearest_distances

__all__ = ["Bank", "Fold", "iter_folds", "leave_one_repo_out", "nearest_distances", "split_by_repo"]
