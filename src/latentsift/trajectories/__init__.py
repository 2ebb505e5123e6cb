"""Trajectories: the canonical model (``trajectory``: ``Step``, ``Trajectory``, ``Pool``) and their import
from several agent scaffolds (``importers``; one ``_<format>`` module per format, registered in
``_registry``); coding tasks for a policy (``tasks``: HumanEval or a user's file), the sandbox that
executes candidate programs (``sandbox``) and its two uses on a task, the hidden-test label and the
docstring-example tool (``execution``)."""
from .execution import ExampleOutcome, ExamplesReport, label, label_many, run_examples, run_examples_many
from .importers import (FORMATS, ImporterEntry, ImportResult, ImportSummary, RecordError, SkippedRecord,
                        format_names, import_paths, register_importer)
from .sandbox import SandboxLimits, SandboxResult, run_program, run_programs
from .tasks import Example, Task, docstring_examples, humaneval_path, load_tasks
from .trajectory import CHANNEL_ID, CHANNELS, Pool, Step, Trajectory, group_pools, load_jsonl, load_pools, save_jsonl

__all__ = ["CHANNELS", "CHANNEL_ID", "FORMATS", "Example", "ExampleOutcome", "ExamplesReport", "ImportResult",
           "ImportSummary", "ImporterEntry", "Pool", "RecordError", "SandboxLimits", "SandboxResult", "SkippedRecord",
           "Step", "Task", "Trajectory", "docstring_examples", "format_names", "group_pools", "humaneval_path",
           "import_paths", "label", "label_many", "load_jsonl", "load_pools", "load_tasks", "register_importer",
           "run_examples", "run_examples_many", "run_program", "run_programs", "save_jsonl"]
