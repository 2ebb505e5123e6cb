"""The shift guard: a sifter from one agent's trajectories, pools from the same or another agent.

Reuses the session's tiny end-to-end run (conftest ``tiny_run``): states of AutoCodeRover and
SWE-agent candidates on django (bank) and pytest (pools).
"""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from latentsift._core.validation import LatentSiftError
from latentsift.cli import app
from latentsift.deploy.shift import Reference, bank_vectors, loo_distances, ordered_row_sums
from latentsift._jobs.sifter import fit_sifter, run_sifter_filter
from latentsift.deploy.sifter import Sifter
from latentsift.trajectories.trajectory import load_jsonl, save_jsonl

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def acr_sifter(tiny_run, tmp_path_factory, one_torch_thread):
    run = tiny_run["out"]
    d = tmp_path_factory.mktemp("shift")
    trajs = load_jsonl(run / "pools.jsonl")
    bank = [t for t in trajs if t.repo == "django/django" and t.agent == "acr"]
    save_jsonl(bank, d / "acr_bank.jsonl")
    save_jsonl([t for t in trajs if t.repo != "django/django" and t.agent == "acr"], d / "acr_pools.jsonl")
    save_jsonl([t for t in trajs if t.repo != "django/django" and t.agent == "sweagent"], d / "swe_pools.jsonl")
    save_jsonl([t for t in trajs if t.repo != "django/django"], d / "mixed_pools.jsonl")  # both agents, K = 6
    hidden = [t for t in trajs if t.repo != "django/django" and t.agent == "sweagent"]
    for t in hidden:  # SWE-agent trajectories that claim to be AutoCodeRover's: only the states can tell
        t.agent, t.source_format = "acr", "r2egym"
    save_jsonl(hidden, d / "hidden_pools.jsonl")
    fit_sifter(d / "acr_bank.jsonl", run / "states", d / "sifter", scorer_epochs=2, log=lambda m: None)
    return d, run / "states"


def test_reference_is_the_banks_pools_scored_against_the_rest(acr_sifter):
    d, _ = acr_sifter
    s = Sifter.load(d / "sifter")
    ids, vecs = bank_vectors(s.bank)
    loo = loo_distances(ids, vecs, s.bank.instances_)
    assert len(ids) == 9 and len(loo) == 9 and np.all(loo > 0)
    # one repository (django): no leave-one-repository-out reference, the instance rule is used
    assert s.reference_.kind == "instance" and s.reference_.false_alarm == 0.05
    inst = np.array([s.bank.instances_[t] for t in ids])
    med = np.array([np.median(loo[inst == i]) for i in sorted(set(inst))])  # one statistic per bank pool
    assert s.reference_.pool_medians == pytest.approx(med.tolist())
    ref = Reference.from_bank(s.bank, agents=["acr"], scaffolds=["r2egym"], false_alarm=0.2)
    assert ref.loo_quantile == pytest.approx(np.quantile(med, 0.8)) and ref.quantile == pytest.approx(0.8)
    assert s.reference_.loo_quantile == pytest.approx(np.quantile(med, 0.95))
    assert s.reference_.agents == ["acr"] and s.reference_.scaffolds == ["acr"]  # the data's scaffold, not the file format
    with pytest.raises(LatentSiftError, match="false_alarm"):
        Reference.from_bank(s.bank, false_alarm=0.0)


def test_guard_fires_on_another_agent_and_stays_quiet_on_the_banks(acr_sifter):
    d, states = acr_sifter
    same, w_same = run_sifter_filter(d / "acr_pools.jsonl", states, d / "sifter")
    other, w_other = run_sifter_filter(d / "swe_pools.jsonl", states, d / "sifter")
    assert w_same == [] and same.extra["shift"]["n_shifted"] == 0
    (sh,) = other.extra["shift"]["pools"]
    assert sh["shifted"] and sh["unseen_agents"] == ["sweagent"] and sh["unseen_scaffolds"] == ["sweagent"]
    assert len(w_other) == 1 and "absent from the bank" in w_other[0]
    # the numbers behind the decision: SWE-agent candidates lie further from the ACR bank
    (q,) = same.extra["shift"]["pools"]
    assert sh["median_nearest_bank_distance"] > q["median_nearest_bank_distance"]
    assert sh["threshold"] == q["threshold"] == pytest.approx(same.extra["shift"]["reference"]["loo_quantile"])
    assert set(sh["nearest_bank_distance"]) == {c.traj_id for p in other.pools for c in p.candidates}
    # hidden metadata: the agent check is silent, the state-space numbers are still reported
    hid, _ = run_sifter_filter(d / "hidden_pools.jsonl", states, d / "sifter")
    (h,) = hid.extra["shift"]["pools"]
    assert h["unseen_agents"] == [] and h["median_nearest_bank_distance"] == sh["median_nearest_bank_distance"]


