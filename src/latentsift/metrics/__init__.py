"""Measuring filters: seeded draws and bootstrap intervals (``bootstrap``), the evaluation's files
(``formats``: pools and scores), Best@K, tokens and savings through the cascade (``evaluate``), the
ranking diagnostics with paired intervals (``diagnostics``; every score's in one table: ``score_table``)
and score calibration (``calibrate``)."""
from .bootstrap import bootstrap_indices, draw_subsets, mean_ci, ratio_ci
from .calibrate import CalibrationMap, ece, fit_calibration
from .diagnostics import paired_bootstrap, per_agent_auc, same_agent_auc, within_pool_auc
from .evaluate import EvaluateSettings, Summary, evaluate_run
from .score_table import diagnostics_table
from .formats import ScoreSet, load_pool_file, load_scores, pools_from_trajectories, save_pool_file, save_scores

__all__ = ["CalibrationMap", "EvaluateSettings", "ScoreSet", "Summary", "bootstrap_indices", "diagnostics_table",
           "draw_subsets", "ece", "evaluate_run", "fit_calibration", "load_pool_file", "load_scores", "mean_ci",
           "paired_bootstrap", "per_agent_auc", "pools_from_trajectories", "ratio_ci", "same_agent_auc",
           "save_pool_file", "save_scores", "within_pool_auc"]
