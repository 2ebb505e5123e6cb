"""The documentation's code imports what the package has: every ``from latentsift... import ...`` in a
Python block of README.md and docs/**/*.md names a module and names that exist (so a moved module or a
renamed function cannot leave the docs behind)."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _imports() -> list[tuple[str, str, str]]:
    """(doc, module, name) for each name imported from the package in a Python block."""
    out = []
    for doc in DOCS:
        for block in BLOCK.findall(doc.read_text()):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "latentsift":
                    out += [(str(doc.relative_to(ROOT)), node.module, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    out += [(str(doc.relative_to(ROOT)), a.name, "") for a in node.names
                            if a.name.split(".")[0] == "latentsift"]
    return out


IMPORTS = _imports()


def test_the_docs_import_from_the_package():
    assert len(IMPORTS) >= 10 and any(d == "README.md" for d, _, _ in IMPORTS)


@pytest.mark.parametrize("doc,module,name", IMPORTS, ids=[f"{d}:{m}.{n}" for d, m, n in IMPORTS])
def test_each_documented_import_exists(doc, module, name):
    mod = importlib.import_module(module)
    assert not name or hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), \
        f"{doc}: `from {module} import {name}`: no such name"


LINK = re.compile(r"\]\(((?:\.\./|docs/)?[\w./-]*\.md)?(#[\w-]+)?\)")


def _slugs(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (lower case, punctuation dropped, spaces -> '-')."""
    heads = [l.lstrip("#").strip() for l in path.read_text().splitlines() if re.match(r"#{1,6} ", l)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_link_between_the_docs_resolves():
    """Each [text](file.md#anchor) of README.md and docs/**/*.md names a file and a heading that exist."""
    broken = []
    for doc in DOCS:
        for target, anchor in LINK.findall(doc.read_text()):
            if not target and not anchor:
                continue
            path = (doc.parent / target).resolve() if target else doc
            if not path.is_file():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and anchor[1:] not in _slugs(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target}{anchor}")
    assert broken == []


#: "issue 29", "Issue 29, fourth pass", "(issue NN)", "issues 12 and 14", "#29", "PR 7", "ticket 3".
TICKET = re.compile(r"\b(?:issues?|tickets?|PRs?|pull requests?)\s*#?\d+|(?<![\w/&])#\d+\b", re.I)


def test_no_doc_cites_an_issue_number():
    """A reader has no issue tracker: the docs say what was done, not which ticket asked for it."""
    docs = [p for p in ROOT.rglob("*.md") if not {".git", ".venv", "tests"} & set(p.relative_to(ROOT).parts)]
    assert ROOT / "README.md" in docs
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)!r}" for p in docs
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in TICKET.finditer(line)]
    assert found == []
