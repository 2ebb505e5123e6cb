"""The high-probability keep rule (Learn then Test) and saved operating points: fit once, filter many times."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import refused

from latentsift import LatentSiftError
from latentsift.sift.keep import RecallKeep
from latentsift.trajectories.trajectory import Step, Trajectory, save_jsonl
from synthetic import FP, make_states
from test_operating import _cli, synthetic_pools


# ---------------------------------------------------------------------- the high-probability mode (Learn then Test)
def _miss_scores(rng, n_pools, k=6, signal=1.5):
    """Pool miss scores (``pool_miss_score`` with min_keep 1, vectorised) of synthetic pools holding a
    resolved candidate (the pools ``synthetic_pools`` draws, those without one dropped)."""
    q = rng.standard_normal((n_pools, k))
    y = rng.random((n_pools, k)) < 1 / (1 + np.exp(-(2 * q - 1.5)))
    s = signal * q + rng.standard_normal((n_pools, k))
    top_resolved = y[np.arange(n_pools), s.argmax(axis=1)]
    u = np.where(top_resolved, np.inf, np.where(y, s, -np.inf).max(axis=1))
    return u[y.any(axis=1)]


@pytest.mark.parametrize("target,confidence", [(0.8, 0.9), (0.9, 0.8)])
def test_confident_mode_holds_its_recall_with_the_stated_probability_over_many_seeds(target, confidence):
    """What is tested: P(pool recall >= R) >= 1 - delta over the draw of the calibration pools. 3000 runs,
    each a fresh calibration set of 80 pools; a run's pool recall is that of the population of new pools
    (200 000 pools drawn once: recall(tau) = share of their miss scores >= tau). The share of runs below R
    is at most delta up to 3 Monte-Carlo standard errors, while the expected mode (conformal risk control
    on the same calibration sets) falls below R far more often, as its promise allows."""
    from latentsift.sift.keep import crc_threshold
    from latentsift.sift.keep_confident import ltt_threshold
    rng = np.random.default_rng(11)
    pop = np.sort(_miss_scores(rng, 200_000))
    recall = lambda tau: 1.0 - np.searchsorted(pop, tau, side="left") / pop.size  # noqa: E731
    runs, delta = 3000, 1 - confidence
    below_ltt, below_crc, rec_ltt = 0, 0, []
    for _ in range(runs):
        u = _miss_scores(rng, 80)
        r_ltt, r_crc = recall(ltt_threshold(u, 1 - target, delta)), recall(crc_threshold(u, 1 - target))
        below_ltt += r_ltt < target
        below_crc += r_crc < target
        rec_ltt.append(r_ltt)
    se = np.sqrt(delta * (1 - delta) / runs)
    assert below_ltt / runs <= delta + 3 * se
    assert below_crc / runs > delta + 5 * se    # the expected mode promises less, and it shows
    print(f"R={target} 1-delta={confidence}: below R {below_ltt / runs:.3f} (LTT), {below_crc / runs:.3f} (CRC)")
    assert np.mean(rec_ltt) < 0.999              # not trivially keep-all


def test_confident_rule_fits_through_the_keep_rule_interface():
    from latentsift.sift.keep import keep_rule, pool_miss_score
    from latentsift.sift.keep_confident import ConfidentRecallKeep, ltt_threshold, min_confident_pools
    assert [min_confident_pools(r, c) for r, c in ((0.9, 0.9), (0.9, 0.95), (0.95, 0.95), (0.99, 0.9))] == \
        [22, 29, 59, 230]
    rng = np.random.default_rng(4)
    cal = synthetic_pools(rng, 120)
    rule = keep_rule("confident-recall", target_recall=0.8, confidence=0.9).fit(cal)
    assert isinstance(rule, ConfidentRecallKeep)
    u = [pool_miss_score(s, y, t, 1) for s, y, t in zip(cal.scores, cal.labels, cal.traj_ids)]
    assert rule.threshold_ == ltt_threshold([x for x in u if not np.isnan(x)], 0.2, 0.1)
    assert rule.threshold_ <= RecallKeep(0.8).fit(cal).threshold_   # keeps at least as much as the expected mode
    d = rule.to_dict()
    assert d["confidence"] == 0.9 and d["n_calibration_pools_needed"] == 11 and "Learn then Test" in d["guarantee"]
    with pytest.raises(LatentSiftError, match="needs at least 22 calibration pools"):
        ConfidentRecallKeep(0.9, 0.9).fit(synthetic_pools(rng, 20))
    with pytest.raises(LatentSiftError, match="confidence"):
        ConfidentRecallKeep(0.9, 1.0)


# ---------------------------------------------------------------------- a saved operating point, reused
def _noisy_inputs(d, seed=9):
    """Synthetic states and pools with overlapping classes (a threshold strictly inside the scores): a bank
    of 30 instances, 30 calibration instances and 6 pools to filter, 4 candidates each, 5 repositories each."""
    from latentsift.states.store import StateStore
    rng = np.random.default_rng(seed)
    groups, states = {"bank": [], "cal": [], "pools": []}, {}
    for name, n in (("bank", 30), ("cal", 30), ("pools", 6)):
        for i in range(n):
            q = rng.standard_normal(4)
            y = (rng.random(4) < 1 / (1 + np.exp(-(2 * q - 0.5)))).astype(int)
            if name != "pools" and y.sum() in (0, 4):
                y[:2] = [1, 0]
            for j in range(4):
                tid = f"a{j}/{name}__{i}"
                states[tid] = make_states(tid, rng, 0.08 * q[j] + 0.04 * (2 * y[j] - 1), n_steps=3)
                steps = [Step(cot="think " * (s + 1 + j), fn=f"cmd{s}", obs="out" * (s + 2)) for s in range(3)]
                groups[name].append(Trajectory(traj_id=tid, instance_id=f"{name}__{i}", repo=f"org/{name}{i % 5}",
                                               task_prompt="fix it", steps=steps, reward=float(y[j]),
                                               agent="acr" if j % 2 else "swe"))
    store = StateStore(d / "states").create(FP, {"layers": [1, 2, 3], "store_dtype": "float32"})
    inst = {t.traj_id: t.instance_id for ts in groups.values() for t in ts}
    ids = sorted(states)
    store.write([states[t] for t in ids], [inst[t] for t in ids])
    for name, ts in groups.items():
        save_jsonl(ts, d / f"{name}.jsonl")


def test_fit_saves_an_operating_point_that_filter_applies_without_refitting(tmp_path):
    """What is tested: 'fit --target-recall R --calibration CAL' writes SIFTER/operating_point.json; 'filter
    --sifter S --target-recall R' (no --calibration) and '--operating-point FILE' apply it without scoring
    the calibration pools again, with the same threshold and the same kept sets as a refit on the same
    calibration file; --max-keep caps it; mismatches and what is not built are refused in one line."""
    d = tmp_path
    _noisy_inputs(d)
    r = _cli("fit", d / "bank.jsonl", "--states", d / "states", "--out", d / "sifter", "--scorer-epochs", "3",
             "--target-recall", "0.9", "--calibration", d / "cal.jsonl")
    assert r.exit_code == 0, r.output
    assert "needs at least 9 calibration pools holding a resolved candidate" in " ".join(r.output.split())
    rec = json.loads((d / "sifter" / "operating_point.json").read_text())
    assert rec["rule"]["n_calibration_pools"] == 30 and rec["not_guaranteed"] == []
    assert rec["calibration_pools"]["how"].startswith("split") and len(rec["calibration_fingerprint"]) == 64
    assert rec["rule"]["threshold"] is not None            # a threshold inside the scores: the rule decides
    base = ["filter", d / "pools.jsonl", "--states", d / "states", "--sifter", d / "sifter", "--on-shift", "warn"]
    runs = {}
    for name, extra in (("refit", ["--target-recall", "0.9", "--calibration", d / "cal.jsonl"]),
                        ("saved", ["--target-recall", "0.9"]),
                        ("file", ["--operating-point", d / "sifter" / "operating_point.json"])):
        r = _cli(*base, *extra, "--out", d / f"{name}.json")
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((d / f"{name}.json").read_text())
        if name != "refit":
            assert "applied without refitting" in " ".join(r.output.split())
    op = {k: v["operating_point"] for k, v in runs.items()}
    assert op["refit"]["refitted"] and not op["saved"]["refitted"] and not op["file"]["refitted"]
    for k in ("saved", "file"):
        assert op[k]["threshold"] == op["refit"]["threshold"] and op[k]["calibration"] == op["refit"]["calibration"]
        assert [p["retained"] for p in runs[k]["pools"]] == [p["retained"] for p in runs["refit"]["pools"]]
        assert op[k]["calibration_pools"]["calibration_fingerprint"] == rec["calibration_fingerprint"]
    kept = [p["n_keep"] for p in op["saved"]["pools"]]
    assert 1 <= min(kept) and max(kept) >= 2 and sum(kept) < 24   # decides per pool, keeps fewer than all
    # the library: the same in three lines (docs/operating.md)
    from latentsift.deploy import Sifter, load_operating_point
    from latentsift.sift.sift import load_selected_pools
    from latentsift.states.store import StateStore
    pools = load_selected_pools(d / "pools.jsonl")
    sifter, (rule, _) = Sifter.load(d / "sifter"), load_operating_point(d / "sifter" / "operating_point.json",
                                                                        sifter_dir=d / "sifter")
    results = sifter.score_pools(pools, StateStore(d / "states").open())
    kept_lib = [rule.keep([c.s for c in r.candidates], [c.traj_id for c in r.candidates]) for r in results]
    assert [int(m.sum()) for m in kept_lib] == [p["n_keep"] for p in op["saved"]["pools"]]
    # --max-keep 1: every pool keeps one; a pool the cap cut is not guaranteed and says why
    r = _cli(*base, "--target-recall", "0.9", "--max-keep", "1", "--out", d / "cap.json")
    assert r.exit_code == 0, r.output
    cap = json.loads((d / "cap.json").read_text())["operating_point"]
    assert [p["n_keep"] for p in cap["pools"]] == [1] * 6 and cap["max_keep"] == 1
    for p, k in zip(cap["pools"], kept):
        assert ("capped at --max-keep 1" in p["not_guaranteed"]) == (k > 1)
    # refusals, before any work
    for extra, words in ((["--target-recall", "0.95"], ("is for --target-recall 0.9", "not 0.95")),
                         (["--target-recall", "0.9", "--confidence", "0.9"], ("no --confidence 0.9 rule",)),
                         (["--target-recall", "0.9", "--cost", "tokens"], ("--cost tokens needs", "token count")),
                         (["--max-keep", "2"], ("--max-keep caps the recall-targeted rule",)),
                         (["--target-recall", "0.9", "--bank-choice", "nearest"],
                          ("needs a threshold per sub-bank", "use --bank-choice all")),
                         (["--operating-point", d / "sifter" / "operating_point.json", "--calibration", d / "cal.jsonl"],
                          ("not both",))):
        refused(_cli(*base, *extra, "--out", d / "x.json"), *words)
        assert not (d / "x.json").exists()
    refused(_cli("filter", d / "cal.jsonl", "--states", d / "states", "--sifter", d / "sifter", "--target-recall",
                 "0.9", "--out", d / "x.json"), "also pools to filter")
    refused(_cli("filter", d / "pools.jsonl", "--method", "shortest-chars", "--operating-point",
                 d / "sifter" / "operating_point.json", "--out", d / "x.json"), "pass --sifter")


def test_fit_holds_its_writer_lock_over_the_sifter_and_its_operating_point(tmp_path, monkeypatch):
    """What is tested: 'fit --target-recall' writes the operating point under the same writer lock as the
    sifter (a second 'fit' to the same --out could otherwise slip in between the two): while the operating
    point is fitted, taking the output's lock is refused."""
    from latentsift._core.io import output_lock
    from latentsift._jobs import operating

    d = tmp_path
    _noisy_inputs(d)
    seen = []
    real = operating.fit_operating_point_file

    def probe(sifter_dir, *a, **kw):
        try:
            with output_lock(sifter_dir):
                seen.append("free")
        except LatentSiftError as e:
            seen.append(str(e))
        return real(sifter_dir, *a, **kw)

    monkeypatch.setattr(operating, "fit_operating_point_file", probe)
    r = _cli("fit", d / "bank.jsonl", "--states", d / "states", "--out", d / "sifter", "--scorer-epochs", "3",
             "--target-recall", "0.9", "--calibration", d / "cal.jsonl")
    assert r.exit_code == 0, r.output
    assert len(seen) == 1 and seen[0].startswith("Another process is writing to"), seen
    assert (d / "sifter" / "operating_point.json").is_file() and not (d / ".sifter.lock").exists()
