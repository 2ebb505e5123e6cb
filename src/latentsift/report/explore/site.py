"""Write the explorer: static HTML pages (jinja2 templates) and the vendored scripts they use.

``write_site`` is the general entry (any trajectories + filter output); ``write_run_site`` reads a
``reproduce`` run folder; ``save_stage1`` is what ``reproduce`` calls to keep the per-candidate
Stage-1 results (scores, evidence, retained sets) that the explorer shows.

The site opens from disk: every page's data is written into the page; scripts are package data
(static/, see static/VENDORED.md); nothing is fetched from the network.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..._core.outputs import SITE_MANIFEST
from ..._core.io import atomic_write_json, read_json
from ..._core.manifests import SiteManifest, check_manifest
from ..._core.validation import LatentSiftError
from ...cascade.cascade import stage1_retain
from ...sift.sift import FilterRun, LatentSift, read_filter_output
from ...trajectories.trajectory import Trajectory, load_jsonl
from .data import RETAINED_FORMAT, Limits, pool_pages, summary_charts, summary_tables, summary_verdict

STATIC = ("chart.umd.min.js", "tablesort.min.js", "tablesort.number.min.js", "explore.js", "explore.css",
          "LICENSE-chart.js.md", "LICENSE-tablesort.txt", "VENDORED.md")


def _env():
    import jinja2
    return jinja2.Environment(loader=jinja2.PackageLoader("latentsift.report.explore", "templates"),
                              autoescape=True, trim_blocks=True, lstrip_blocks=True,
                              undefined=jinja2.StrictUndefined)


def _fmt(x: Any, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def unique_slugs(pages: list[dict]) -> None:
    """Make every page's file name unique, also on case-insensitive file systems: two ids that clean
    to the same name (``proj/x-1``, ``proj_x-1``) each get a short hash of their id appended."""
    seen: dict[str, int] = {}
    for p in pages:
        seen[p["slug"].lower()] = seen.get(p["slug"].lower(), 0) + 1
    for p in pages:
        if seen[p["slug"].lower()] > 1:
            p["slug"] = f"{p['slug']}-{hashlib.sha256(p['instance_id'].encode()).hexdigest()[:8]}"


def _site_files(out: Path) -> list[str]:
    """The files an earlier run of the explorer wrote into ``out`` (its manifest), else []."""
    path = out / SITE_MANIFEST
    if not path.is_file():
        return []
    files = check_manifest(read_json(path), SiteManifest, path, "delete it and write the site again").get("files", [])
    return [f for f in files if ".." not in Path(f).parts and not Path(f).is_absolute()]


def write_site(out_dir: str | Path, trajectories: Sequence[Trajectory], *, detail: Mapping[str, Any] | None = None,
               kept: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
               bank_trajectories: Sequence[Trajectory] | Mapping[str, Trajectory] = (),
               summary: Mapping[str, Any] | None = None, names: Mapping[str, str] | None = None,
               title: str = "LatentSift explorer", info: Mapping[str, Any] | None = None,
               limits: Limits = Limits()) -> Path:
    """Write index.html (summary), instances.html and instances/<id>.html into ``out_dir``.

    ``detail``: a filter output (``FilterRun.to_dict()``) whose scores and evidence are shown;
    ``kept``: filter -> instance -> retained traj_ids (defaults to ``detail``'s retained sets);
    ``bank_trajectories``: where the text of evidence's nearest bank steps is looked up;
    ``summary``: summary.json of an evaluation (tables and figures on index.html).
    Returns the path of index.html. Pages are written to a temporary folder then moved in place.
    """
    if not trajectories:
        raise LatentSiftError("The explorer needs at least one trajectory (the pools were empty).")
    names = dict(names or (summary or {}).get("settings", {}).get("names", {}))
    if kept is None:
        kept = {}
        if detail:
            kept = {detail.get("method", "filter"): {p["instance_id"]: p["retained"] for p in detail["pools"]}}
    bank = bank_trajectories if isinstance(bank_trajectories, Mapping) else {t.traj_id: t for t in bank_trajectories}
    bank = {t.traj_id: t for t in trajectories} | dict(bank)
    pages = pool_pages(trajectories, detail, kept, bank, limits)
    unique_slugs(pages)
    # filter columns shown: the summary's headline filters when there is one, else every filter given
    shown = [f for f in ((summary or {}).get("settings", {}).get("headline") or kept) if f in kept]
    out = Path(out_dir)
    tmp = out.with_name(out.name + f".tmp-explore{os.getpid()}")
    try:
        _render(tmp, pages, summary, detail, info, names, shown, title, limits)
        _swap_in(tmp, out)
    except OSError as e:
        if e.filename is None:  # a failed write (a full disk): name the site being written
            raise type(e)(e.errno, e.strerror, str(out)) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "index.html"


def _render(tmp: Path, pages, summary, detail, info, names, shown, title, limits) -> None:
    (tmp / "instances").mkdir(parents=True)
    (tmp / "static").mkdir()
    static = resources.files("latentsift.report.explore") / "static"
    for f in STATIC:
        (tmp / "static" / f).write_bytes((static / f).read_bytes())
    env = _env()
    env.filters["fmt"] = _fmt
    env.filters["pct"] = _pct
    common = {"title": title, "names": names, "shown": shown, "detail_method": (detail or {}).get("method"),
              "limits": limits}
    n_cands = sum(p["k"] for p in pages)
    ctx = common | {
        "root": "", "info": dict(info or {}), "n_instances": len(pages), "n_candidates": n_cands,
        "n_resolved_any": sum(p["n_resolved"] > 0 for p in pages),
        "verdict": summary_verdict(summary) if summary else None,
        "tables": summary_tables(summary) if summary else [],
        "charts": summary_charts(summary) if summary else None,
        "filter_settings": (detail or {}).get("settings"),
    }
    (tmp / "index.html").write_text(env.get_template("summary.html.j2").render(**ctx), encoding="utf-8")
    (tmp / "instances.html").write_text(env.get_template("instances.html.j2").render(
        **common, root="", pages=pages), encoding="utf-8")
    tpl = env.get_template("instance.html.j2")
    for i, p in enumerate(pages):
        prev = pages[i - 1]["slug"] if i else None
        nxt = pages[i + 1]["slug"] if i + 1 < len(pages) else None
        (tmp / "instances" / f"{p['slug']}.html").write_text(
            tpl.render(**common, root="../", p=p, prev=prev, next=nxt), encoding="utf-8")


def _swap_in(tmp: Path, out: Path) -> None:
    """Move the complete new site into ``out`` file by file and delete only the files an earlier run
    listed in its manifest (``SITE_MANIFEST``): anything else in ``out`` (reproduce's report beside
    it, a user's files) is never touched."""
    new = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    old = _site_files(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / SITE_MANIFEST, {"files": sorted(set(old) | set(new))})  # a kill leaves a full list
    for rel in new:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, out / rel)
    for rel in sorted(set(old) - set(new)):
        (out / rel).unlink(missing_ok=True)
    for d in ("instances", "static"):
        if (out / d).is_dir() and not any((out / d).iterdir()):
            (out / d).rmdir()
    atomic_write_json(out / SITE_MANIFEST, {"files": new})


# ------------------------------------------------------------------------------- reproduce runs
def save_stage1(draw_scorers: Mapping[str, Any], out_dir: str | Path, *, detail: str = LatentSift.name,
                tables: Mapping[str, Mapping[str, float | None]] | None = None, seed: int = 0,
                inputs: Mapping[str, Any] | None = None, fingerprint: Mapping | None = None) -> dict[str, Path]:
    """Keep the per-candidate Stage-1 results of a reproduce run (whole pools, not draws).

    ``draw_scorers``: name -> object with ``table`` {instance: (filter, prepared)} (reproduce's
    fold-wise filters); ``tables``: further filters as traj_id -> score (e.g. the EF verifier; None =
    failed, ranks last), retained by the cascade's Stage-1 rule with ``seed``. Writes ``<detail>.json``
    (the ``latentsift filter`` output format: s, ranks, evidence per candidate) and ``retained.json``
    (every filter's retained set per instance).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    retained: dict[str, dict[str, list[str]]] = {}
    pools: dict[str, list[str]] = {}
    for name, ds in draw_scorers.items():
        retained[name] = {i: f.retained_subset(p, p.traj_ids) for i, (f, p) in sorted(ds.table.items())}
        pools |= {i: list(p.traj_ids) for i, (f, p) in ds.table.items()}
    for name, sc in (tables or {}).items():
        retained[name] = {i: sorted(stage1_retain(ids, [sc.get(t) for t in ids], seed=seed))
                          for i, ids in sorted(pools.items())}
    atomic_write_json(out / "retained.json", {"format": RETAINED_FORMAT, "version": 1, "filters": retained})
    written["retained.json"] = out / "retained.json"
    if detail in draw_scorers:
        table = draw_scorers[detail].table
        results = [f._result(p) for i, (f, p) in sorted(table.items())]
        first = next(iter(table.values()))[0]
        run = FilterRun(method=first.name, settings=first.get_params(), inputs=dict(inputs or {}),
                        fingerprint=dict(fingerprint) if fingerprint else None, pools=results)
        run.save(out / f"{detail}.json")
        written[f"{detail}.json"] = out / f"{detail}.json"
    return written


def write_run_site(run_dir: str | Path, out_dir: str | Path | None = None, *, pools: str | Path | None = None,
                   limits: Limits = Limits()) -> Path:
    """The explorer of a reproduce or crossval run folder (stage1/, report/summary.json) into
    ``out_dir`` (default: RUN/report); ``pools``: the candidate pools (default RUN/pools.jsonl).
    Returns index.html."""
    run = Path(run_dir)
    pools = Path(pools) if pools is not None else run / "pools.jsonl"
    need = [pools, run / "stage1" / "retained.json", run / "report" / "summary.json"]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise LatentSiftError(f"{run} is not a finished reproduce run with Stage-1 results: missing {missing}. "
                              "Run 'latentsift reproduce' (it writes them).")
    trajs = load_jsonl(pools)
    detail_path = run / "stage1" / "latentsift.json"
    detail = read_filter_output(detail_path) if detail_path.is_file() else None
    kept = read_json(run / "stage1" / "retained.json")["filters"]
    summary = read_json(run / "report" / "summary.json")
    return write_site(out_dir or run / "report", trajs, detail=detail, kept=kept, summary=summary,
                      title=f"LatentSift explorer · run {run.resolve().name}", limits=limits,
                      info={"run folder": str(run.resolve()), "report": "report.md"})


def write_filter_site(filter_json: str | Path, pools: str | Path, out_dir: str | Path, *,
                      bank_dir: str | Path | None = None, limits: Limits = Limits()) -> Path:
    """``latentsift explore``: the explorer of a filter output over its pools file.

    The text of evidence's nearest bank steps comes from the bank's own pools file (its manifest's
    ``source.pools``, from ``bank_dir`` or the filter output's ``inputs.bank_dir``) when it exists,
    else from ``pools``.
    """
    fpath = Path(filter_json)
    if not fpath.is_file():
        raise LatentSiftError(f"The filter output {str(fpath)!r} does not exist (write it with 'latentsift filter').")
    detail = read_filter_output(fpath)
    every = load_jsonl(pools)
    inst = {p["instance_id"] for p in detail["pools"]}
    if not inst:
        leak = detail.get("leak") or {}
        why = (f": the filter left out every pool ({len(leak['warnings'])} with --on-leak {leak.get('on_leak')}, "
               "their instances are in the bank)" if leak.get("warnings") else "")
        raise LatentSiftError(f"{fpath} holds no scored pool{why}; there is nothing to explore. Score pools "
                              "whose instances the bank does not hold, or pass --on-leak allow to 'filter'.")
    trajs = [t for t in every if t.instance_id in inst]
    if not trajs:
        raise LatentSiftError(f"{pools} holds none of the {len(inst)} pools of {fpath}: pass the pools file "
                              "the filter was run on.")
    bank: dict[str, Trajectory] = {t.traj_id: t for t in every}  # a bank built from the same file
    bdir = bank_dir or (detail.get("inputs") or {}).get("bank_dir")
    if bdir is not None:
        man = Path(bdir) / "manifest.json"
        if not man.is_file():
            raise LatentSiftError(f"The bank folder {str(bdir)!r} has no manifest.json.")
        src = (read_json(man).get("source") or {}).get("pools")
        if src and Path(src).is_file():
            bank |= {t.traj_id: t for t in load_jsonl(src)}
    info = {"filter output": str(fpath.resolve()), "pools": str(Path(pools).resolve()),
            "bank": None if bdir is None else str(Path(bdir).resolve())}
    return write_site(out_dir, trajs, detail=detail, bank_trajectories=bank,
                      title=f"LatentSift explorer: {fpath.name}", info=info, limits=limits)
