"""The report: files written only into the given folder, numbers read from the summary, PNGs."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from latentsift.cascade.cascade import CandidateRecord, PoolSpec
from latentsift.metrics.evaluate import EvaluateSettings, evaluate_run
from latentsift.report.figures import FIGURES
from latentsift.report.report import render_markdown, write_report
from latentsift.cascade.verifier import Verdict


@pytest.fixture(scope="module")
def summary():
    rng = np.random.default_rng(5)
    pools, records = [], {}
    for i in range(12):
        ids = tuple(f"i{i}/{j}" for j in range(6))
        pools.append(PoolSpec(f"i{i}", ids, 2000.0))
        for t in ids:
            records[t] = CandidateRecord(t, f"i{i}", int(rng.random() < 0.35), float(rng.integers(0, 3)),
                                         float(rng.integers(0, 2)))
    ids = list(records)
    ef = {t: Verdict(t, float(rng.random()), 0.5, 0.5, int(rng.integers(500, 900)), 1) for t in ids}
    ls = {t: records[t].label + float(rng.random()) for t in ids}
    filters = {"ef": ef, "ls": ls, "ls_R": {t: float(rng.random()) for t in ids},
               "len": {t: -float(rng.integers(3, 30)) for t in ids}}
    settings = EvaluateSettings(
        ks=[2, 4, 6], n_boot=100, names={"ls": "LatentSift", "ef": "EF verifier"},
        ablations={"channels": {"title": "Channel selection", "filters": ["ls", "ls_R"],
                                "layout": "columns", "labels": {"ls": "R+O+F", "ls_R": "R"}},
                   "naive": {"title": "Naive rules", "filters": ["ls", "len"]}})
    return evaluate_run(pools, filters, records, settings, final_verifier=ef,
                        distributions={"q_cot": {t: ls[t] - 0.5 for t in ids}, "s": ls})


def test_write_report_writes_only_into_out_dir(tmp_path, summary):
    out = tmp_path / "rep"
    before = set(tmp_path.iterdir())
    written = write_report(summary, out)
    assert set(tmp_path.iterdir()) - before == {out}
    names = {p.name for p in out.iterdir()}
    assert names == {"summary.json", "ledger.jsonl", "report.md", *FIGURES} == set(written)
    import matplotlib.image as mpimg
    for f in FIGURES:
        img = mpimg.imread(out / f)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
        assert img[..., :3].std() > 0.05  # something was drawn
    ledger = [json.loads(l) for l in (out / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 12 * 3 * 4


def test_report_numbers_come_from_the_summary(tmp_path, summary):
    write_report(summary, tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    md = (tmp_path / "report.md").read_text()
    assert md == render_markdown(data, figures=list(FIGURES))  # the saved summary renders the same text
    row = next(l for l in md.splitlines() if l.startswith("| LatentSift | ") and "[" in l)
    best = data["best_at_k"]["filters"]["ls"]["6"]
    assert row.split(" | ")[1] == f"{100 * best['mean']:.2f} [{100 * best['lo']:.2f}, {100 * best['hi']:.2f}]"
    ef_k = float(row.split(" | ")[2])
    assert ef_k == pytest.approx(data["tokens"]["workflows"]["ls"]["6"]["ef"]["mean"] / 1000, abs=0.005)
    assert "### Channel selection" in md and "| Best@6 | " in md and "| R+O+F | R |" in md
    ret = data["ablations"]["naive"]["rows"][1]["retention"]["mean"]
    assert re.search(rf"\| len \| [0-9.]+ \| {100 * ret:.2f} \|", md)
    assert "Oracle Pass@K" in md and "Random selection" in md
    # Every percentage printed in the Best@K table is a summary value.
    table = md.split("## Best@K by K")[1].split("Intervals:")[0]
    printed = {float(x) for x in re.findall(r"\| ([0-9]+\.[0-9]{2})(?= \|)", table)}
    allowed = {round(100 * v["mean"], 2) for f in data["best_at_k"]["filters"].values() for v in f.values()}
    allowed |= {round(100 * v["mean"], 2) for key in ("oracle_pass", "random") for v in data["best_at_k"][key].values()}
    assert printed and printed <= allowed


def test_training_size_curves_are_tabulated_and_drawn(tmp_path, summary):
    """A summary with learned-branch curves gets a table (AUC per bank fraction) and training_size.png."""
    from latentsift.metrics.score_table import diagnostics_table
    rng = np.random.default_rng(7)
    n = 120
    inst = np.repeat([f"i{k}" for k in range(20)], 6)
    label = (rng.random(n) < 0.4).astype(int)
    table = {"instance_id": inst, "traj_id": np.array([f"t{k}" for k in range(n)]),
             "agent": np.tile(["a", "b"], n // 2), "label": label, "n_chars": rng.integers(100, 900, n),
             "n_steps": rng.integers(2, 20, n)}
    scores = {f"curve:{ln}@{f}": label * strength + rng.normal(size=n)
              for ln in ("gated", "probe") for f, strength in (("25%", 0.0), ("100%", 3.0))}
    data = json.loads(summary.to_json())
    data["selection"] = {"reference": "shortest_chars", "retention_difference": {}, "default_choice": [],
                         "diagnostics": diagnostics_table(table, scores, n_boot=100),
                         "training_size": {"fractions": ["25%", "100%"], "rule": "nested subsets",
                                           "bank_trajectories": {"25%": {"0": 10, "1": 14}, "100%": {"0": 40, "1": 60}}}}
    md = render_markdown(data, figures=None)
    sec = md.split("Training-set size (nested subsets)")[1]
    d = data["selection"]["diagnostics"]["scores"]
    assert f"| 25% | 12 | {d['curve:gated@25%']['auc']['auc']:.3f} [" in sec
    assert f"| 100% | 50 | {d['curve:gated@100%']['auc']['auc']:.3f} [" in sec
    assert d["curve:probe@100%"]["auc"]["auc"] > 0.8 > d["curve:probe@25%"]["auc"]["auc"]
    written = write_report(data, tmp_path)
    assert "training_size.png" in written
    import matplotlib.image as mpimg
    img = mpimg.imread(written["training_size.png"])
    assert img.shape[0] > 200 and img[..., :3].std() > 0.05


def test_the_run_settings_are_a_short_table_and_the_folds_are_folded(summary):
    data = json.loads(json.dumps(summary.data if hasattr(summary, "data") else summary))
    folds = [{"fold": k, "bank_repos": ["a/a", "b/b"], "eval_repos": ["c/c"], "n_bank_trajectories": 40 + k,
              "n_bank_positive": 20, "n_eval_instances": 5,
              "variants": {"chosen_default": "probe", "inner_cv_within_pool_auc": {"probe": 0.75, "stack:states": 0.7},
                           "stack_weights": {"probe": {"probe": 2.5}}}} for k in range(4)]
    data["settings"]["meta"] = {"reproduce": {"n_folds": 4, "ks": [4, 5, 6], "model": None, "variants": True},
                                "selection": {"n_solvable": 87}, "stage2": "regression = passed count | rule",
                                "folds": folds, "fingerprint": {"n_layers": 30, "digest": "abc"},
                                "leak": {"on_leak": "skip", "pools": [{"instance_id": "x"}]}}
    md = render_markdown(data)
    run = md.split("## Run\n")[1].split("\n## ")[0]
    head, details = run.split("<details>")
    assert "| command | `latentsift reproduce` |" in head and "| `n_folds` | 4 |" in head
    assert "| `ks` | 4, 5, 6 |" in head and "| `model` | none |" in head and "| `variants` | yes |" in head
    assert "| selection | n_solvable: 87 |" in head and "| fingerprint | n_layers: 30; digest: abc |" in head
    assert "- stage2: regression = passed count | rule" in head  # a sentence: a note under the table
    assert max(len(line) for line in head.splitlines()) < 200 and "{" not in head  # no Python repr
    assert "| 3 | a/a, b/b | c/c | 43 (20) | 5 | `probe` |" in details
    assert "| 0 | 0.750 | 0.700 |" in details and "stack_weights" in details and "2.5" not in details
    assert '"on_leak": "skip"' in details and details.rstrip().endswith("</details>")
    assert "Run:" not in md


def test_one_colour_per_filter_in_every_figure_and_the_explorer(tmp_path):
    """Each filter is drawn in its colour of the one table (report.colors), in every figure that shows
    it and in the explorer's charts, whichever filters a run holds and in whichever order."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex
    from latentsift.report import figures
    from latentsift.report.colors import FILTER_COLORS, filter_colors
    from latentsift.report.explore.data import summary_charts
    rng = np.random.default_rng(3)
    pools, records = [], {}
    for i in range(8):
        ids = tuple(f"i{i}/{j}" for j in range(4))
        pools.append(PoolSpec(f"i{i}", ids, 1000.0))
        for t in ids:
            records[t] = CandidateRecord(t, f"i{i}", int(rng.random() < 0.4), 1.0, 0.0)
    ids = list(records)
    ef = {t: Verdict(t, float(rng.random()), 0.5, 0.5, 600, 1) for t in ids}
    keys = ["random", "shortest_chars", "latentsift"]  # not the table's order, and without the default
    filters = {"ef_verifier": ef, **{k: {t: float(rng.random()) for t in ids} for k in keys}}
    names = {"ef_verifier": "EF verifier", "latentsift": "LatentSift", "random": "Random",
             "shortest_chars": "Shortest"}
    for order in (["ef_verifier", *keys], [*reversed(keys), "ef_verifier"]):
        data = json.loads(evaluate_run(
            pools, {k: filters[k] for k in order}, records,
            EvaluateSettings(ks=[2, 4], n_boot=20, names=names, headline=order, reference="ef_verifier"),
            final_verifier=ef).to_json())
        data["operating_points"] = {"filters": {f: {"curve": [{"recall": 0.5, "verifier_calls": 2.0}],
                                                    "reliability": {"mean_p": [0.5], "frac_resolved": [0.4]},
                                                    "ece": {"mean": 0.1}} for f in order}}
        assert {f: filter_colors(data)[f] for f in order} == {f: FILTER_COLORS[f] for f in order}
        seen = {f: 0 for f in order}
        for fn in (figures._fig_best_tokens_k, figures._fig_best_vs_tokens, figures._fig_savings,
                   figures._fig_reliability, figures._fig_cost_recall):
            fig = fn(data, plt)
            assert fig is not None, fn.__name__
            for ax in fig.axes:
                for art in [*ax.lines, *ax.patches, *ax.collections]:
                    label = str(art.get_label())
                    for f in order:
                        if label == names[f] or label.startswith(f"{names[f]} (") or label.endswith(f": {names[f]}") \
                                or label.startswith(f"{names[f]}: "):
                            c = art.get_color() if hasattr(art, "get_color") else art.get_facecolor()
                            c = c[0] if getattr(c, "ndim", 1) == 2 else c
                            assert to_hex(c) == FILTER_COLORS[f], (fn.__name__, label)
                            seen[f] += 1
            plt.close(fig)
        assert all(seen.values()), seen
        charts = summary_charts(data)
        drawn = [d for key in ("best_vs_tokens", "retention", "differences") for d in charts[key]]
        assert drawn and all(d["color"] == FILTER_COLORS[next(f for f in order if names[f] == d["label"])]
                             for d in drawn)


