"""Executing a task's candidates in the sandbox, for two uses:

- the **label** (:func:`label`, :func:`label_many`): the candidate's program in one process, the
  task's hidden test and ``check(entry_point)`` in another (``sandbox.run_test``); the candidate
  passes when ``check`` returns, as the test's process sees it;
- the **agent's tool** (:func:`run_examples`, :func:`run_examples_many`): the candidate's program and
  only the docstring's examples (never the hidden test), each run on its own (doctest semantics for
  ``>>>`` examples, where equal literals written differently also pass; value equality for
  one-line ones); what passed and failed comes back as an
  :class:`ExamplesReport` whose ``observation()`` is a short text for the policy to read.

A completion is what follows the prompt: a function body, or whole code that defines the entry point
again (``Task.program``). Every run is one sandboxed subprocess (``sandbox.run_program``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from .sandbox import SandboxLimits, SandboxResult, run_programs, run_tests
from .tasks import Example, Task

#: Prefix of the harness's lines on stdout (one per example run); stripped from the output kept.
MARKER = "\x1fLATENTSIFT-EXAMPLE\x1f"
#: Characters of an example's actual output kept in a report.
GOT_CHARS = 200
EXAMPLE_STATUSES = ("passed", "failed", "error", "not run")

_HARNESS = '''

def __latentsift_examples(examples, globs, marker, got_chars):
    import ast, doctest, json, sys, traceback

    class Runner(doctest.DocTestRunner):
        outcome = ("error", "not run")

        def report_start(self, out, test, example):
            pass

        def report_success(self, out, test, example, got):
            self.outcome = ("passed", got)

        def report_failure(self, out, test, example, got):
            try:  # the same value written another way ('21' for "21", a list over two lines)
                same = ast.literal_eval(example.want.strip()) == ast.literal_eval(got.strip())
            except Exception:
                same = False
            self.outcome = ("passed" if same else "failed", got)

        def report_unexpected_exception(self, out, test, example, exc_info):
            self.outcome = ("error", traceback.format_exception_only(*exc_info[:2])[-1])

    for call, expected, kind in examples:
        if kind == "doctest":
            runner = Runner(optionflags=doctest.NORMALIZE_WHITESPACE)
            example = doctest.Example(call + "\\n", expected + "\\n" if expected else "")
            runner.run(doctest.DocTest([example], globs, "example", None, 0, None), out=lambda s: None,
                       clear_globs=False)
            status, got = runner.outcome
        else:
            try:
                value = eval(call, globs)
                status, got = ("passed" if value == ast.literal_eval(expected) else "failed"), repr(value)
            except Exception as e:
                status, got = "error", f"{type(e).__name__}: {e}"
        got = " ".join(str(got).split())
        sys.__stdout__.write(marker + json.dumps({"status": status, "got": got[:got_chars]}) + "\\n")
        sys.__stdout__.flush()

'''


@dataclass(frozen=True)
class ExampleOutcome:
    """One example's run: ``status`` one of :data:`EXAMPLE_STATUSES` (``not run``: the program stopped
    before it, see the report's ``run``), ``got`` the actual output or value (or the exception)."""

    example: Example
    status: str
    got: str = ""


