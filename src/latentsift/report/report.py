"""Markdown report from an evaluation summary (pure: data in, files out).

``write_report(summary, out_dir)`` writes, only into ``out_dir``:

- ``summary.json``: the summary (every number the report prints is read from it);
- ``ledger.jsonl``: per (instance, K, filter) means over draws, when the summary carries them;
- ``report.md``: one plain sentence (does a state score beat the length rules here, what it saves at
  the stated recall: ``decision_report.headline``), the verdict of a protocol run (at most 12 lines), the run's
  settings (a name | value table; the folds in a folded section), the paper's tables (main result,
  Best@K by K, oracle retention, token ledger and savings, ablations), diagnostics, and the
  sections of a protocol run (selection, agent transfer, shift guard, the comparisons that decide,
  single-agent pools, pruning);
- the PNG figures of :mod:`latentsift.report.figures`.

``write_report`` accepts a :class:`~latentsift.metrics.evaluate.Summary` or the summary.json dict, so a
saved summary renders to the same report.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._core.io import atomic_write_text
from ..metrics.evaluate import RANDOM_PICK
from ._format import _ci_pct, _ks, _ktok, _name, _pct, _table
from .decision_report import decision_markdown, headline, verdict_markdown
from .figures import write_figures
from .premise_report import premise_markdown
from .sections import (_agent_transfer_markdown, _operating_markdown, _pruning_markdown, _run_markdown,
                       _selection_markdown, _shift_guard_markdown)


def _data(summary: Any) -> tuple[dict, list]:
    if hasattr(summary, "data"):
        return json.loads(summary.to_json()), list(getattr(summary, "ledger", []))
    return json.loads(json.dumps(summary)), []


def write_report(summary: Any, out_dir: str | Path) -> dict[str, Path]:
    """Write ledger.jsonl (if any), the figures, report.md and, LAST, summary.json into ``out_dir``.

    summary.json marks a finished report: an older one is removed first and the new one written only
    after everything else, so a crash never leaves a summary that reads as finished. Returns the
    written paths by name. Nothing is written outside ``out_dir``.
    """
    data, ledger = _data(summary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    written: dict[str, Path] = {"summary.json": out / "summary.json"}
    if ledger:
        atomic_write_text(out / "ledger.jsonl", "".join(json.dumps(r) + "\n" for r in ledger))
        written["ledger.jsonl"] = out / "ledger.jsonl"
    figs = write_figures(data, out)
    written.update(figs)
    atomic_write_text(out / "report.md", render_markdown(data, figures=[p.name for p in figs.values()]))
    written["report.md"] = out / "report.md"
    atomic_write_text(out / "summary.json", text)
    return written


# ----------------------------------------------------------------------------- markdown

def render_markdown(data: dict, figures: list[str] | None = None) -> str:
    """The report text; every number comes from ``data`` (summary.json). The cascade's own tables
    come first (``_settings_markdown`` .. ``_diagnostics_markdown``), the protocol's sections after."""
    lines = ["# LatentSift evaluation report", ""]
    first = headline(data)  # one plain sentence: do state scores beat length here, what they save at the target
    lines += [first, ""] if first else []
    lines += verdict_markdown(data)  # at most 12 lines: the numbers of that sentence, the run's settings below
    lines += premise_markdown(data)  # the premise test, when the run asked for it (crossval premise=True)
    lines += _settings_markdown(data)
    lines += _best_markdown(data)
    lines += _retention_markdown(data)
    lines += _agent_transfer_markdown(data)
    lines += _shift_guard_markdown(data)
    lines += _tokens_markdown(data)
    lines += _ablations_markdown(data)
    lines += _diagnostics_markdown(data)
    if data.get("selection"):
        lines += _selection_markdown(data)
    lines += decision_markdown(data)  # the comparisons that decide, the single-agent pools
    if data.get("pruning"):
        lines += _pruning_markdown(data["pruning"])  # early pruning
    if data.get("operating_points"):
        lines += _operating_markdown(data)  # recall-targeted retention (protocol.operating)
    if figures:
        lines += ["## Figures", ""]
        lines += [f"![{f}]({f})" for f in figures] + [""]
    return "\n".join(lines)


