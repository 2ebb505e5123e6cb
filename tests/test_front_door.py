"""The front door: a README a newcomer reads in two minutes, and tables a reader can read.

The README stays short and holds no commit hashes, dates or test counts (they go stale and mean nothing
to a reader: history lives in docs/studies/history.md); no markdown table cell anywhere in
README.md or docs/**/*.md runs over 200 characters (a longer cell is a paragraph: put it under the table).
The cell check runs once per file, so a file with a long cell fails under its own name.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MAX_README_LINES = 150
MAX_CELL = 200

#: Long cells left, when this check was written, in sections other work was rewriting at the same time:
#: the check fails under these files' names until the cells are shortened (never skipped).
PENDING = {"docs/studies/premise.md": "the premise section's summary table (wall time, CPU kind)",
           "docs/trajectories.md": "the formats table (the OpenAI row)",
           "docs/own-policy.md": "the sandbox's table of risks"}

FENCE = re.compile(r"^\s*(```|~~~)")
CELL_SPLIT = re.compile(r"(?<!\\)\|")          # a cell ends at an unescaped pipe (GitHub's rule)
#: a commit hash: a word of 7-40 hex digits holding at least one digit (so a word like "defaced" does not
#: count; a hash of digits only, like 4029638, does)
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
TEST_COUNT = re.compile(r"\b\d[\d,]* tests\b")


def table_cells(text: str) -> list[tuple[int, str]]:
    """(line number, cell text) of every cell of every markdown table outside fenced code blocks."""
    cells, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        s = line.strip()
        if fenced or not s.startswith("|"):
            continue
        parts = CELL_SPLIT.split(s)[1:]
        if parts and parts[-1].strip() == "":
            parts = parts[:-1]  # the row's closing pipe
        cells += [(n, p.strip()) for p in parts]
    return cells


def test_table_cells_are_split_as_github_splits_them():
    text = "| a | b \\| c |\n| --- | --- |\n| x | " + "y" * 201 + " |\n```\n| " + "z" * 300 + " |\n```\n"
    assert table_cells(text) == [(1, "a"), (1, "b \\| c"), (2, "---"), (2, "---"), (3, "x"), (3, "y" * 201)]
    assert [len(c) for _, c in table_cells(text) if len(c) > MAX_CELL] == [201]   # the fenced row is code


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; at most {MAX_README_LINES} (move detail to docs/)"


def test_the_readme_holds_no_commit_hash_date_or_test_count():
    text = README.read_text()
    found = [f"README.md:{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1)
             for pat in (HASH, DATE, TEST_COUNT) for m in pat.finditer(line)]
    assert found == [], "history belongs in docs/studies/history.md"
    assert HASH.search("at commit 4029638 on") and DATE.search("on 2026-11-26,") and TEST_COUNT.search("(582 tests)")
    assert HASH.search("at e6d8e3c") and not HASH.search("2,624 candidates, 425,383 tokens, defaced, 0.9995")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_no_table_cell_is_over_200_characters(doc):
    """Each file on its own: a failure names the file, the line and the cell's start."""
    long = [f"{doc.relative_to(ROOT)}:{n}: {len(c)} characters: {c[:60]!r}..."
            for n, c in table_cells(doc.read_text()) if len(c) > MAX_CELL]
    name = str(doc.relative_to(ROOT))
    pending = f" (known when this check was written: {PENDING[name]})" if name in PENDING else ""
    assert long == [], f"cells over 200 characters{pending}: put the detail in a paragraph under the table"
