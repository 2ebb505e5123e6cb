"""The documentation's code imports what the package has: every ``from latentsift... import ...`` in a
Python block of README.md and docs/*.md names a module and names that exist (so a moved module or a
renamed function cannot leave the docs behind)."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _imports() -> list[tuple[str, str, str]]:
    """(doc, module, name) for each name imported from the package in a Python block."""
    out = []
    for doc in DOCS:
        for block in BLOCK.findall(doc.read_text()):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "latentsift":
                    out += [(doc.name, node.module, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    out += [(doc.name, a.name, "") for a in node.names if a.name.split(".")[0] == "latentsift"]
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
    """Each [text](file.md#anchor) of README.md and docs/*.md names a file and a heading that exist."""
    broken = []
    for doc in DOCS:
        for target, anchor in LINK.findall(doc.read_text()):
            if not target and not anchor:
                continue
            path = (doc.parent / target).resolve() if target else doc
            if not path.is_file():
                broken.append(f"{doc.name}: {target}")
            elif anchor and anchor[1:] not in _slugs(path):
                broken.append(f"{doc.name}: {target}{anchor}")
    assert broken == []
