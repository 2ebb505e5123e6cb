"""The documentation site (mkdocs.yml: MkDocs, the Material theme, mkdocstrings): it builds in strict mode (a
broken link, a missing anchor, a page left out of the navigation or an unresolved API reference fails the
build), every page stays under 400 lines, and the reference is generated: the API pages from the docstrings
(each public name of ``latentsift`` and of its subpackages is in the built site, with a docstring), the
command-line pages from the commands' declarations (docs/cli.md and docs/cli-lab.md hold each command's
``--help``). The studies: each page opens with its rows of the findings table, and the guide quotes the
studies' intervals as they are written there.

Rewrite the generated parts (the command-line pages, the API index's table, each study's verdict) after changing
a command, ``latentsift.__all__`` or the findings table: ``.venv/bin/python tests/test_site.py``.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import griffe
import pytest
import typer
from mkdocs.config import load_config

import latentsift
from latentsift.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_LINES = 400
#: the subpackages whose ``__all__`` the API reference renders, one page each (docs/api/<name>.md)
SUBPACKAGES = ["trajectories", "states", "rollout", "bank", "scale", "sift", "cascade", "metrics", "deploy",
               "report", "protocol"]
#: the program's name, as a user types it: the console script of pyproject.toml
PROG, = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
#: the command-line pages: the commands of a team's own runs, then the lab's (the studies, the own policy)
CLI_PAGES = {
    "cli.md": ("The command line: your own runs",
               ["import", "extract", "crossval", "premise", "fit", "filter", "transfer", "explore"]),
    "cli-lab.md": ("The command line: the studies, the cascade, the own policy",
                   ["reproduce", "evaluate", "verify", "bank", "scorer", "rollout", "policy"]),
}


#: the width the generated help is written at (click's formatter; no terminal is asked, so any machine gives the
#: same page)
HELP_WIDTH = 100


def command_help(cmd, path: str, depth: int = 2) -> list[str]:
    """A command's ``--help`` as the command line prints it, under a heading, then each subcommand's."""
    ctx = typer.Context(cmd, info_name=path, max_content_width=HELP_WIDTH, terminal_width=HELP_WIDTH)
    out = [f"{'#' * depth} `{path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    for name in getattr(cmd, "commands", {}):
        out += command_help(cmd.commands[name], f"{path} {name}", depth + 1)
    return out


def cli_page(page: str) -> str:
    """A command-line page: each of its commands' help, generated from the commands' declarations."""
    title, commands = CLI_PAGES[page]
    other = next(p for p in CLI_PAGES if p != page)
    root = typer.main.get_command(app)
    lines = [f"# {title}", "",
             f"Every option of {', '.join(f'`{c}`' for c in commands)}:",
             "each command's `--help`, generated from the commands' declarations (`tests/test_site.py` checks that this",
             f"page is current; `python tests/test_site.py` rewrites it). The other commands: [{other}]({other}); what",
             "each option name means in every command: [cli-vocabulary.md](cli-vocabulary.md).", ""]
    for name in commands:
        lines += command_help(root.commands[name], f"{PROG} {name}")
    return "\n".join(lines).rstrip() + "\n"


def documented_id(package: str, name: str) -> str:
    """The API reference's anchor of ``package.name``: at the package that exports it, or, where a submodule
    has the same name (``latentsift.protocol.crossval``), at the module that defines it."""
    obj = getattr(importlib.import_module(package), name)
    if importlib.util.find_spec(f"{package}.{name}") is not None:
        return f"{obj.__module__}.{name}"
    return f"{package}.{name}"


def subpackage_of(name: str) -> str | None:
    """The public subpackage whose ``__all__`` exports ``latentsift.<name>`` (its page shows it), if any."""
    return next((sub for sub in SUBPACKAGES if name in importlib.import_module(f"latentsift.{sub}").__all__), None)


def reference_id(name: str) -> str:
    """Where the API reference documents ``latentsift.<name>``: the page of the subpackage that exports it, else
    (the errors, ``fuse``) the index page, at the module that defines it."""
    sub = subpackage_of(name)
    return documented_id(f"latentsift.{sub}", name) if sub else f"{getattr(latentsift, name).__module__}.{name}"


def public_refs() -> set[str]:
    """The API reference's anchor of every public name: ``latentsift.__all__`` and each subpackage's ``__all__``."""
    refs = {reference_id(n) for n in latentsift.__all__}
    return refs | {documented_id(f"latentsift.{sub}", n) for sub in SUBPACKAGES
                   for n in importlib.import_module(f"latentsift.{sub}").__all__}


@functools.cache
def package() -> griffe.Module:
    """The package as the API pages see it: griffe's static reading of src/ (mkdocstrings' own loader), with the
    Sphinx "#:" comments of constants read as their docstrings (the griffe_sphinx extension mkdocs.yml names)."""
    return griffe.load("latentsift", search_paths=[str(ROOT / "src")], resolve_aliases=True, resolve_external=False,
                       extensions=griffe.load_extensions("griffe_sphinx"))


def docstring(ref: str) -> str:
    """The docstring the API pages show for ``ref`` (a dotted path from ``latentsift``), "" when it has none."""
    doc = package()[ref.removeprefix("latentsift.")].docstring
    return doc.value.strip() if doc else ""


def first_line(name: str) -> str:
    return docstring(reference_id(name)).splitlines()[0].replace("|", "\\|")


API_HEAD, API_TAIL = "<!-- generated: the top-level names -->", "<!-- end generated -->"


def api_table() -> str:
    """The index page's generated part: the table of ``latentsift.__all__``, then the entries of the names that no
    subpackage page shows."""
    rows = ["| name | what it is (its docstring's first line) |", "| --- | --- |"]
    rows += [f"| [`{n}`][{reference_id(n)}] | {first_line(n)} |" for n in latentsift.__all__]
    own = [reference_id(n) for n in latentsift.__all__ if subpackage_of(n) is None]
    entries = ["", "## Defined outside the subpackages' pages", ""]
    for ref in own:
        entries += [f"::: {ref}", "    options:", "      show_root_heading: true", "      heading_level: 3", ""]
    return "\n".join([API_HEAD, *rows, *entries, API_TAIL])


VERDICT_HEAD, VERDICT_TAIL = "<!-- generated: this study's rows of findings.md -->", "<!-- end generated -->"
STUDIES = DOCS / "studies"


def findings_rows() -> dict[str, list[str]]:
    """findings.md's table rows by the study page they link to (the page's name, before any '#')."""
    rows: dict[str, list[str]] = {}
    for line in (STUDIES / "findings.md").read_text().splitlines():
        m = re.match(r"\| \[[^\]]+\]\(([\w.-]+\.md)(?:#[\w-]+)?\) \|(.*)", line)
        if m:
            rows.setdefault(m.group(1), []).append("|" + m.group(2))
    return rows


def verdict_block(page: str) -> str:
    """A study page's verdict: its rows of the findings table, the one source of these numbers."""
    rows = findings_rows()[page]
    return "\n".join([VERDICT_HEAD, "| data | the comparison | number [95%] | verdict |", "| --- | --- | --- | --- |",
                       *rows, VERDICT_TAIL])


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def test_the_site_builds_in_strict_mode(site):
    """What is tested: mkdocs builds with --strict (every link and anchor between pages resolves, every page of
    docs/ is in the navigation, every cross-reference of the API pages resolves), and every page has its HTML."""
    for page in _pages():
        rel = page.relative_to(DOCS).with_suffix("")
        html = site / (rel.parent if rel.name == "index" else rel) / "index.html"
        assert html.is_file(), f"{page.relative_to(ROOT)} has no page on the site"


