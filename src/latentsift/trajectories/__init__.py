"""Trajectories: the canonical model (``trajectory``: ``Step``, ``Trajectory``, ``Pool``) and their import
from several agent scaffolds (``importers``; one ``_<format>`` module per format, registered in
``_registry``). Coding tasks, the sandbox and the policy's own rollouts are the wing ``latentsift.rollout``."""
from .importers import (FORMATS, ImporterEntry, ImportResult, ImportSummary, RecordError, SkippedRecord,
                        format_names, import_paths, register_importer)
from .trajectory import CHANNEL_ID, CHANNELS, Pool, Step, Trajectory, group_pools, load_jsonl, load_pools, save_jsonl

__all__ = ["CHANNELS", "CHANNEL_ID", "FORMATS", "ImportResult", "ImportSummary", "ImporterEntry", "Pool", "RecordError",
           "SkippedRecord", "Step", "Trajectory", "format_names", "group_pools", "import_paths", "load_jsonl",
           "load_pools", "register_importer", "save_jsonl"]
