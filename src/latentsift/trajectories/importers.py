"""Import agent trajectories from several scaffolds into canonical ``Trajectory`` records.

Supported inputs (auto-detected from the content; files, folders, ``.gz`` and ``.tar.gz``):
R2E-Gym / DeepSWE trajectory JSONL (incl. AutoCodeRover runs converted to it), SWE-agent 0.x and
1.x ``.traj`` files, OpenHands' SWE-bench ``output.jsonl``, OpenAI-style chat messages with
``tool_calls`` (OpenHands completion logs, vLLM / OpenAI tool use), mini-swe-agent 1.x and 2.x
trajectories, and canonical JSONL; labels from ``candidates.csv`` and SWE-bench harness reports
(the run report and the per-instance ``report.json``). See docs/trajectories.md for the shapes and versions followed.

A new format is one module with one ``@register_importer`` registration on its ``read(obj, where,
src)``: ``--format``, auto-detection and the error messages read the registry.
"""
from ._api import (FORMATS, KNOWN_LEAKING_RUNS, ImportResult, ImportSummary, SkippedRecord,
                   import_paths, nothing_read)
from ._common import RecordError, Where
from ._registry import ImporterEntry, format_names, importers, register_importer
from ._sources import Source
from .trajectory import load_jsonl, load_pools, save_jsonl

__all__ = ["FORMATS", "KNOWN_LEAKING_RUNS", "ImportResult", "ImportSummary", "SkippedRecord", "RecordError",
           "import_paths", "nothing_read", "load_jsonl", "load_pools", "save_jsonl",
           # adding a format: one module with one registration (``_importers/_registry.py``)
           "register_importer", "importers", "format_names", "ImporterEntry", "Source", "Where"]
