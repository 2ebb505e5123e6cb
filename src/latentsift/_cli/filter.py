"""``latentsift filter``: Stage-1 scores and retained sets for the pools of a JSONL file.

Parsing and printing only: the options are ``latentsift._jobs.filter.FilterOptions`` (declared and checked
there), the work ``filter_to_file``.
"""
from __future__ import annotations

import functools
import shutil
from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from .._jobs.filter import (KEEP_FRAC, MIN_KEEP, TARGET_MIN_KEEP, FilterOptions,
                             calibration_methods, filter_to_file, keep_rules, method_names)
from ._help import listed
from .._jobs.sifter import method_line
from ._options import (CalibrationEpochs, CalibrationMethod, CalibrationStates, Confidence, Seed, StatesDir,
                       command_options)
from ._progress import messages
from ._text import cell, markup

#: The declared defaults (FilterOptions): the command line shows these.
_D = FilterOptions.defaults()


def register(app: typer.Typer) -> None:
    app.command("filter", cls=listed(FilterOptions, filters=method_names, keep_rules=keep_rules,
                                     calibrations=calibration_methods))(filter_cmd)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}" if abs(x) >= 100 else f"{x:.3f}"


def filter_cmd(
    ctx: typer.Context,
    pools: Path = typer.Argument(..., metavar="POOLS", help="Canonical JSONL of the candidate pools."),
    states: StatesDir = _D["states"],
    bank: Optional[Path] = typer.Option(_D["bank"], "--bank", help="BANK_DIR from 'latentsift bank build'."),
    scorer: Optional[Path] = typer.Option(_D["scorer"], "--scorer", help="SCORER_DIR from 'latentsift scorer train'."),
    out: Path = typer.Option(..., "--out", help="FILTER.json to write."),
    method: str = typer.Option(_D["method"], "--method", help="A registered filter: "
                               "{filters} (the first is the paper's; the others are "
                               "rule filters, baselines, unless registered as state filters)."),
    channels: Optional[str] = typer.Option(_D["channels"], "--channels", help="Channels, comma-separated: cot, obs, fn "
                                           "(default: all three)."),
    distance: Optional[str] = typer.Option(_D["distance"], "--distance", help="two-sided (d_neg - d_pos, the "
                                           "default), pos (-d_pos) or neg (d_neg)."),
    weighting: Optional[str] = typer.Option(_D["weighting"], "--weighting", help="Step weights: linear (t, the "
                                            "default) or uniform."),
    distance_only: bool = typer.Option(_D["distance_only"], "--distance-only", help="s = s_dist (no scorer)."),
    learned_only: bool = typer.Option(_D["learned_only"], "--learned-only", help="s = s_lin (banks used for the "
                                      "guards only)."),
    fusion_weight: Optional[float] = typer.Option(_D["fusion_weight"], "--fusion-weight", help="s = w s_dist + "
                                                  "(1 - w) s_lin (default 0.5)."),
    min_keep: Optional[int] = typer.Option(_D["min_keep"], "--min-keep", help="Retain max(MIN_KEEP, floor(FRAC K)) "
                                           f"(default {MIN_KEEP}); with --target-recall: at least this many per "
                                           f"pool (default {TARGET_MIN_KEEP})."),
    frac: Optional[float] = typer.Option(_D["frac"], "--frac", help="Retain max(MIN_KEEP, floor(FRAC K)) "
                                         f"(default {KEEP_FRAC}; the fixed rule's only)."),
    seed: Seed = _D["seed"],
    evidence: int = typer.Option(_D["evidence"], "--evidence", help="Strongest steps reported per channel (0 = none)."),
    instances: Optional[str] = typer.Option(_D["instances"], "--instance-ids", help="Only these instance ids "
                                            "(comma-separated)."),
    show: int = typer.Option(_D["show"], "--show", help="Print the table of at most N pools (the JSON has all)."),
    ray_address: Optional[str] = typer.Option(_D["ray_address"], "--ray", help="Search the bank on Ray actors: local, auto or "
                                      "HOST:PORT (needs the optional extra: pip install ray==2.60.0; same results)."),
    bank_shards: Optional[int] = typer.Option(_D["bank_shards"], "--bank-shards", help="Bank shards on Ray (default "
                                              "2 with --ray)."),
    approx: Optional[str] = typer.Option(_D["approx"], "--approx", help="Approximate FAISS search: ivf or hnsw (off by "
                                         "default; see docs/scale.md for its recall)."),
    sifter: Optional[Path] = typer.Option(_D["sifter"], "--sifter", help="SIFTER_DIR from 'latentsift fit' (replaces "
                                          "--bank/--scorer and the method settings; runs the shift guard)."),
    on_shift: Optional[str] = typer.Option(_D["on_shift"], "--on-shift", help="For a pool unlike the sifter's or "
                                           "bank's trajectories: warn (the default), keep-all (skip Stage 1 for it; "
                                           "the default with --target-recall) or error. A bare --bank records no "
                                           "agents: only its state-space check runs."),
    target_recall: Optional[float] = typer.Option(_D["target_recall"], "--target-recall", help="Keep per pool the "
                                                  "fewest candidates that reach this pool recall R in (0, 1] with the "
                                                  "conformal guarantee (docs/operating.md); needs --calibration."),
    calibration: Optional[Path] = typer.Option(_D["calibration"], "--calibration", help="Labelled pools JSONL for "
                                               "--target-recall: pools the bank has not seen (scored by it), or the "
                                               "bank's own pools (cross-fitted over two repository halves)."),
    operating_point: Optional[Path] = typer.Option(_D["operating_point"], "--operating-point", help="A saved "
                                                   "operating point (SIFTER_DIR/operating_point.json from 'fit "
                                                   "--target-recall'): apply it with --sifter without refitting. "
                                                   "--sifter with --target-recall and no --calibration uses the "
                                                   "sifter's own."),
    max_keep: Optional[int] = typer.Option(_D["max_keep"], "--max-keep", help="With a target recall: keep at most B "
                                           "per pool (the best of those the rule keeps; a capped pool is not "
                                           "guaranteed)."),
    cost: str = typer.Option(_D["cost"], "--cost", help="What the rule saves: calls (candidates kept). tokens is "
                             "refused: no filter input holds the verifier's tokens per candidate."),
    confidence: Confidence = _D["confidence"],
    calibration_states: CalibrationStates = _D["calibration_states"],
    calibration_method: CalibrationMethod = _D["calibration_method"],
    calibration_epochs: CalibrationEpochs = _D["calibration_epochs"],
    keep_rule: Optional[str] = typer.Option(_D["keep_rule"], "--keep-rule", help="Which candidates Stage 1 keeps: a "
                                            "registered keep rule, {keep_rules} (default: the first, the paper's "
                                            "max(MIN_KEEP, floor(FRAC K)), or with --target-recall the second; a "
                                            "recall-targeted rule needs --target-recall R and is fitted on "
                                            "--calibration; another rule is fitted on --calibration when given)."),
    bank_choice: str = typer.Option(_D["bank_choice"], "--bank-choice", help="With --sifter: all (the all-agent "
                                    "bank) or nearest (per pool, the sub-bank of 'fit --per-agent' nearest to its "
                                    "candidates' states; the choice and distances are in the JSON)."),
    on_leak: Optional[str] = typer.Option(_D["on_leak"], "--on-leak", help="For a pool whose instance is in the bank: "
                                          "error (refuse the run), skip (leave that pool out, score the others) "
                                          "or allow (score it). Default: error with --bank (evaluation: that "
                                          "overlap is leakage); allow with --sifter (deployment: a bank that has "
                                          "seen other attempts at the same task is knowledge). Each such pool is "
                                          "named in the output."),
) -> None:
    """Score candidate pools with LatentSift (or a baseline) and write per-candidate results as JSON."""
    # Length: the signature is one typer option per setting; the body builds the settings (checked there,
    # latentsift._jobs.filter.FilterOptions), runs the job and prints (_pool_table). (A note here, not in the
    # docstring: typer shows the whole docstring in the command list, '' included.)
    s = FilterOptions(**command_options(ctx))  # every option checked here, before any file is read
    console = Console(width=shutil.get_terminal_size().columns)   # the tables fit the terminal (or COLUMNS)
    say = functools.partial(console.print, soft_wrap=True)           # a message: one line, never broken
    done = filter_to_file(s, log=say, status=lambda m: messages().status(m))
    show, out = s.show, s.out
    run, warnings, settings, op = done.run, done.warnings, done.settings, done.operating_point
    on_shift, target_recall = done.on_shift, done.target_recall
    left_out = set()
    for res in run.pools[:show]:
        table, dropped = _pool_table(res, settings, console)
        console.print(table)
        left_out |= set(dropped)
    if left_out:
        say(f"(columns {', '.join(sorted(left_out))} left out to fit {console.width} columns: they are in {out})")
    if 0 < show < len(run.pools):
        say(f"... {len(run.pools) - show} more pools in {out}")
    for c in run.extra.get("bank_choice", {}).get("pools", [])[:show]:
        say(f"bank for {markup(c['instance_id'])}: {markup(c['chosen'])} (median nearest-bank distances "
            + ", ".join(f"{markup(k)} {_fmt(v)}" for k, v in c["distances"].items()) + ")")
    config = run.extra.get("configuration", {}).get("config")
    if config is not None:  # a sifter: the method it uses and why
        say(markup(method_line(config)))
    leak = run.extra.get("leak", {})
    for w in leak.get("warnings", []):
        say(f"[yellow]leak ({leak['on_leak']}): {markup(w)}[/yellow]")
    for w in warnings:
        say(f"[yellow]shift ({on_shift}): {markup(w)}[/yellow]")
    shared = run.inputs.get("repos_shared_with_bank")
    if shared:
        say(f"[yellow]note: the bank and the pools share repositories {markup(shared)}; the paper's protocol "
            "keeps them disjoint.[/yellow]")
    if target_recall is not None:
        say(f"target pool recall {target_recall:g} (keep rule {op['rule']}): threshold {_fmt(op['threshold'])} "
            f"({op['threshold_meaning']}; P(resolved) there {_fmt(op['p_threshold'])}), chosen on "
            f"{op['n_calibration_pools']} calibration pools with a resolved candidate "
            f"({op['calibration_pools']['how'].split(':')[0]}); "
            f"{sum(not p['guaranteed'] for p in op['pools'])} pools without the guarantee"
            + "".join(f"; {n} {w}" for w, n in _reasons(op['pools']).items()) + ".")
    if done.keep_rule is not None:
        say(f"keep rule {done.keep_rule['rule']}"
            + (" (fitted on the calibration pools)" if done.keep_rule["calibration_pools"] else ""))
    say(f"{run.method}: {sum(p.n_keep for p in run.pools)} of "
        f"{sum(len(p.candidates) for p in run.pools)} candidates retained over {len(run.pools)} pools. "
        f"Written to {out}.")


