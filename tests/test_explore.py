"""The explorer: the site of the tiny end-to-end run driven in headless Chromium.

The browser is Debian's ``chromium`` package driven by Playwright (``playwright install`` downloads
a browser build, which the test machines cannot fetch). Without it these tests FAIL with how to
install it (``make browser``); they are never skipped.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from markupsafe import escape

from latentsift._core.validation import LatentSiftError
from latentsift.report.decision_report import headline
from latentsift.report.explore import Limits, cut, write_run_site, write_site
from latentsift.trajectories.trajectory import load_jsonl

CHROMIUM = Path(os.environ.get("LATENTSIFT_CHROMIUM", "/usr/bin/chromium"))


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[test]' (it is in the test extra).")
    if not CHROMIUM.is_file():
        pytest.fail(f"No Chromium at {CHROMIUM}: install Debian's browser with `make browser` "
                    "(apt-get install -y chromium chromium-driver) or set LATENTSIFT_CHROMIUM to a Chromium "
                    "executable. (`playwright install` is not used: it downloads a browser build.)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.requests: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))

    def open(self, path: Path):
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")
        return self.page


def _column(page, table: str, col: int) -> list[str]:
    return page.eval_on_selector_all(f"{table} tbody tr:not([hidden])",
                                     f"rows => rows.map(r => r.cells[{col}].textContent.trim())")


@pytest.mark.model
def test_site_of_the_tiny_run_in_chromium(browser, tiny_run, tmp_path):  # browser first: fails fast
    s, report = tiny_run["settings"], tiny_run["report"]
    run = Path(s["out"])
    pg = Page(browser)
    shots = tmp_path / "screenshots"
    shots.mkdir()

    # summary: tables with intervals and the three interactive figures
    page = pg.open(report / "index.html")
    assert page.locator("h2", has_text="Oracle retention after Stage 1").count() == 1
    for cid in ("chart-best", "chart-retention", "chart-diff"):
        assert page.evaluate(f"Chart.getChart('{cid}') !== undefined"), cid
    # the page opens as report.md does: its plain sentence, then the verdict (summary.json 'verdict'), before any
    # table or figure
    summary = json.loads((report / "summary.json").read_text())
    assert " ".join(page.locator("#headline").inner_text().split()) == headline(summary)
    assert page.evaluate("document.querySelector('#headline').compareDocumentPosition("
                         "document.querySelector('#verdict')) & Node.DOCUMENT_POSITION_FOLLOWING")
    verdict = summary["verdict"]
    shown = page.locator("#verdict li").all_inner_texts()
    assert [" ".join(x.split()) for x in shown] == [" ".join(v[2:].split()) for v in verdict[1:]]
    assert page.evaluate("document.querySelector('#verdict').compareDocumentPosition("
                         "document.querySelector('h2')) & Node.DOCUMENT_POSITION_FOLLOWING")
    # one colour per filter in every chart (the bar chart of differences shows fewer filters than the lines)
    colours = {cid: page.evaluate(f"Object.fromEntries(Chart.getChart('{cid}').data.datasets.map("
                                  "d => [d.label, d.borderColor]))") for cid in ("chart-best", "chart-retention",
                                                                                 "chart-diff")}
    assert colours["chart-diff"] and all(c for cs in colours.values() for c in cs.values())
    for label, c in colours["chart-diff"].items():
        assert colours["chart-best"][label] == colours["chart-retention"][label] == c, label
    assert len(set(colours["chart-best"].values())) == len(colours["chart-best"])
    # hover values: a point of the retention figure shows its value and interval in the tooltip
    page.locator("#chart-retention").scroll_into_view_if_needed()
    box = page.locator("#chart-retention").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    page.wait_for_function("Chart.getChart('chart-retention').tooltip.getActiveElements().length > 0")
    label = page.evaluate("Chart.getChart('chart-retention').tooltip.body[0].lines[0]")
    assert re.search(r": \d+\.\d% \[\d+\.\d%, \d+\.\d%\]$", label), label
    page.screenshot(path=str(shots / "summary.png"), full_page=True)

    # instances: one row per pool; a click on 'K' ... sorts; the filter box hides rows
    page = pg.open(report / "instances.html")
    trajs = load_jsonl(run / "pools.jsonl")
    insts = sorted({t.instance_id for t in trajs})
    assert sorted(_column(page, "#instances", 0)) == insts
    page.click("#instances th:has-text('repository')")
    repos = _column(page, "#instances", 1)
    assert repos == sorted(repos)
    page.click("#instances th:has-text('repository')")
    assert _column(page, "#instances", 1) == sorted(repos, reverse=True)
    page.fill("#filter", insts[0])
    assert _column(page, "#instances", 0) == [insts[0]]
    page.fill("#filter", "")
    page.screenshot(path=str(shots / "instances.png"), full_page=True)

    # an instance page: the candidate's evidence step, highlighted, with its nearest bank steps' text
    detail = json.loads((run / "stage1" / "latentsift.json").read_text())
    by_id = {t.traj_id: t for t in trajs}
    pool = next(p for p in detail["pools"] if any(c["evidence"] for c in p["candidates"]))
    cand = max((c for c in pool["candidates"] if c["evidence"]), key=lambda c: c["s"])  # not always the top row
    ev = next(e for e in cand["evidence"] if getattr(by_id[e["pos_traj"]].steps[e["pos_step"]], e["channel"]).strip())
    page = pg.open(report / "instances" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', pool['instance_id'])}.html")
    ids = _column(page, "#candidates", 1)
    assert sorted(ids) == sorted(c["traj_id"] for c in pool["candidates"])
    # kept or not by each filter: the columns say what stage1/retained.json says (EF verifier included)
    retained = json.loads((run / "stage1" / "retained.json").read_text())["filters"]
    heads = page.eval_on_selector_all("#candidates thead th", "hs => hs.map(h => h.textContent.trim())")
    for f, label in (("latentsift", "kept: LatentSift (paper)"), ("ef_verifier", "kept: LLM EF verifier (original workflow)")):
        col = _column(page, "#candidates", heads.index(label))
        assert {t for t, k in zip(ids, col) if k.startswith("✓")} == set(retained[f][pool["instance_id"]])
    page.click("#candidates th:has-text('steps')")  # the candidate table sorts too
    steps = [int(x) for x in _column(page, "#candidates", 6)]
    assert steps == sorted(steps)
    section = page.locator(f"section.traj[data-id='{cand['traj_id']}']")
    if not section.is_visible():
        page.check(f"input.view[data-traj='{section.get_attribute('data-traj')}']")
    assert section.is_visible()
    step = section.locator(f".step.ev[id$='-s{ev['step']}']")
    step.scroll_into_view_if_needed()
    assert step.is_visible()
    own = getattr(by_id[cand["traj_id"]].steps[ev["step"]], ev["channel"]).strip()
    bank_text = getattr(by_id[ev["pos_traj"]].steps[ev["pos_step"]], ev["channel"]).strip()
    aside = step.locator(".near.pos", has_text=f"{ev['pos_traj']} step {ev['pos_step']}").first
    assert aside.is_visible()
    shown = " ".join(aside.locator("pre").inner_text().split())
    assert " ".join(bank_text[:80].split()) in shown
    if own:
        assert " ".join(own[:40].split()) in " ".join(step.locator(".body").inner_text().split())
    step.screenshot(path=str(shots / "evidence_step.png"))
    page.screenshot(path=str(shots / "instance.png"), full_page=True)

    # every instance page loads; no console error anywhere; nothing was fetched from the network
    for f in sorted((report / "instances").glob("*.html")):
        pg.open(f)
    assert pg.errors == []
    assert all(u.startswith("file://") for u in pg.requests), [u for u in pg.requests if not u.startswith("file:")]
    for png in ("summary.png", "instances.png", "instance.png", "evidence_step.png"):
        assert (shots / png).stat().st_size > 5_000


@pytest.mark.model
def test_explore_cli_on_a_filter_output(tiny_run, tmp_path):
    """``latentsift filter`` then ``latentsift explore`` on one fold's bank: the evidence and the text of
    its nearest bank step are in the instance page."""
    from typer.testing import CliRunner

    from latentsift.bank.bank import Bank
    from latentsift.cli import app

    s = tiny_run["settings"]
    run = Path(s["out"])
    fold = run / "folds" / "fold-0" / "paper"
    bank = Bank.load(fold / "bank")
    trajs = load_jsonl(run / "pools.jsonl")
    inst = sorted({t.instance_id for t in trajs if t.repo not in set(bank.repo_names_)})
    long = tmp_path / ("a-folder-name-long-enough-to-pass-eighty-columns-" * 4)   # and the tables' 160
    long.mkdir()
    out_json = long / "filter.json"
    r = CliRunner().invoke(app, ["filter", str(run / "pools.jsonl"), "--states", str(run / "states"), "--bank",
                                 str(fold / "bank"), "--scorer", str(fold / "scorer"), "--out", str(out_json),
                                 "--instance-ids", ",".join(inst), "--show", "0"])
    assert r.exit_code == 0, r.output
    # the paths are printed whole, to be copied, however narrow the console (rich breaks lines at its width)
    assert f"Written to {out_json}." in r.output
    site = long / "site"
    r = CliRunner().invoke(app, ["explore", str(out_json), "--pools", str(run / "pools.jsonl"),
                                 "--bank", str(fold / "bank"), "--out", str(site)])
    assert r.exit_code == 0, r.output
    assert f"Explorer: {site / 'index.html'} (" in r.output
    detail = json.loads(out_json.read_text())
    assert {p.stem for p in (site / "instances").glob("*.html")} == {re.sub(r"[^A-Za-z0-9_.-]+", "_", i)
                                                                     for i in inst}
    by_id = {t.traj_id: t for t in trajs}
    p = next(p for p in detail["pools"] if any(c["evidence"] for c in p["candidates"]))
    c = next(c for c in p["candidates"] if c["evidence"])
    e = c["evidence"][0]
    page = (site / "instances" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', p['instance_id'])}.html").read_text()
    assert f"{e['pos_traj']} step {e['pos_step']}" in page and f"{e['neg_traj']} step {e['neg_step']}" in page
    neg_text = getattr(by_id[e["neg_traj"]].steps[e["neg_step"]], e["channel"])
    assert str(escape(neg_text[:Limits().bank]))[:200] in page
    # a file that is not a filter output: an error the user can act on
    r = CliRunner().invoke(app, ["explore", str(run / "stage1" / "retained.json"), "--pools",
                                 str(run / "pools.jsonl"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "is not a 'latentsift filter' output" in r.output


@pytest.mark.model
def test_long_texts_are_cut_with_a_visible_mark_and_sizes_stay_small(tiny_run, tmp_path):
    s, report = tiny_run["settings"], tiny_run["report"]
    run = Path(s["out"])
    trajs = load_jsonl(run / "pools.jsonl")
    longest = max((st.obs for t in trajs for st in t.steps), key=len)
    assert len(longest) > 300
    small = Limits(span=100, traj=1000, tail_span=20, bank=50, prompt=50)
    site = write_site(tmp_path / "small", trajs, summary=json.loads((report / "summary.json").read_text()),
                      limits=small).parent
    pages = "".join(p.read_text() for p in (site / "instances").glob("*.html"))
    assert f"[… {len(longest) - 100} more characters]" in pages or f"[… {len(longest) - 20} more characters]" in pages
    assert str(escape(longest[100:400])) not in pages  # the cut part is really gone

    def size(d):
        return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and p.suffix == ".html")

    full = size(report / "instances")
    assert size(site / "instances") < full
    # the tiny run's whole explorer (4 pools of 6): well under the 25 MB of the default run's budget
    site_bytes = sum(p.stat().st_size for n in ("index.html", "instances.html", "instances", "static")
                     for p in ([report / n] if (report / n).is_file() else (report / n).rglob("*")) if p.is_file())
    assert site_bytes < 3_000_000
    assert cut("abcdef", 4) == {"text": "abcd", "cut": 2} and cut(None, 4) == {"text": "", "cut": 0}


def test_an_unfinished_run_folder_says_what_is_missing(tmp_path):
    with pytest.raises(LatentSiftError, match="is not a finished reproduce run"):
        write_run_site(tmp_path)