def test_each_on_shift_mode(acr_sifter):
    d, states = acr_sifter
    args = ["filter", str(d / "mixed_pools.jsonl"), "--states", str(states), "--sifter", str(d / "sifter")]
    r = CliRunner().invoke(app, args + ["--out", str(d / "warn.json")])
    assert r.exit_code == 0 and "shift (warn)" in r.output
    warn = json.loads((d / "warn.json").read_text())
    assert warn["shift"]["pools"][0]["action"] == "warned" and warn["pools"][0]["n_keep"] == 3  # max(3, 6 // 2)
    r = CliRunner().invoke(app, args + ["--out", str(d / "keep.json"), "--on-shift", "keep-all"])
    assert r.exit_code == 0
    keep = json.loads((d / "keep.json").read_text())
    assert keep["pools"][0]["n_keep"] == 6 == len(keep["pools"][0]["candidates"]) == len(keep["pools"][0]["retained"])
    assert keep["shift"]["pools"][0]["action"].startswith("stage 1 skipped")
    assert [c["s"] for c in keep["pools"][0]["candidates"]] == [c["s"] for c in warn["pools"][0]["candidates"]]
    r = CliRunner().invoke(app, args + ["--out", str(d / "err.json"), "--on-shift", "error"])
    assert r.exit_code == 2 and "out of the bank's distribution" in r.output  # a message, no traceback
    assert not (d / "err.json").exists()
    # quiet pools pass under every mode, unchanged
    r = CliRunner().invoke(app, ["filter", str(d / "acr_pools.jsonl"), "--states", str(states), "--sifter",
                                 str(d / "sifter"), "--out", str(d / "ok.json"), "--on-shift", "error"])
    assert r.exit_code == 0 and json.loads((d / "ok.json").read_text())["shift"]["n_shifted"] == 0
    with pytest.raises(LatentSiftError, match="'on_shift' parameter of filter"):
        run_sifter_filter(d / "acr_pools.jsonl", states, d / "sifter", on_shift="ignore")


def test_a_bare_bank_gets_the_state_space_check(acr_sifter):
    """`filter --bank` (no sifter): the bank records no agents, so only the distances decide."""
    from latentsift._jobs.filter import run_filter

    d, states = acr_sifter
    kw = dict(bank_dir=d / "sifter" / "bank", scorer_dir=d / "sifter" / "scorer")
    with_sifter, _ = run_sifter_filter(d / "hidden_pools.jsonl", states, d / "sifter")
    hid = run_filter(d / "hidden_pools.jsonl", states, on_shift="warn", **kw)
    (h,), (ref,) = hid.extra["shift"]["pools"], with_sifter.extra["shift"]["pools"]
    assert hid.extra["shift"]["reference"]["agents"] is None and h["unseen_agents"] == []
    assert h["median_nearest_bank_distance"] == pytest.approx(ref["median_nearest_bank_distance"])
    assert h["shifted"] and all("nearest-bank distance" in r for r in h["reasons"])
    assert hid.extra["shift"]["warnings"] and h["action"] == "warned"
    same = run_filter(d / "acr_pools.jsonl", states, on_shift="error", **kw)
    assert same.extra["shift"]["n_shifted"] == 0
    keep = run_filter(d / "hidden_pools.jsonl", states, on_shift="keep-all", **kw)
    assert all(c.retained for p in keep.pools for c in p.candidates)
    assert "shift" not in run_filter(d / "hidden_pools.jsonl", states, **kw).extra  # no guard unless asked


def test_ordered_row_sums_are_np_add_at_bit_for_bit():
    rng = np.random.default_rng(3)
    n, rows = 7, (rng.standard_normal((400, 5)) * 10.0 ** rng.integers(-6, 6, (400, 1))).astype(np.float32)
    rows[:3] = -0.0  # a sum that is -0.0 from a copy but 0.0 from 0.0 + -0.0
    owner = rng.integers(1, n - 1, 400)  # owner n - 1 has no rows
    owner[:3] = 0  # owner 0: exactly the -0.0 rows
    ref, cnt = np.zeros((n, 5)), np.zeros(n, dtype=np.int64)
    np.add.at(ref, owner, rows)
    np.add.at(cnt, owner, 1)
    sums, counts = ordered_row_sums(rows, owner, n)
    assert sums.tobytes() == ref.tobytes() and np.array_equal(counts, cnt) and counts[-1] == 0
    assert not np.signbit(sums[0]).any()  # 0.0 + -0.0, as add.at gives
    assert sums.tobytes() != ordered_row_sums(rows[::-1], owner[::-1], n)[0].tobytes()  # the order is kept
    empty = ordered_row_sums(np.zeros((0, 5), np.float32), np.zeros(0, np.int64), 3)
    assert empty[0].shape == (3, 5) and not empty[0].any() and not empty[1].any()