def test_strict_mode_fails_on_what_a_reader_would_hit():
    """What is tested: the checks strict mode turns into failures are on: a link to a missing page or heading, a
    page left out of the navigation, a navigation entry without its page."""
    cfg = load_config(str(ROOT / "mkdocs.yml"))   # mkdocs' own reader (the YAML holds a Python tag)
    assert cfg["strict"] is True
    v = cfg["validation"]
    levels = [v["links"]["not_found"], v["links"]["anchors"], v["nav"]["omitted_files"], v["nav"]["not_found"]]
    assert levels == [logging.WARNING] * 4


def test_every_public_name_is_in_the_built_reference(site):
    """What is tested: each name of ``latentsift.__all__`` and of every subpackage's ``__all__`` has its entry
    (an element id, mkdocstrings' anchor) in the built API pages."""
    ids = set()
    for html in (site / "api").rglob("*.html"):
        ids |= set(re.findall(r'id="(latentsift[\w.]*)"', html.read_text()))
    wanted = public_refs()
    assert len(wanted) > 200 and sorted(wanted - ids) == []


def test_every_public_name_has_a_docstring():
    """What is tested: each name of ``latentsift.__all__`` and of every subpackage's ``__all__`` has a docstring
    where the API pages read it (a constant's "#:" comment counts), so its entry is never a bare name."""
    refs = public_refs()
    assert len(refs) > 200 and sorted(r for r in refs if not docstring(r)) == []