def _reasons(rows) -> dict[str, int]:
    """Why pools lack the guarantee: condition -> number of pools."""
    return dict(Counter(w for r in rows for w in r["not_guaranteed"]))


#: The candidate column's least width, the width it is given when the columns are chosen (a longer id folds
#: onto more lines), and a width no table reaches.
_MIN_ID, _FIT_ID, _UNBOUNDED = 16, 24, 10_000


def _pool_table(res, settings: dict, console: Console) -> tuple[Table, list[str]]:
    """One pool's candidates, best first: per-channel q and r, the branch scores, s and kept, as wide as the
    console: where all columns do not fit, the per-channel r, then q, are left out (they are in the JSON; their
    names are returned) and long candidate ids fold."""
    chans = list(settings.get("channels", ())) if res.candidates and res.candidates[0].q is not None else []
    extra = (["s_dist"] if chans else []) + (["q_lin", "s_lin"] if res.candidates and
                                             res.candidates[0].q_lin is not None else [])
    extra += ["raw"] if res.candidates and res.candidates[0].raw is not None else []
    wide = console.options.update_width(_UNBOUNDED)
    for shown in ((("q", "r") if chans else ()), ("q",) if chans else (), ()):
        if console.measure(_table(res, chans, shown, extra, _FIT_ID), options=wide).maximum <= console.width:
            break
    return _table(res, chans, shown, extra), [f"{kind}_{c}" for kind in ("q", "r") if kind not in shown for c in chans]


def _table(res, chans: list[str], shown: tuple[str, ...], extra: list[str], id_width: int | None = None) -> Table:
    t = Table(title=cell(f"{res.instance_id}: keep {res.n_keep} of {len(res.candidates)}"), title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("candidate", overflow="fold", min_width=_MIN_ID, max_width=id_width)
    for kind in shown:
        for c in chans:
            t.add_column(f"{kind}_{c}", justify="right", no_wrap=True)
    for c in extra + ["s", "kept"]:
        t.add_column(c, justify="right", no_wrap=True)
    for c in sorted(res.candidates, key=lambda c: -c.s):
        row = [cell(c.traj_id)] + [_fmt(getattr(c, kind)[ch]) for kind in shown for ch in chans]
        row += [_fmt(getattr(c, k)) for k in extra] + [_fmt(c.s), "yes" if c.retained else ""]
        t.add_row(*row)
    return t
