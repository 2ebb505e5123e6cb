"""The comparisons that decide, the single-agent pools and the verdict (protocol.decide, single_agent, verdict).

Small synthetic cases with known answers, then the tiny end-to-end run (conftest ``tiny_run``): its
summary.json holds the new sections, the old sections are those of a run without them, and report.md
opens with one plain sentence, then the verdict.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from markupsafe import escape

from latentsift.cascade.cascade import CandidateRecord, PoolSpec
from latentsift.metrics.diagnostics import within_pool_auc
from latentsift.protocol.decide import (REF_LENGTH_RULE, REF_RANDOM, auc_comparisons, is_post_hoc,
                                        ledger_difference, outcome, residualize_within_pool,
                                        token_savings_difference, winner, within_pool_slope)
from latentsift.protocol.single_agent import SubPoolScorer, split_pools_by_agent, sub_pool_id
from latentsift.protocol.verdict import MAX_LINES
from latentsift.report.decision_report import headline


def _table(n_pools=30, k=4, seed=0):
    rng = np.random.default_rng(seed)
    inst = np.repeat([f"i{p:02d}" for p in range(n_pools)], k)
    label = np.tile([1, 0] * (k // 2), n_pools)
    n_chars = rng.integers(1000, 50000, size=inst.size)
    return {"instance_id": inst, "traj_id": np.array([f"t{i:04d}" for i in range(inst.size)]),
            "agent": np.tile(["a", "b"] * (k // 2), n_pools), "label": label, "n_chars": n_chars,
            "n_steps": rng.integers(2, 30, size=inst.size)}


def test_within_pool_slope_recovers_a_known_slope_despite_pool_offsets():
    rng = np.random.default_rng(1)
    code = np.repeat(np.arange(50), 5)
    x = rng.normal(size=code.size)
    y = 2.5 * x + 10 * rng.normal(size=50)[code]       # pool offsets are ignored by the centring
    assert within_pool_slope(code, y, x) == pytest.approx(2.5)
    y_nan = y.copy()
    y_nan[:3] = np.nan                                  # missing scores are left out of the fit
    assert within_pool_slope(code, y_nan, x) == pytest.approx(2.5)
    assert within_pool_slope(code, y, np.zeros_like(x)) == 0.0   # nothing varies within a pool


def test_residual_of_a_length_rule_is_constant_and_keeps_the_non_length_part():
    t = _table()
    log_len = np.log(t["n_chars"])
    resid, beta = residualize_within_pool(t["instance_id"], -log_len, log_len)
    assert beta == pytest.approx(-1.0) and np.allclose(resid, 0.0)
    # label signal plus a length term: the residual keeps the label part, so its AUC is 1
    score = t["label"] - 0.3 * log_len
    resid, beta = residualize_within_pool(t["instance_id"], score, log_len)
    assert within_pool_auc(t["instance_id"], t["label"], resid).auc > 0.95


def test_outcome_reads_the_interval():
    assert outcome({"lo": 0.01, "hi": 0.2}) == "higher"
    assert outcome({"lo": -0.2, "hi": -0.01}) == "lower"
    assert outcome({"lo": -0.1, "hi": 0.1}) == "undetermined"
    assert outcome({"lo": None, "hi": None}) == "unavailable" and outcome(None) == "unavailable"


def test_post_hoc_marks_the_stacks_and_the_defaults_only():
    assert is_post_hoc("variant:stack:length") and is_post_hoc("default") and is_post_hoc("sweep:x:default")
    assert not is_post_hoc("latentsift") and not is_post_hoc("variant:probe")


def test_auc_comparisons_find_a_perfect_score_and_a_length_only_score():
    t = _table()
    rng = np.random.default_rng(3)
    scores = {"perfect": t["label"] + 0.0, "length_only": -np.log(t["n_chars"]) * 2.0,
              REF_RANDOM: rng.normal(size=t["label"].size), REF_LENGTH_RULE: -t["n_chars"].astype(float)}
    out = auc_comparisons(t, scores, n_boot=200, seed=0, adjusted_level=0.99)
    assert set(out["scores"]) == {"perfect", "length_only"}
    perfect = out["scores"]["perfect"]
    assert perfect["auc"]["auc"] == 1.0
    assert perfect["vs"][REF_RANDOM]["outcome"] == "higher"
    assert perfect["length_removed"]["outcome"] == "higher"
    adj = perfect["vs"][REF_RANDOM]["adjusted"]
    assert adj["level"] == 0.99 and adj["lo"] <= perfect["vs"][REF_RANDOM]["lo"]    # wider at the higher level
    lo = out["scores"]["length_only"]
    assert lo["vs"][REF_LENGTH_RULE]["estimate"] == 0.0                           # the same order as the rule
    assert lo["length_removed"]["auc"]["auc"] == 0.5                               # nothing left beyond length
    assert winner(out) == "perfect"


def test_token_savings_difference_is_paired_and_exact_on_constant_tokens():
    ledger = []
    for i in range(10):
        for f, tok in (("ef_verifier", 200.0), (REF_LENGTH_RULE, 100.0), ("mine", 50.0)):
            ledger.append({"instance_id": f"i{i}", "k": 4, "filter": f, "ef_tokens": tok, "testgen_tokens": 0.0})
    out = token_savings_difference(ledger, ["mine"], "ef_verifier", n_boot=100, seed=0)
    d = out["mine"]["4"]
    # saving(mine) = 1 - 50/200 = 0.75, saving(shortest) = 0.5: +0.25 in every resample
    assert d["a"] == pytest.approx(0.75) and d["b"] == pytest.approx(0.5)
    assert d["estimate"] == pytest.approx(0.25) and d["lo"] == pytest.approx(0.25) and d["outcome"] == "higher"


def test_ledger_difference_of_best_at_k():
    ledger = [{"instance_id": f"i{i}", "k": 3, "filter": f, "best": v}
              for i in range(8) for f, v in (("a", 1.0 if i < 6 else 0.0), ("ref", 0.5))]
    d = ledger_difference(ledger, "best", "ref", n_boot=200, seed=0)["a"]["3"]
    assert d["estimate"] == pytest.approx(0.75 - 0.5)
    assert ledger_difference(ledger, "best", "ref", n_boot=50, seed=0)["ref"]["3"]["estimate"] == 0.0


def test_split_pools_by_agent_and_the_sub_pool_scorer():
    pools = [PoolSpec("x", ("a1", "a2", "b1", "b2", "b3"), 7.0), PoolSpec("y", ("a3", "b4"))]
    agent = {t: t[0] for p in pools for t in p.traj_ids}
    subs, base = split_pools_by_agent(pools, agent)
    assert [(p.instance_id, p.traj_ids) for p in subs] == [(sub_pool_id("x", "a"), ("a1", "a2")),
                                                           (sub_pool_id("x", "b"), ("b1", "b2", "b3"))]
    assert subs[0].testgen_tokens == 7.0 and base == {"x@a": "x", "x@b": "x"}   # 'y' has no sub-pool of 2+
    calls = []
    scorer = SubPoolScorer(lambda iid, ids: calls.append((iid, tuple(ids))) or {t: 0.0 for t in ids}, base)
    assert scorer("x@b", ["b1", "b3"]) == {"b1": 0.0, "b3": 0.0} and calls == [("x", ("b1", "b3"))]


# ----------------------------------------------------------------------------- the tiny run

def test_tiny_run_holds_the_decision_and_single_agent_sections(tiny_run):
    s = json.loads(tiny_run["summary"])
    dec, sa = s["decision"], s["single_agent"]
    # the paper's method against shortest_chars: the same paired difference as the selection diagnostics
    # (same table, scores, seed and resamples)
    old = s["selection"]["diagnostics"]["scores"]["latentsift"]["vs_reference"]
    new = dec["auc"]["scores"]["latentsift"]["vs"][REF_LENGTH_RULE]
    assert (new["estimate"], new["lo"], new["hi"]) == (old["estimate"], old["lo"], old["hi"])
    m = dec["multiplicity"]
    assert m["n_auc_intervals"] == len(dec["auc"]["scores"]) * (len(dec["auc"]["references"]) + 1)
    assert m["bonferroni_level"] == pytest.approx(1 - 0.05 / m["n_auc_intervals"])
    # single-agent pools: one agent each, a pool id '<instance>@<agent>', every candidate of the run counted once
    trajs = [json.loads(l) for l in (tiny_run["out"] / "pools.jsonl").read_text().splitlines()]
    per = {}
    for t in trajs:
        per.setdefault((t["instance_id"], t["agent"]), []).append(t)
    assert sa["pools"]["n_instances"] == sum(len(v) >= 2 for v in per.values())
    assert sa["pools"]["n_candidates"] == sum(len(v) for v in per.values() if len(v) >= 2)
    assert sa["auc"]["n_pairs"] == sum(sum(t["reward"] >= 0.5 for t in v) * sum(t["reward"] < 0.5 for t in v)
                                       for v in per.values() if len(v) >= 2)
    # Stage 1 keeps max(3, floor(K/2)): with K <= 3 every candidate, so retention is 1 for every filter
    for k in sa["stage1_keeps_all"]:
        assert all(r[str(k)]["mean"] in (1.0, None) for r in sa["retention"].values())
    g = sa["shift_guard"]
    assert set(g["banks"]) | set(g["unavailable"]) == {t["agent"] for t in trajs}
    for a, b in g["banks"].items():
        assert b["false_alarms"]["repository"]["distance"]["n_pools"] > 0
        assert all(d["bank_agent"] == a for d in b["detection"].values())


def test_tiny_report_opens_with_the_verdict(tiny_run):
    s = json.loads(tiny_run["summary"])
    assert 2 <= len(s["verdict"]) <= MAX_LINES
    head = (tiny_run["report"] / "report.md").read_text().splitlines()[:17]
    # one plain sentence first (read from the run's numbers), then the verdict's numbers
    assert head[0] == "# LatentSift evaluation report" and head[2] == headline(s) and head[3] == ""
    assert head[2].startswith("Here ") and "verifier calls per pool" in head[2]
    assert head[4].startswith("**Verdict.**") and head[4:4 + len(s["verdict"])] == s["verdict"]
    assert not any(l.startswith("Settings:") for l in head[:4 + len(s["verdict"])])
    # the explorer's summary page opens the same way: the sentence, then the verdict
    page = (tiny_run["report"] / "index.html").read_text()
    assert 0 < page.index(f'<p id="headline" class="headline">{escape(headline(s))}</p>') < page.index('id="verdict"')
    text = (tiny_run["report"] / "report.md").read_text()
    assert "## The comparisons that decide" in text and "## Single-agent pools" in text


def test_filter_colours_are_one_table_then_free_colours_in_order():
    from latentsift.report.colors import FILTER_COLORS, FREE, filter_colors
    data = {"settings": {"headline": ["ef_verifier", "latentsift", "random"],
                         "filters": ["ef_verifier", "latentsift", "channels:cot", "random", "shortest_chars"]},
            "operating_points": {"filters": {"transfer:a": {}}}}
    c = filter_colors(data)
    assert list(c) == ["ef_verifier", "latentsift", "random", "channels:cot", "shortest_chars", "transfer:a"]
    assert all(c[f] == FILTER_COLORS[f] for f in ("latentsift", "ef_verifier", "random", "shortest_chars"))
    assert c["channels:cot"] == FREE[0] and c["transfer:a"] == FREE[1] and len(set(c.values())) == 6


def test_winner_line_names_the_best_score_and_the_comparison_that_limits_it():
    from latentsift.protocol.verdict import _winner_line

    def row(auc, post, **vs):
        return {"auc": {"auc": auc}, "post_hoc": post,
                "vs": {r: {"estimate": e, "lo": lo, "hi": hi, "outcome": outcome({"lo": lo, "hi": hi})}
                       for r, (e, lo, hi) in vs.items()}}
    auc = {"scores": {"a": row(0.70, False, r1=(0.10, 0.02, 0.2), r2=(0.05, -0.01, 0.1)),
                      "b": row(0.77, True, r1=(0.15, 0.05, 0.25), r2=(0.04, -0.02, 0.1))}}
    line = _winner_line(auc, None, str)
    assert "none. Highest AUC: b (chosen after the folds were seen), 0.770" in line
    assert "vs r2 +0.040 [-0.020, +0.100] (undetermined)" in line
    line = _winner_line(auc, "a", str)
    assert line.startswith("- Winner by the rule: a, AUC 0.700; vs r2 ")
