"""Every code block the docs say runs is run here.

A doc marks such a block with the line ``<!-- doc-test: runs -->`` right above its ```` ```python ````
fence (README.md and docs/**/*.md). Each marked block runs as written, on its own (a fresh namespace), in an
empty temporary working folder that stands where the checkout does (``../shared`` is the shared data
beside the checkout, so a block may read it as a user in the project root would; what it writes stays in
the temporary folder), in this process (so the packaged model loads once). Unmarked blocks are API
sketches with placeholders; ``tests/test_docs.py`` still checks their imports.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = "<!-- doc-test: runs -->"
MARKED = re.compile(re.escape(MARKER) + r"\n```python\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, int, str]]:
    """(doc, line of the fence, code) of each marked block."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in MARKED.finditer(text):
            out.append((str(doc.relative_to(ROOT)), text[:m.start(1)].count("\n"), m.group(1)))
    return out


BLOCKS = _blocks()


def test_the_marker_is_only_used_above_python_blocks():
    """A marker elsewhere (a typo, a shell block) would silently run nothing."""
    n_markers = sum(doc.read_text().count(MARKER) for doc in DOCS)
    assert n_markers == len(BLOCKS) and any(d == "docs/capture.md" for d, _, _ in BLOCKS)


@pytest.mark.model
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("doc,line,code", BLOCKS, ids=[f"{d}:{n}" for d, n, _ in BLOCKS])
def test_each_marked_block_runs(doc, line, code, tmp_path, monkeypatch):
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (tmp_path / "shared").symlink_to(shared, target_is_directory=True)
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path / "checkout")
    exec(compile(code, f"{doc}:{line}", "exec"), {"__name__": f"doc_block_{line}"})   # raises if it does not run