def test_no_page_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in [ROOT / "README.md", *_pages()]
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_command_line_pages_are_generated_from_the_commands():
    """What is tested: docs/cli.md and docs/cli-lab.md are what the commands' declarations give (a new option or
    a changed help fails here until the pages are rewritten), and together they hold every command."""
    root = typer.main.get_command(app)
    assert sorted(c for _, cs in CLI_PAGES.values() for c in cs) == sorted(root.commands)
    for page in CLI_PAGES:
        assert (DOCS / page).read_text() == cli_page(page), f"docs/{page} is stale: python tests/test_site.py"
    assert "--target-recall" in (DOCS / "cli.md").read_text() and "{filters}" not in (DOCS / "cli.md").read_text()


def test_the_api_index_lists_every_top_level_name():
    text = (DOCS / "api" / "index.md").read_text()
    assert api_table() in text, "docs/api/index.md is stale: python tests/test_site.py"
    assert all(f"`{n}`" in text for n in latentsift.__all__)


def test_each_study_opens_with_its_verdict_from_the_findings_table():
    """What is tested: each study page that the findings table links to shows, near its top, exactly its rows of
    that table, before any other table (so a number changed in one place and not the other fails here)."""
    rows = findings_rows()
    assert len(rows) >= 8 and sum(map(len, rows.values())) >= 25
    for page in rows:
        text = (STUDIES / page).read_text()
        assert verdict_block(page) in text, f"docs/studies/{page}: its verdict is stale: python tests/test_site.py"
        assert text.index(VERDICT_HEAD) < text.index("\n| "), f"docs/studies/{page}: a table above the verdict"


#: an interval as the docs write it: "+0.058 [-0.004, +0.121]", "29.1% [26.5, 31.5]"
INTERVAL = re.compile(r"[+\-−]?\d[\d.,]*%? \[[+\-−]?\d[\d.,]*%?, [+\-−]?\d[\d.,]*%?\]")
#: guide pages whose intervals are their own run's, not a study's
OWN_NUMBERS = {"quickstart.md": "the small labelled example's run, which the page itself makes"}


def test_the_guide_quotes_the_studies_numbers_as_they_are():
    """What is tested: every interval the README and the guide's pages quote ("+0.058 [-0.004, +0.121]") is
    written the same way on a study's page: a number moved or rerun in the studies and not in the guide fails."""
    studies = " ".join(re.sub(r"\s+", " ", p.read_text()) for p in STUDIES.glob("*.md"))
    quoted = {f"{p.relative_to(ROOT)}: {m}" for p in [ROOT / "README.md", *DOCS.glob("*.md")]
              if p.name not in OWN_NUMBERS for m in INTERVAL.findall(re.sub(r"\s+", " ", p.read_text()))}
    assert len(quoted) >= 2 and sorted(q for q in quoted if q.split(": ", 1)[1] not in studies) == []


def _rewrite() -> None:
    for page in CLI_PAGES:
        (DOCS / page).write_text(cli_page(page))
    index = DOCS / "api" / "index.md"
    text = index.read_text()
    a, b = text.index(API_HEAD), text.index(API_TAIL) + len(API_TAIL)
    index.write_text(text[:a] + api_table() + text[b:])
    for page in findings_rows():
        path = STUDIES / page
        text = path.read_text()
        a, b = text.index(VERDICT_HEAD), text.index(VERDICT_TAIL) + len(VERDICT_TAIL)
        path.write_text(text[:a] + verdict_block(page) + text[b:])


if __name__ == "__main__":
    _rewrite()