@dataclass(frozen=True)
class ExamplesReport:
    """The docstring examples run against one candidate. ``run``: the sandbox's result of the whole
    program (its stdout without the harness's lines); ``None`` for a task without examples (no run)."""

    task_id: str
    outcomes: tuple[ExampleOutcome, ...]
    run: SandboxResult | None

    @property
    def n_passed(self) -> int:
        return sum(o.status == "passed" for o in self.outcomes)

    @property
    def n_total(self) -> int:
        return len(self.outcomes)

    @property
    def all_passed(self) -> bool:
        return bool(self.outcomes) and self.n_passed == self.n_total

    def observation(self, max_chars: int = 1500) -> str:
        """What the policy reads back: a count line, then one line per example (PASS / FAIL with the
        expected and actual output / ERROR with the exception / NOT RUN), cut at ``max_chars``."""
        if not self.outcomes or self.run is None:
            return "The docstring has no examples to run."
        ran = [o for o in self.outcomes if o.status != "not run"]
        if not ran:
            return f"The code did not run: {self.run.detail.rstrip('.')}."
        lines = [f"{self.n_passed} of {self.n_total} examples passed."]
        for o in self.outcomes:
            call = o.example.call
            if o.status == "passed":
                lines.append(f"PASS {call}")
            elif o.status == "failed":
                lines.append(f"FAIL {call}: expected {o.example.expected or 'no output'}, got {o.got or 'no output'}")
            elif o.status == "error":
                lines.append(f"ERROR {call}: {o.got}")
            else:
                lines.append(f"NOT RUN {call} (the run stopped: {self.run.detail})")
        text = "\n".join(lines)
        return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def examples_program(task: Task, completion: str) -> str:
    """The candidate's program followed by the harness that runs the task's docstring examples."""
    examples = json.dumps([[e.call, e.expected, e.kind] for e in task.examples])  # strings only: a Python literal
    return (f"{task.program(completion)}{_HARNESS}\n\n"
            f"__latentsift_examples({examples}, globals(), {json.dumps(MARKER)}, {GOT_CHARS})\n")


def _report(task: Task, run: SandboxResult | None) -> ExamplesReport:
    if run is None:
        return ExamplesReport(task.task_id, (), None)
    reported, kept = [], []
    for line in run.stdout.splitlines(keepends=True):
        if line.startswith(MARKER):
            try:
                reported.append(json.loads(line[len(MARKER):]))
            except json.JSONDecodeError:
                continue
        else:
            kept.append(line)
    outcomes = []
    for i, example in enumerate(task.examples):
        r = reported[i] if i < len(reported) else None
        if isinstance(r, dict) and r.get("status") in EXAMPLE_STATUSES:
            outcomes.append(ExampleOutcome(example, r["status"], str(r.get("got", ""))))
        else:
            outcomes.append(ExampleOutcome(example, "not run"))
    return ExamplesReport(task.task_id, tuple(outcomes), replace(run, stdout="".join(kept)))


def _example_limits(limits: SandboxLimits | None, tasks: Sequence[Task]) -> SandboxLimits:
    """Room in the kept stdout for every harness line (a line is at most ~GOT_CHARS + 60 chars)."""
    limits = limits or SandboxLimits()
    most = max((len(t.examples) for t in tasks), default=0)
    return replace(limits, output_chars=max(limits.output_chars, limits.output_chars + (GOT_CHARS + 100) * most))


def label_many(items: Sequence[tuple[Task, str]], limits: SandboxLimits | None = None, *, workers: int = 2,
               progress: Callable[[int, int], None] | None = None) -> list[SandboxResult]:
    """Label each ``(task, completion)`` by its hidden test, in the order given (see :func:`label`)."""
    return run_tests([task.label_run(completion) for task, completion in items], limits,
                     workers=workers, progress=progress)


def label(task: Task, completion: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run the task's hidden test on one completion: ``result.passed`` is the label."""
    return label_many([(task, completion)], limits, workers=1)[0]


def run_examples_many(items: Sequence[tuple[Task, str]], limits: SandboxLimits | None = None, *,
                      workers: int = 2, progress: Callable[[int, int], None] | None = None) -> list[ExamplesReport]:
    """Run the docstring examples of each ``(task, completion)``, in the order given; a task without
    examples gets an empty report without a run (``progress(done, total)`` counts the runs)."""
    limits = _example_limits(limits, [task for task, _ in items])
    todo = [i for i, (task, _) in enumerate(items) if task.examples]
    runs = run_programs([examples_program(*items[i]) for i in todo], limits, workers=workers, progress=progress)
    by_index = dict(zip(todo, runs))
    return [_report(task, by_index.get(i)) for i, (task, _) in enumerate(items)]


def run_examples(task: Task, completion: str, limits: SandboxLimits | None = None) -> ExamplesReport:
    """The agent's tool: run only the docstring examples of ``task`` against ``completion``."""
    return run_examples_many([(task, completion)], limits, workers=1)[0]
