"""MkDocs hook: a link from a page to a file of the repository outside docs/ (the README, data/, examples/)
works on a forge but has no page on the site. On the site it becomes the link's text and the file's path in
the repository, so that strict mode still fails on every broken link between the pages themselves."""
from __future__ import annotations

import posixpath
import re

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _outside(target: str, page_dir: str) -> str | None:
    """The repository path a relative link reaches when it leaves docs/, else None."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None
    path = posixpath.normpath(posixpath.join("docs", page_dir, target))
    return None if path.startswith("docs/") else path


def on_page_markdown(markdown: str, page, config, files) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)
    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        if not fenced:
            line = LINK.sub(lambda m: (f"{m.group(1)} (`{p}` in the repository)"
                                       if (p := _outside(m.group(2), page_dir)) else m.group(0)), line)
        out.append(line)
    return "\n".join(out)