def _settings_markdown(data: dict) -> list[str]:
    """The run's settings, the pools and how each K was drawn."""
    lines: list[str] = []
    s, pools = data["settings"], data["pools"]
    ks = _ks(data)
    ref = data["tokens"].get("reference")
    lines += [f"Settings: {s['n_draws']} seeded draws per instance and K (seed {s['seed']}; all subsets "
              f"enumerated when C(n, K) <= {s['n_draws']}: {'on' if s['exact'] else 'off'}), "
              f"Stage 1 keeps max({s['min_keep']}, floor({s['keep_frac']} K)), ties after Stage 4: "
              f"`{s['tie']}`, missing Stage-2/3 values: `{s['missing']}`, stop when one candidate is left: "
              f"{s['stop_when_single']}. Intervals: {int(round(100 * s['ci_level']))}% bootstrap percentile "
              f"intervals over instances ({s['n_boot']} resamples). Reference workflow for savings: "
              f"`{ref}`.", ""]
    if s.get("meta"):
        lines += _run_markdown(s["meta"])
    lines += ["## Pools", ""]
    sizes = ", ".join(f"{c} pools of {n}" for n, c in pools["pool_sizes"].items())
    lines += [f"{pools['n_instances']} instances, {pools['n_candidates']} candidates ({sizes}); "
              f"{pools['n_resolved_candidates']} resolved candidates; resolved by at least one candidate: "
              f"{pools['n_resolved_any']}, by all: {pools['n_resolved_all']}, mixed: {pools['n_mixed']}. "
              f"Candidates with a regression count: {pools['n_with_regression']}; with a generated-test "
              f"score: {pools['n_with_gen_test']}; pools with a test-generation cost: "
              f"{pools['n_pools_with_testgen_cost']}.", ""]
    draws = pools["draws"]
    lines += [_table(["K"] + ks,
                     [["instances"] + [str(pools["n_instances_by_k"][k]) for k in ks],
                      ["enumerated exactly"] + [str(draws[k]["exact"]) for k in ks],
                      ["sampled (seeded draws)"] + [str(draws[k]["sampled"]) for k in ks],
                      ["cascade runs per filter"] + [str(draws[k]["n_draws"]) for k in ks]]), ""]
    return lines


def _best_markdown(data: dict) -> list[str]:
    """Hybrid Best@K and tokens at the ablations' K (paper Table 1), then Best@K by K (Table A.4)."""
    head, ks, kmax = data["settings"]["headline"], _ks(data), str(data["settings"]["ablation_k"])
    tok, best = data["tokens"]["workflows"], data["best_at_k"]
    lines: list[str] = []
    # main table (paper Table 1 layout)
    lines += [f"## Hybrid Best@{kmax} and verification tokens", "",
              f"Best@{kmax} in %, [95% interval]; tokens per instance in thousands (EF: EF-verifier "
              f"calls actually made; Total: EF + test generation when Stage 3 is reached).", ""]
    rows = []
    for f in head:
        t = tok[f][kmax]
        rows.append([_name(data, f), _ci_pct(best["filters"][f][kmax]), _ktok(t["ef"]["mean"]),
                     _ktok(t["total"]["mean"]), f"{t['ef_calls']:.2f}", _pct(t["stage3_rate"]["mean"], 1)])
    lines += [_table(["Stage-1 filter", f"Best@{kmax}", "EF (K)", "Total (K)", "EF calls", "Stage 3 reached (%)"],
                     rows), ""]

    # Best@K by K (paper Table A.4)
    lines += ["## Best@K by K", "", "Hybrid Best@K (%) after the four stages; Oracle Pass@K = the draw holds a "
              "resolved candidate; Random = mean label of the draw.", ""]
    rows = [[_name(data, f)] + [_pct(best["filters"][f][k]["mean"]) for k in ks] for f in head]
    rows += [["Oracle Pass@K"] + [_pct(best["oracle_pass"][k]["mean"]) for k in ks],
             ["Random selection"] + [_pct(best[RANDOM_PICK][k]["mean"]) for k in ks]]
    lines += [_table(["Stage-1 filter"] + [f"K={k}" for k in ks], rows), ""]
    lines += ["Intervals:", ""]
    rows = [[_name(data, f)] + [_ci_pct(best["filters"][f][k]) for k in ks] for f in head]
    rows += [["Oracle Pass@K"] + [_ci_pct(best["oracle_pass"][k]) for k in ks],
             ["Random selection"] + [_ci_pct(best[RANDOM_PICK][k]) for k in ks]]
    lines += [_table(["Stage-1 filter"] + [f"K={k}" for k in ks], rows), ""]
    return lines


def _retention_markdown(data: dict) -> list[str]:
    """Oracle retention after Stage 1 (paper Table 2)."""
    head, ks = data["settings"]["headline"], _ks(data)
    lines: list[str] = []
    ret = data["retention"]
    lines += ["## Oracle retention after Stage 1", "",
              "Among draws whose K candidates hold a resolved one, the share whose retained set still holds "
              "one (%).", ""]
    rows = [[_name(data, f)] + [_ci_pct(ret[f][k]) for k in ks] for f in head if f in ret]
    lines += [_table(["Stage-1 filter"] + [f"K={k}" for k in ks], rows), ""]
    return lines


