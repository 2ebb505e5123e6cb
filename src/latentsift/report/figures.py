"""PNG figures of an evaluation summary (matplotlib, Agg backend; pure: data in, files out).

``write_figures(data, out)`` draws, into ``out`` only, the figures the summary (the summary.json
dict) has data for: ``score_distributions.png`` (resolved vs unresolved per panel, dashed class
means), ``best_at_k_tokens.png`` (verification tokens per instance as bars, Best@K / Oracle Pass@K /
random as curves, against K), ``best_vs_tokens.png`` (Best@K against verification tokens),
``token_savings.png`` (tokens saved against the reference workflow), ``training_size.png``
(learned-branch AUC against the bank fraction), ``pruning.png`` (tokens saved against retention per
pruning policy), ``shift_guard.png`` (the shift guard's flag rates against its threshold),
``reliability.png`` (calibrated probabilities against the share resolved) and ``cost_recall.png``
(realized pool recall against verifier calls of the recall-targeted rule), ``new_agent.png`` (realized
recall and calls against the new agent's labelled pools in the calibration set).
``latentsift.report.report`` writes them beside report.md.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .._core.io import atomic_path
from .colors import (CLASS_COLORS, FILTER_COLORS, GUIDE_COLOR, ORACLE_COLOR, filter_colors, policy_colors,
                     series_colors)
from ..cascade.verifier import EF
from ..metrics.evaluate import RANDOM_PICK
from ..sift.keep import PAPER_KEEP
from ..sift.prune import STATE_POLICIES
from ..sift.rules import RANDOM

#: The PNG files ``write_figures`` writes into a report folder.
FIGURES = ("score_distributions.png", "best_at_k_tokens.png", "best_vs_tokens.png", "token_savings.png")


def filter_name(data: dict, f: str) -> str:
    """A filter's display name (the summary's ``settings.names``, else its key)."""
    return data["settings"].get("names", {}).get(f, f)


def k_labels(data: dict) -> list[str]:
    """The summary's K values as the string keys its tables use."""
    return [str(k) for k in data["settings"]["ks"]]


