"""MkDocs hook: the pages are written for a forge (GitHub-flavoured Markdown); two habits of that Markdown read
differently in the site's Python-Markdown, and are bridged here, at build time, without touching the pages.

- A link to a file of the repository outside docs/ (the README, data/, examples/) works on a forge but has no
  page on the site: on the site it becomes the link's text and the file's path in the repository, so that
  strict mode still fails on every broken link between the pages themselves.
- A list that starts right under a paragraph line is a list on a forge; Python-Markdown needs a blank line
  before it, so one is added.
"""
from __future__ import annotations

import posixpath
import re

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")


def _outside(target: str, page_dir: str) -> str | None:
    """The repository path a relative link reaches when it leaves docs/, else None."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None
    path = posixpath.normpath(posixpath.join("docs", page_dir, target))
    return None if path.startswith("docs/") else path


def _paragraph(line: str) -> bool:
    """A line of running text (not blank, not a list item, a table row, a heading or an indented line)."""
    return bool(line.strip()) and not ITEM.match(line) and not line.startswith((" ", "\t", "|", "#", ">", "<"))


def on_page_markdown(markdown: str, page, config, files) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)
    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            line = LINK.sub(lambda m: (f"{m.group(1)} (`{p}` in the repository)"
                                       if (p := _outside(m.group(2), page_dir)) else m.group(0)), line)
            if ITEM.match(line) and out and _paragraph(out[-1]):
                out.append("")
        out.append(line)
    return "\n".join(out)
