"""Stage 1: the filters. The paper's equations, one small pure module each (``margin``, ``rank``,
``fuse``, ``retain``), the keep rules (``keep``: the paper's fixed rule and the recall-targeted one; ``keep_confident``: its high-probability form,
``keep_adaptive``: on the score's value across pools,
with score calibration in ``calibration``), the learned scorer (``scorer``, its products in fixed pieces in ``head_products``), the ``LatentSift`` filter (``sift``), the rule
baselines and the registry of every filter (``rules``), the paper's ablations (``ablations``), the
beyond-paper variants and the inner-CV default (``variants``) and early pruning on prefixes (``prune``).
Eq. 3's ``fuse`` stays at ``fuse.fuse`` (re-exported here it would hide its module)."""
from .calibration import CalibrationMap, fit_calibration
from .keep import CalibrationPools, FixedKeep, KeepRule, RecallKeep, keep_rule, keep_rules
from .keep_adaptive import GapRecallKeep
from .keep_confident import ConfidentRecallKeep
from .margin import step_margins
from .prune import PrefixSift, Pruner
from .rank import (channel_ranks, grouped_channel_ranks, grouped_normalized_ranks, min_channel_rank, normalized_ranks,
                   null_min_rank)
from .retain import order_by_score, retain_count, select_retained
from .rules import RuleFilter, filter_entry, register_filter, rule_keys, unregister_filter
from .scorer import LinearScorer
from .sift import CandidateScore, FilterRun, LatentSift, PoolResult, Stage1Filter
from .variants import LogisticProbe, StackedFilter

__all__ = ["CalibrationMap", "CalibrationPools", "CandidateScore", "ConfidentRecallKeep", "FilterRun", "FixedKeep", "GapRecallKeep", "KeepRule", "LatentSift",
           "LinearScorer", "LogisticProbe", "PoolResult", "PrefixSift", "Pruner", "RecallKeep", "RuleFilter",
           "StackedFilter", "Stage1Filter", "filter_entry", "fit_calibration", "keep_rule", "keep_rules",
           "channel_ranks", "grouped_channel_ranks", "grouped_normalized_ranks", "min_channel_rank",
           "normalized_ranks", "null_min_rank", "order_by_score", "register_filter",
           "retain_count", "rule_keys", "select_retained", "step_margins", "unregister_filter"]
