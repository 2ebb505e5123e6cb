"""``latentsift filter``: Stage-1 scores and retained sets for the pools of a JSONL file.

Parsing and printing only; the logic is ``latentsift.sift.run_filter``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._guard import check_output
from .._validation import LatentSiftError


def register(app: typer.Typer) -> None:
    app.command("filter")(filter_cmd)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}" if abs(x) >= 100 else f"{x:.3f}"


def filter_cmd(
    pools: Path = typer.Argument(..., help="Canonical JSONL of the candidate pools."),
    states: Optional[Path] = typer.Option(None, "--states", help="STATES_DIR holding the candidates' states."),
    bank: Optional[Path] = typer.Option(None, "--bank", help="BANK_DIR from 'latentsift bank build'."),
    scorer: Optional[Path] = typer.Option(None, "--scorer", help="SCORER_DIR from 'latentsift scorer train'."),
    out: Path = typer.Option(..., "--out", help="FILTER.json to write."),
    method: str = typer.Option("latentsift", "--method", help="latentsift, or a baseline: random, "
                               "shortest-tokens, shortest-chars, fewest-steps."),
    channels: str = typer.Option("cot,obs,fn", "--channels", help="Channel subset (s_dist = min rank over it)."),
    distance: str = typer.Option("two-sided", "--distance", help="two-sided (d_neg - d_pos), pos (-d_pos) or "
                                 "neg (d_neg)."),
    weighting: str = typer.Option("linear", "--weighting", help="Step weights: linear (t) or uniform."),
    distance_only: bool = typer.Option(False, "--distance-only", help="s = s_dist (no scorer)."),
    learned_only: bool = typer.Option(False, "--learned-only", help="s = s_lin (banks used for the guards only)."),
    fusion_weight: float = typer.Option(0.5, "--fusion-weight", help="s = w s_dist + (1 - w) s_lin."),
    min_keep: int = typer.Option(3, "--min-keep", help="Retain max(min_keep, floor(frac K))."),
    frac: float = typer.Option(0.5, "--frac", help="Retain max(min_keep, floor(frac K))."),
    seed: int = typer.Option(0, "--seed", help="Tie rule at the cut (and the random baseline)."),
    evidence: int = typer.Option(3, "--evidence", help="Strongest steps reported per channel (0 = none)."),
    instances: Optional[str] = typer.Option(None, "--instances", help="Only these instance ids (comma-separated)."),
    show: int = typer.Option(10, "--show", help="Print the table of at most N pools (the JSON has all)."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Search the bank on Ray actors: local, auto or "
                                      "HOST:PORT (needs the optional extra: pip install ray==2.60.0; same results)."),
    bank_shards: Optional[int] = typer.Option(None, "--bank-shards", help="Bank shards on Ray (default 2 with --ray)."),
    approx: Optional[str] = typer.Option(None, "--approx", help="Approximate FAISS search: ivf or hnsw (off by "
                                         "default; see docs/scale.md for its recall)."),
    sifter: Optional[Path] = typer.Option(None, "--sifter", help="SIFTER_DIR from 'latentsift fit' (replaces "
                                          "--bank/--scorer and the method settings; runs the shift guard)."),
    on_shift: str = typer.Option("warn", "--on-shift", help="For a pool unlike the sifter's or bank's "
                                 "trajectories: warn, keep-all (skip Stage 1 for it) or error. A bare --bank "
                                 "records no agents: only its state-space check runs."),
    bank_choice: str = typer.Option("all", "--bank-choice", help="With --sifter: all (the all-agent bank) or "
                                    "nearest (per pool, the sub-bank of 'fit --per-agent' nearest to its "
                                    "candidates' states; the choice and distances are in the JSON)."),
    on_leak: Optional[str] = typer.Option(None, "--on-leak", help="For a pool whose instance is in the bank: "
                                          "error (refuse the run), skip (leave that pool out, score the others) "
                                          "or allow (score it). Default: error with --bank (evaluation: that "
                                          "overlap is leakage); allow with --sifter (deployment: a bank that has "
                                          "seen other attempts at the same task is knowledge). Each such pool is "
                                          "named in the output."),
) -> None:
    """Score candidate pools with LatentSift (or a baseline) and write per-candidate results as JSON."""
    from rich.console import Console
    from rich.table import Table

    from ..sift import run_filter

    import sys
    console = Console(width=None if sys.stdout.isatty() else 160)
    if distance_only and learned_only:
        raise LatentSiftError("Pass at most one of --distance-only and --learned-only.")
    if show < 0:
        raise LatentSiftError(f"--show must be 0 (no table) or a positive number of pools. Got {show} instead.")
    check_output(out, [pools, states, bank, scorer, sifter])
    settings: dict = {"min_keep": min_keep, "frac": frac, "seed": seed}
    if method == "latentsift":
        settings |= {"channels": tuple(x.strip() for x in channels.split(",") if x.strip()),
                     "distance": distance, "weighting": weighting, "fusion_weight": fusion_weight,
                     "branches": "distance" if distance_only else "learned" if learned_only else "both",
                     "n_evidence": evidence}
    inst = [x.strip() for x in instances.split(",") if x.strip()] if instances else None
    if ray is not None or bank_shards is not None:
        from ..scale.cluster import require_ray
        require_ray()
        if approx is not None:
            raise LatentSiftError("Pass --approx or --ray/--bank-shards, not both.")
    warnings: list[str] = []
    if bank_choice != "all" and sifter is None:
        raise LatentSiftError("--bank-choice needs --sifter (a sifter fitted with 'latentsift fit --per-agent').")
    if sifter is not None:
        from ..sifter import run_sifter_filter_chosen
        if bank is not None or scorer is not None or method != "latentsift":
            raise LatentSiftError("--sifter replaces --bank, --scorer and --method: pass only --sifter.")
        if ray is not None or bank_shards is not None or approx is not None:
            raise LatentSiftError("--sifter runs in one process: drop --ray, --bank-shards and --approx.")
        settings = {"min_keep": min_keep, "frac": frac, "seed": seed, "n_evidence": evidence}
        with Console(stderr=True).status("scoring ..."):
            run, warnings = run_sifter_filter_chosen(pools, states, sifter, bank_choice=bank_choice,
                                                     on_shift=on_shift, on_leak=on_leak or "allow", instances=inst,
                                                     **settings)
        settings["channels"] = tuple(run.settings["channels"])
    else:
        with Console(stderr=True).status("scoring ..."):
            run = run_filter(pools, states, bank_dir=bank, scorer_dir=scorer, method=method, instances=inst,
                             ray_address=ray, bank_shards=bank_shards, approx=approx,
                             on_shift=on_shift if method == "latentsift" else None, on_leak=on_leak or "error",
                             **settings)
        warnings = list(run.extra.get("shift", {}).get("warnings", []))
    run.save(out)
    for res in run.pools[:show]:
        t = Table(title=f"{res.instance_id}: keep {res.n_keep} of {len(res.candidates)}", title_justify="left")
        t.add_column("candidate")
        chans = list(settings.get("channels", ())) if res.candidates and res.candidates[0].q is not None else []
        for c in chans:
            t.add_column(f"q_{c}", justify="right")
        for c in chans:
            t.add_column(f"r_{c}", justify="right")
        extra = (["s_dist"] if chans else []) + (["q_lin", "s_lin"] if res.candidates and
                                                 res.candidates[0].q_lin is not None else [])
        extra += ["raw"] if res.candidates and res.candidates[0].raw is not None else []
        for c in extra + ["s", "kept"]:
            t.add_column(c, justify="right")
        for c in sorted(res.candidates, key=lambda c: -c.s):
            row = [c.traj_id] + [_fmt(c.q[ch]) for ch in chans] + [_fmt(c.r[ch]) for ch in chans]
            row += [_fmt(getattr(c, k)) for k in extra] + [_fmt(c.s), "yes" if c.retained else ""]
            t.add_row(*row)
        console.print(t)
    if 0 < show < len(run.pools):
        console.print(f"... {len(run.pools) - show} more pools in {out}")
    for c in run.extra.get("bank_choice", {}).get("pools", [])[:show]:
        console.print(f"bank for {c['instance_id']}: {c['chosen']} (median nearest-bank distances "
                      + ", ".join(f"{k} {_fmt(v)}" for k, v in c["distances"].items()) + ")")
    leak = run.extra.get("leak", {})
    for w in leak.get("warnings", []):
        console.print(f"[yellow]leak ({leak['on_leak']}): {w}[/yellow]")
    for w in warnings:
        console.print(f"[yellow]shift ({on_shift}): {w}[/yellow]")
    shared = run.inputs.get("repos_shared_with_bank")
    if shared:
        console.print(f"[yellow]note: the bank and the pools share repositories {shared}; the paper's protocol "
                      "keeps them disjoint.[/yellow]")
    console.print(f"{run.method}: {sum(p.n_keep for p in run.pools)} of "
                  f"{sum(len(p.candidates) for p in run.pools)} candidates retained over {len(run.pools)} pools. "
                  f"Written to {out}.")