def test_no_figure_names_a_colour_of_its_own():
    """Series colours come from report.colors only (no 'C0', 'tab:red' or hex literal in the drawing code)."""
    import inspect
    from latentsift.report import figures
    from latentsift.report.explore import data
    for mod in (figures, data):
        src = inspect.getsource(mod)
        assert not re.search(r"""color=["']|["']C\d["']|tab:|["']#[0-9a-fA-F]{6}["']|"k--"|"k-""", src), mod.__name__


def test_a_registered_filter_is_drawn_in_the_colour_it_was_registered_with():
    """The colour table is read from the registry: each built-in filter's colour is the one it was
    registered with, a plugin's colour too, and a filter registered without one takes a free colour."""
    from latentsift.report.colors import FILTER_COLORS, FREE, filter_colors
    from latentsift.sift.rules import RuleFilter, filters, register_filter, unregister_filter
    assert {e.key: e.color for e in filters() if e.color} == {k: FILTER_COLORS[k] for k in
                                                              ("latentsift", "random", "shortest_tokens",
                                                               "shortest_chars", "fewest_steps",
                                                               "default", "recommended", "ef_verifier")}

    @register_filter("test-coloured", color="#123456")
    class Coloured(RuleFilter):
        def _raw(self, cands, states):
            return np.zeros(len(cands))

    @register_filter("test-plain")
    class Plain(RuleFilter):
        def _raw(self, cands, states):
            return np.zeros(len(cands))

    try:
        data = {"settings": {"headline": ["test_plain", "test_coloured", "random"], "filters": []}}
        assert filter_colors(data) == {"test_plain": FREE[0], "test_coloured": "#123456",
                                       "random": FILTER_COLORS["random"]}
    finally:
        unregister_filter("test-coloured")
        unregister_filter("test-plain")