def write_figures(data: dict, out: Path) -> dict[str, Path]:
    """Draw the figures that the summary has data for; returns name -> path."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    written = {}
    for fname, fn in (("score_distributions.png", _fig_distributions), ("best_at_k_tokens.png", _fig_best_tokens_k),
                      ("best_vs_tokens.png", _fig_best_vs_tokens), ("token_savings.png", _fig_savings),
                      ("training_size.png", _fig_training_size), ("pruning.png", _fig_pruning),
                      ("shift_guard.png", _fig_shift_guard), ("reliability.png", _fig_reliability),
                      ("cost_recall.png", _fig_cost_recall), ("new_agent.png", _fig_new_agent)):
        fig = fn(data, plt)
        if fig is None:
            continue
        try:
            with atomic_path(out / fname, ".png") as tmp:
                fig.savefig(tmp, dpi=130, bbox_inches="tight")
        finally:
            plt.close(fig)
        written[fname] = out / fname
    return written


def _fig_distributions(data: dict, plt):
    panels = (data.get("distributions") or {}).get("panels") or {}
    if not panels:
        return None
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 2.9), squeeze=False)
    for i, (ax, (name, p)) in enumerate(zip(axes[0], panels.items())):
        allv = p["resolved"] + p["unresolved"]
        if not allv:
            ax.set_title(f"({chr(97 + i)}) {name}: no values", fontsize=9)
            continue
        bins = np.histogram_bin_edges(allv, bins=30)
        for key in ("unresolved", "resolved"):
            v, color, lab = p[key], CLASS_COLORS[key], key
            if v:
                ax.hist(v, bins=bins, density=True, alpha=0.45, color=color, label=f"{lab} (n={len(v)})")
                ax.axvline(p[f"mean_{key}"], color=color, linestyle="--", linewidth=1.4)
        ax.set_title(f"({chr(97 + i)}) {name}", fontsize=9, pad=12)
        ax.set_xlabel("score", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("density", fontsize=8)
    fig.suptitle(f"Score distributions of resolved vs unresolved candidates "
                 f"({data['distributions']['n_instances']} instances; dashed = class means)", fontsize=10)
    fig.tight_layout()
    return fig


def _fig_best_tokens_k(data: dict, plt):
    s = data["settings"]
    ks = k_labels(data)
    head = s["headline"]
    tok, best = data["tokens"]["workflows"], data["best_at_k"]
    x = np.arange(len(ks))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    w = 0.8 / max(len(head), 1)
    colors = filter_colors(data)
    for i, f in enumerate(head):
        ax.bar(x - 0.4 + w * (i + 0.5), [tok[f][k]["total"]["mean"] / 1000 for k in ks], width=w,
               color=colors[f], alpha=0.35, label=f"tokens: {filter_name(data, f)}")
    ax.set_xticks(x, [str(k) for k in ks])
    ax.set_xlabel("K (candidates per instance)")
    ax.set_ylabel("verification tokens per instance (K)")
    ax2 = ax.twinx()
    for i, f in enumerate(head):
        m = [100 * best["filters"][f][k]["mean"] for k in ks]
        lo = [100 * best["filters"][f][k]["lo"] for k in ks]
        hi = [100 * best["filters"][f][k]["hi"] for k in ks]
        ax2.plot(x, m, marker="o", color=colors[f], label=f"Best@K: {filter_name(data, f)}")
        ax2.fill_between(x, lo, hi, color=colors[f], alpha=0.08)
    ax2.plot(x, [100 * best["oracle_pass"][k]["mean"] for k in ks], "--", color=ORACLE_COLOR, marker="^",
             label="Oracle Pass@K")
    ax2.plot(x, [100 * best[RANDOM_PICK][k]["mean"] for k in ks], ":", color=FILTER_COLORS[RANDOM], marker="v",
             label="Random")
    ax2.set_ylabel("resolution rate (%)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0))
    ax.set_title("Verification tokens (bars) and Best@K (curves) against K", fontsize=10)
    fig.tight_layout()
    return fig


def _fig_best_vs_tokens(data: dict, plt):
    s = data["settings"]
    ks = k_labels(data)
    tok, best = data["tokens"]["workflows"], data["best_at_k"]
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    colors = filter_colors(data)
    for f in s["headline"]:
        xs = [tok[f][k]["total"]["mean"] / 1000 for k in ks]
        ys = [100 * best["filters"][f][k]["mean"] for k in ks]
        ax.plot(xs, ys, marker="o", color=colors[f], label=filter_name(data, f))
        for k, xv, yv in zip(ks, xs, ys):
            ax.annotate(f"K={k}", (xv, yv), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("verification tokens per instance (K)")
    ax.set_ylabel("hybrid Best@K (%)")
    ax.set_title("Best@K against verification tokens", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _fig_savings(data: dict, plt):
    sav = data["tokens"].get("savings") or {}
    ref = data["tokens"].get("reference")
    show = [f for f in data["settings"]["headline"] if f in sav]
    if not show or ref is None:
        return None
    ks = k_labels(data)
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    colors = filter_colors(data)
    for f in show:
        c = colors[f]
        tot = [sav[f][k]["total"]["mean"] for k in ks]
        ef = [sav[f][k]["ef"]["mean"] for k in ks]
        ax.plot([int(k) for k in ks], [100 * v if v is not None else float("nan") for v in tot], "-o", color=c,
                label=f"{filter_name(data, f)}: total")
        ax.plot([int(k) for k in ks], [100 * v if v is not None else float("nan") for v in ef], "--", color=c,
                marker="x", markersize=7, label=f"{filter_name(data, f)}: EF only")
    ax.axhline(0, color=GUIDE_COLOR, linewidth=0.8)
    ax.set_xticks([int(k) for k in ks])
    ax.set_xlabel("K")
    ax.set_ylabel(f"tokens saved vs {filter_name(data, ref)} (%)")
    ax.set_title("Verification tokens saved", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _fig_training_size(data: dict, plt):
    """Within-pool AUC of each learned-branch learner against the bank fraction, 95% bands, chance line."""
    sel = data.get("selection") or {}
    ts, diag = sel.get("training_size") or {}, (sel.get("diagnostics") or {}).get("scores", {})
    fracs = ts.get("fractions") or []
    learners = sorted({n.split(":", 1)[1].split("@")[0] for n in diag if n.startswith("curve:")})
    if not fracs or not learners:
        return None
    x = [float(f.rstrip("%")) for f in fracs]
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    colors = series_colors(learners, {})
    for ln in learners:
        rows = [diag.get(f"curve:{ln}@{f}") for f in fracs]
        pts = [(xi, r["auc"]["auc"], r["auc"]["ci"]) for xi, r in zip(x, rows) if r and r["auc"]["auc"] is not None]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[ln], label=ln)
        ax.fill_between([p[0] for p in pts], [p[2][0] for p in pts], [p[2][1] for p in pts], color=colors[ln],
                        alpha=0.15)
    ref = diag.get(sel.get("reference", ""), {}).get("auc", {}).get("auc")
    if ref is not None:
        ax.axhline(ref, color=filter_colors(data).get(sel["reference"], GUIDE_COLOR), linestyle="--",
                   label=sel.get("reference"))
    ax.axhline(0.5, color=ORACLE_COLOR, linewidth=0.6, linestyle=":")
    ax.set_xlabel("bank used for training (% of instances)")
    ax.set_ylabel("within-pool AUC")
    ax.legend(fontsize=7)
    return fig


def _fig_shift_guard(data: dict, plt):
    """Flag rate of the distance check against the threshold's reference quantile: false alarms
    (held-out pools of the bank's agents) and detection (another agent's pools)."""
    g = data.get("shift_guard") or {}
    if not g or not g.get("quantiles"):
        return None
    q = g["quantiles"]
    fig, ax = plt.subplots(figsize=(4.8, 3.3))
    styles = {"repository": "-", "instance": "--"}
    pairs = series_colors(["false alarm", *sorted(g.get("detection", {}))], {})
    for kind in g.get("reference_kinds", []):
        curve = g["false_alarms"]["pooled"][kind]["tradeoff"]
        if curve:
            ax.plot(q, curve, styles.get(kind, "-"), color=pairs["false alarm"], marker="o", ms=3,
                    label=f"false alarm ({kind})")
        for pair, d in sorted(g.get("detection", {}).items()):
            if d[kind]["tradeoff"]:
                ax.plot(q, d[kind]["tradeoff"], styles.get(kind, "-"), color=pairs[pair], marker="o", ms=3,
                        label=f"detection {pair} ({kind})")
    ax.axvline(1 - g["false_alarm_setting"], color=GUIDE_COLOR, linewidth=0.6, linestyle=":")
    ax.set_xlabel("threshold: quantile of the in-bank reference")
    ax.set_ylabel("pools flagged (distance check)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=6)
    return fig


def _fig_pruning(data: dict, plt):
    pr = data.get("pruning")
    if not pr:
        return None
    kinds = sorted({r["schedule"] for r in pr["rows"] if r["checkpoints"]})
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.0), squeeze=False)
    colors = policy_colors(r["policy"] for r in pr["rows"])
    for ax, kind in zip(axes[0], kinds):
        for pol in dict.fromkeys(r["policy"] for r in pr["rows"] if r["schedule"] == kind):
            rs = sorted((r for r in pr["rows"] if r["schedule"] == kind and r["policy"] == pol
                         and not isinstance(r["threshold"], str)), key=lambda r: r["threshold"])
            ax.plot([100 * r["gen_saved"]["mean"] for r in rs], [100 * r["retention"]["mean"] for r in rs],
                    marker="o", ms=3, color=colors[pol], label=pol, ls="-" if pol in STATE_POLICIES else "--")
            ib = [r for r in pr["rows"] if r["schedule"] == kind and r["policy"] == pol and r["threshold"] == "in-bank"]
            for r in ib:
                ax.plot(100 * r["gen_saved"]["mean"], 100 * r["retention"]["mean"], marker="*", ms=10,
                        color=colors[pol])
        ax.set_xlabel("model-written tokens saved (%)")
        ax.set_ylabel("retention of a resolved candidate (%)")
        ax.set_title(f"Early pruning, {kind} checkpoints (star = in-bank threshold)", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _op_filters(data: dict) -> list[str]:
    """Filters drawn in the operating-point figures: the headline rules and the agent-transfer ones."""
    op = data.get("operating_points") or {}
    head = data["settings"].get("headline") or []
    return [f for f in op.get("filters", {}) if f in head or f.startswith("transfer:")]


def _fig_reliability(data: dict, plt):
    """Reliability of each filter's calibrated probabilities on the held-out folds (diagonal = calibrated)."""
    op = data.get("operating_points") or {}
    names = _op_filters(data)
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    ax.plot([0, 1], [0, 1], color=GUIDE_COLOR, linewidth=0.6, linestyle=":")
    colors = filter_colors(data)
    for f in names:
        r, e = op["filters"][f]["reliability"], op["filters"][f]["ece"]
        if e.get("mean") is None:  # no clean calibration set: no calibrated probability to draw
            continue
        ax.plot(r["mean_p"], r["frac_resolved"], marker="o", ms=3, color=colors[f],
                label=f"{filter_name(data, f)} (ECE {e['mean']:.3f})")
    ax.set_xlabel("calibrated P(resolved), bin mean")
    ax.set_ylabel("share resolved")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Reliability on the held-out folds", fontsize=9)
    ax.legend(fontsize=6)
    return fig