def _tokens_markdown(data: dict) -> list[str]:
    """Verification tokens by K and the savings against the reference workflow."""
    head, ks, ref = data["settings"]["headline"], _ks(data), data["tokens"].get("reference")
    tok = data["tokens"]["workflows"]
    lines: list[str] = []
    lines += ["## Verification tokens by K", "", "Per instance, in thousands: EF / total.", ""]
    rows = [[_name(data, f)] + [f"{_ktok(tok[f][k]['ef']['mean'])} / {_ktok(tok[f][k]['total']['mean'])}"
                                for k in ks] for f in head]
    lines += [_table(["Stage-1 filter"] + [f"K={k}" for k in ks], rows), ""]
    sav = data["tokens"].get("savings", {})
    if ref is not None and sav:
        lines += [f"Tokens saved against `{_name(data, ref)}` (%; EF / total, with total's interval):", ""]
        rows = [[_name(data, f)] + [f"{_pct(sav[f][k]['ef']['mean'])} / {_ci_pct(sav[f][k]['total'])}"
                                    for k in ks] for f in head if f in sav]
        lines += [_table(["Stage-1 filter"] + [f"K={k}" for k in ks], rows), ""]
    return lines


def _ablations_markdown(data: dict) -> list[str]:
    """One table per ablation, at its K."""
    lines: list[str] = []
    if data.get("ablations"):
        lines += ["## Ablations", ""]
        for tname, t in data["ablations"].items():
            k = str(t["k"])
            lines += [f"### {t['title']}", ""]
            if t.get("layout") == "columns":
                lines += [_table(["", *[r["label"] for r in t["rows"]]],
                                 [[f"Best@{k}", *[_pct(r["best_at_k"]["mean"]) for r in t["rows"]]],
                                  ["Ret.", *[_pct(r["retention"]["mean"]) for r in t["rows"]]]],
                                 ["l"] + ["r"] * len(t["rows"])), ""]
            else:
                lines += [_table(["Stage-1 rule", f"Best@{k}", "Ret.", f"Best@{k} interval"],
                                 [[r["label"], _pct(r["best_at_k"]["mean"]), _pct(r["retention"]["mean"]),
                                   _ci_pct(r["best_at_k"])] for r in t["rows"]]), ""]
    return lines


def _diagnostics_markdown(data: dict) -> list[str]:
    """The cascade's rules that fired, the EF verifiers' failures and the score distributions."""
    s, kmax = data["settings"], str(data["settings"]["ablation_k"])
    lines: list[str] = []
    diag = data.get("diagnostics", {})
    lines += ["## Diagnostics", "", f"Rules that fired at K={kmax} (counts of cascade runs):", ""]
    rows = []
    for f in s["filters"]:
        r = diag.get("rules", {}).get(f, {}).get(kmax)
        if not r:
            continue
        fmt = lambda c: ", ".join(f"{k}: {v}" for k, v in sorted(c.items())) or "-"
        rows.append([_name(data, f), fmt(r["stage2"]), fmt(r["stage3"]), fmt(r["stage4"]),
                     str(diag.get("ef_failed_calls", {}).get(f, {}).get(kmax, 0))])
    lines += [_table(["Stage-1 filter", "Stage 2", "Stage 3", "Stage 4", "failed EF calls charged"], rows,
                     ["l", "l", "l", "l", "r"]), ""]
    fv = diag.get("final_verifier")
    for label, d in ([("Final EF verifier", fv)] if fv else []) + [
            (f"EF filter `{n}`", d) for n, d in diag.get("ef_filters", {}).items()]:
        lines += [f"{label}: {d['n_results']} results, {d['n_failed']} failures (no score), "
                  f"{d['n_condensed']} condensed prompts ({d.get('n_patch_cut', 0)} with the final patch cut "
                  f"to fit), mean tokens per call "
                  f"{'n/a' if d['mean_tokens'] is None else round(d['mean_tokens'], 1)}."
                  + (f" Failed: {', '.join(d['failed'])}." if d["failed"] else ""), ""]
    dist = data.get("distributions") or {}
    if dist.get("panels"):
        lines += [f"Score distributions over {dist['n_instances']} instances:", ""]
        rows = [[p, str(len(v["resolved"])), str(len(v["unresolved"])),
                 "n/a" if v["mean_resolved"] is None else f"{v['mean_resolved']:.4f}",
                 "n/a" if v["mean_unresolved"] is None else f"{v['mean_unresolved']:.4f}", str(v["n_missing"])]
                for p, v in dist["panels"].items()]
        lines += [_table(["panel", "resolved", "unresolved", "mean (resolved)", "mean (unresolved)", "missing"],
                         rows), ""]
    return lines