def _decided(summary_auc: dict, calls: dict | None = None, winner: str | None = None, missing=None) -> dict:
    """A summary holding only what the opening sentence reads: ``summary_auc`` maps each state score to
    (AUC, {reference: (lo, hi)}); ``calls`` maps a filter to {target: (mean, lo, hi)} against shortest-in-characters."""
    from latentsift.metrics.diagnostics import interval_outcome

    def vs(lo, hi):
        d = {"estimate": (lo + hi) / 2, "lo": lo, "hi": hi}
        return d | {"outcome": interval_outcome(d)}
    scores = {n: {"auc": {"auc": a}, "post_hoc": n.startswith("stack"), "vs": {r: vs(*iv) for r, iv in v.items()}}
              for n, (a, v) in summary_auc.items()}
    refs = [r for r in ("shortest_chars", "stack:length", "random") if r not in (missing or {})]
    data = {"settings": {"names": {"shortest_chars": "shortest-in-characters", "latentsift": "LatentSift (paper)"}},
            "decision": {"winner": winner, "auc": {"scores": scores, "missing_references": missing or {},
                                                   "references": refs}}}
    if calls:
        data["operating_points"] = {"reference": "shortest_chars", "filters": {f: {"targets": {
            r: {"difference_vs_reference": {"verifier_calls_adjusted": {"mean": m, "lo": lo, "hi": hi},
                                            "realized_recall": {"mean": 0.0}}} for r, (m, lo, hi) in t.items()}}
            for f, t in calls.items()}}
    return data