def _fig_cost_recall(data: dict, plt):
    """Realized pool recall against verifier calls per pool, the rule chosen for each target recall."""
    op = data.get("operating_points") or {}
    names = _op_filters(data)
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    colors = filter_colors(data)
    for f in names:
        pts = [c for c in op["filters"][f]["curve"] if c["recall"] is not None]
        ax.plot([c["verifier_calls"] for c in pts], [100 * c["recall"] for c in pts], marker="o", ms=3,
                color=colors[f], label=filter_name(data, f), ls="--" if f in (RANDOM, EF) else "-")
    fixed = op.get("fixed_rule_calls", {}).get("mean")
    if fixed is not None:
        ax.axvline(fixed, color=GUIDE_COLOR, linewidth=0.6, linestyle=":",
                   label=f"paper's {PAPER_KEEP.describe()} (calls)")
    ax.set_xlabel("verifier calls per pool (candidates kept)")
    ax.set_ylabel("realized pool recall (%)")
    ax.set_title("Cost and recall of the recall-targeted rule", fontsize=9)
    ax.legend(fontsize=6)
    return fig


def _fig_new_agent(data: dict, plt):
    """Agent transfer: realized recall and verifier calls against the new agent's labelled pools in the
    calibration set, per (bank agent -> new agent) pair, at the first target recall."""
    na = (data.get("operating_points") or {}).get("new_agent") or {}
    pairs = na.get("pairs") or {}
    if not pairs or not na.get("targets"):
        return None
    r0 = na["targets"][0]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6))
    colors = series_colors(sorted(pairs), {})
    for pair, d in sorted(pairs.items()):
        for mode, ls in (("added", "-"), ("alone", "--")):
            rows = [x for x in d["rows"] if x["mode"] == mode and x["target"] == r0 and x["realized_recall"] is not None
                    and x.get("confidence") is None]
            ms = [x["m"] for x in rows]
            axes[0].plot(ms, [100 * x["realized_recall"] for x in rows], ls, marker="o", ms=3, color=colors[pair],
                         label=f"{pair} ({mode})")
            axes[1].plot(ms, [x["verifier_calls"] for x in rows], ls, marker="o", ms=3, color=colors[pair],
                         label=f"{pair} ({mode})")
    axes[0].axhline(100 * r0, color=GUIDE_COLOR, linewidth=0.6, linestyle=":")
    axes[0].set_ylabel(f"realized pool recall (%), target {r0:g}")
    axes[1].set_ylabel("verifier calls per pool")
    for ax in axes:
        ax.set_xlabel("labelled pools of the new agent in the calibration set")
        ax.legend(fontsize=6)
    fig.suptitle("A way back for a new agent", fontsize=9)
    fig.tight_layout()
    return fig
