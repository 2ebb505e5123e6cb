"""The evaluation protocol shared by ``latentsift reproduce`` and ``latentsift crossval``.

Disjoint folds (by repository, agent or instance) -> the paper's method, its ablations, the
variants and the inner-CV default, the baselines (``stage1``, ``variants``, ``curves``) -> agent
transfer (``transfer_agents``) -> the shift guard's error rates (``guard``) -> the cascade on seeded
draws and the report (``run.evaluate_protocol``, ``tables``) -> offline pruning (``pruning``).
The paper's run end to end is ``reproduction`` (``latentsift reproduce``; the benchmarks build on its settings,
selection and run folders); ``transfer`` is the
bank-transfer matrix across pools sets, ``control`` the planted-outcome control, ``shift_eval`` the shift guard's error rates.
``settings.ProtocolSettings`` holds the settings both commands share; ``run.Run`` a run folder
and its per-fold cache; ``crossval`` runs the protocol on a team's own pools.
"""
from .._core.validation import check_labelled, check_states_present
from .control import plant_outcome, plant_pools
from .crossval import ON_LEAK_CROSSVAL, CrossvalSettings, crossval
from .folds import check_folds, check_group_by, fold_splits, group_noun, group_of, leaking_pools
from .guard import protocol_guard
from .pruning import cached_step_tokens, evaluate_pruning, reproduce_pruning, verdict
from .reproduction import (CLEAN_RUNS, LEAKY_RUNS, ReproduceSettings, check_data_dir, open_run_dir, prepare_run,
                           reproduce, select_trajectories)
from .run import NO_VERIFIER, Run, evaluate_protocol, no_verifier_table, open_run
from .settings import GROUP_BY, ProtocolSettings, digest, hash_key
from .stage1 import DrawScorer, latentsift_variants, stage1_filters
from .shift_eval import fold_rows, summarise_rows
from .tables import ablation_tables, candidate_table, per_agent_retention, retention_differences
from .transfer import TransferSettings, transfer_summary
from .transfer_agents import agent_transfer
from ..sift.variants import STACK_CONFIGS

# ``reproduce.reproduce`` and ``reproduce.ReproduceSettings`` stay at their module: a re-exported
# ``reproduce`` would hide the module of that name.
__all__ = ["CLEAN_RUNS", "LEAKY_RUNS", "ReproduceSettings", "check_data_dir", "open_run_dir", "prepare_run",
           "reproduce", "select_trajectories", "TransferSettings", "fold_rows", "plant_outcome", "plant_pools",
           "summarise_rows", "transfer_summary",
           "CrossvalSettings", "DrawScorer", "GROUP_BY", "NO_VERIFIER", "ON_LEAK_CROSSVAL", "ProtocolSettings",
           "Run", "STACK_CONFIGS", "ablation_tables", "agent_transfer", "cached_step_tokens", "candidate_table",
           "check_folds", "check_group_by", "check_labelled", "check_states_present", "crossval", "digest",
           "evaluate_protocol", "evaluate_pruning", "fold_splits", "group_noun", "group_of", "hash_key",
           "leaking_pools", "latentsift_variants", "no_verifier_table", "open_run", "per_agent_retention",
           "protocol_guard", "reproduce_pruning", "retention_differences", "stage1_filters", "verdict"]