def test_the_opening_sentence_says_whether_states_beat_length_and_what_they_save():
    """report.md and the explorer open with one sentence read from the run's own numbers: states beat the
    length rules, do not, or undetermined; then the calls saved at each stated target recall."""
    from latentsift.report.decision_report import headline

    beat = _decided({"latentsift": (0.70, {"shortest_chars": (-0.01, 0.1), "stack:length": (0.0, 0.1),
                                           "random": (0.1, 0.3)}),
                     "stack:states+length": (0.78, {"shortest_chars": (0.02, 0.13), "stack:length": (0.004, 0.11),
                                                    "random": (0.2, 0.4)})},
                    calls={"stack:states+length": {"0.9": (-0.37, -0.55, -0.18), "0.95": (0.13, -0.04, 0.32)}},
                    winner="stack:states+length")
    s = headline(beat)  # a score chosen after the folds were seen never opens the report (issue 67)
    assert s.startswith("Here no state score is shown to beat the length rules: the best, LatentSift (paper) "
                        "(AUC 0.700), is undetermined against them")
    assert ". " not in s and s.endswith(".")  # one sentence
    rec = _decided({"recommended": (0.74, {"shortest_chars": (0.02, 0.13), "stack:length": (0.004, 0.11),
                                           "random": (0.2, 0.4)})},
                   calls={"recommended": {"0.9": (-0.37, -0.55, -0.18), "0.95": (0.13, -0.04, 0.32)}})
    s = headline(rec)
    assert s.startswith("Here a state score beats the length rules: recommended (the recommendation of fit --method "
                        "auto, chosen per fold on the bank alone) ranks a pool's resolved candidates above its "
                        "unresolved ones better than shortest-in-characters and stack:length")
    assert s.endswith("; at a target pool recall of 0.9 recommended needs 0.37 fewer verifier calls per pool "
                      "than shortest-in-characters (decided), at 0.95 0.13 more (not decided).")

    below = _decided({"latentsift": (0.51, {"shortest_chars": (-0.36, -0.2), "stack:length": (-0.3, 0.1),
                                            "random": (-0.04, 0.1)})},
                     calls={"latentsift": {"0.9": (0.95, 0.78, 1.11), "0.95": (1.13, 0.97, 1.31), "0.99": (0, 0, 0)}})
    assert headline(below) == ("Here no state score beats the length rules: each ranks a pool's candidates below at "
                               "least one of shortest-in-characters and stack:length, with a paired 95% interval "
                               "below 0; at a target pool recall of 0.9 LatentSift (paper) needs 0.95 more verifier "
                               "calls per pool than shortest-in-characters (decided), at 0.95 1.13 more (decided), at "
                               "0.99 as many (not decided).")
    same = _decided({"latentsift": (0.51, {"shortest_chars": (-0.36, -0.2)})},
                    calls={"latentsift": {"0.9": (0.0, -0.1, 0.1), "0.95": (0.0, -0.1, 0.1)}})
    assert headline(same).endswith("; at a target pool recall of 0.9 and 0.95 LatentSift (paper) needs as many "
                                   "verifier calls per pool as shortest-in-characters (not decided).")

    open_ = _decided({"latentsift": (0.758, {"shortest_chars": (-0.007, 0.111), "stack:length": (-0.017, 0.085),
                                             "random": (0.2, 0.4)}),
                      "probe": (0.747, {"shortest_chars": (-0.027, 0.108), "stack:length": (-0.04, 0.07),
                                        "random": (0.2, 0.4)})})
    assert headline(open_) == ("Here no state score is shown to beat the length rules: the best, LatentSift (paper) "
                               "(AUC 0.758), is undetermined against them (its paired 95% interval against "
                               "stack:length is [-0.017, +0.085]); no target recall was set, so no saving at a "
                               "stated recall was measured.")
    # a length reference that could not be fitted: a score above the others is not said to beat length
    gone = _decided({"latentsift": (0.8, {"shortest_chars": (0.02, 0.1), "random": (0.2, 0.4)})},
                    missing={"stack:length": "fold 0: one class"})
    assert "is undetermined against them (the missing stack:length could not be compared)" in headline(gone)
    assert headline({"settings": {}}) is None  # a summary without the comparisons that decide: no sentence
