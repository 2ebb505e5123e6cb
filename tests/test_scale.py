"""Scale-out on Ray: a local loopback cluster of 2 workers gives the same states, distances,
owners, scores and retained sets as one process; failures end with clear errors and valid stores."""
from __future__ import annotations

import numpy as np
import pytest

ray = None  # imported by the cluster fixture (the Ray tests skip without the extra)

from latentsift import LatentSiftError  # noqa: E402
from latentsift.bank.bank import Bank  # noqa: E402
from latentsift.states.model import load_policy  # noqa: E402
from latentsift.scale.backends import open_backend  # noqa: E402
from latentsift.states.extract import LocalExtractionBackend, extract_pools  # noqa: E402
from latentsift.scale import RayBackend, connect, shard_bank  # noqa: E402
from latentsift.scale.extract import ACTOR_PREFIX  # noqa: E402
from latentsift.sift.sift import LatentSift  # noqa: E402
from latentsift.states.states import TrajectoryStates  # noqa: E402
from latentsift.states.store import StateStore  # noqa: E402
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS, Pool, Step, Trajectory  # noqa: E402

from synthetic import FP, make_states  # noqa: E402  (tests/synthetic.py)

EXTRACT = dict(max_tokens=384, max_span_tokens=24, max_prompt_tokens=48, store_dtype="float32", shard_size=2)


@pytest.fixture(scope="module")
def cluster(one_torch_thread):
    global ray
    ray = pytest.importorskip("ray", reason='the Ray tests need the extra: pip install -e ".[ray]"')
    r = connect("local", num_cpus=2)  # loopback only, no dashboard
    yield r
    r.shutdown()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, policy):
    """A randomly initialised 2-layer Llama with the packaged model's tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    policy.tokenizer.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(policy.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def trajs(data_dir):
    from latentsift.trajectories.importers import import_paths

    return import_paths(data_dir / "r2egym" / "acr-run-1.jsonl.gz").trajectories[:5]


@pytest.fixture(scope="module")
def single(tiny_model, trajs, tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("single") / "states"
    pol = load_policy(tiny_model, dtype="float32", device="cpu")
    extract_pools(pol, trajs, out, **EXTRACT)
    return StateStore(out).open()


def on_ray(model, workers: int = 2) -> RayBackend:
    return RayBackend(model, workers=workers, dtype="float32", device="cpu")


def assert_same_store(a: StateStore, b: StateStore):
    assert sorted(a.traj_ids()) == sorted(b.traj_ids())
    b.verify()
    sa, sb = a.load(), b.load()
    for t in sa:
        assert np.array_equal(sa[t].layers, sb[t].layers), t  # bitwise, float32
        assert np.array_equal(sa[t].step, sb[t].step) and np.array_equal(sa[t].channel, sb[t].channel)
        assert sa[t].n_tokens == sb[t].n_tokens
        assert a.instance_of(t) == b.instance_of(t)


def test_two_workers_give_the_single_process_states(cluster, tiny_model, trajs, single, tmp_path):
    rep = extract_pools(on_ray(tiny_model), trajs, tmp_path / "s", **EXTRACT)
    assert (rep.n_extracted, rep.n_skipped) == (5, 0) and len(rep.shards) == 3
    assert rep.n_tokens == sum(t["n_tokens"] for t in single.trajectories())
    store = StateStore(tmp_path / "s").open()
    assert store.fingerprint == single.fingerprint and store.settings["layers"] == single.settings["layers"]
    assert_same_store(single, store)
    assert not list((tmp_path / "s" / "shards").glob("*.tmp"))


def test_one_driver_runs_the_backend_the_options_name(cluster, tiny_model, trajs, single, tmp_path):
    local = open_backend(tiny_model, dtype="float32", device="cpu")
    remote = open_backend(tiny_model, dtype="float32", device="cpu", ray_address="local", workers=2)
    assert isinstance(local, LocalExtractionBackend) and isinstance(remote, RayBackend) and remote.workers == 2
    reports = {name: extract_pools(b, trajs[:3], tmp_path / name, **EXTRACT)
               for name, b in (("local", local), ("ray", remote))}
    assert [(r.n_extracted, r.n_tokens, len(r.shards)) for r in reports.values()] == [(3, reports["local"].n_tokens, 2)] * 2
    assert_same_store(StateStore(tmp_path / "local").open(), StateStore(tmp_path / "ray").open())
    with pytest.raises(LatentSiftError, match="--dtype"):
        open_backend(tiny_model, dtype="int8", ray_address="local")  # checked before any worker starts


def test_killed_worker_loses_only_its_batch_and_a_rerun_completes(cluster, tiny_model, trajs, single, tmp_path):
    killed = []

    def progress(p):
        if p.done and not killed:  # after the first commit, kill a worker (its batch may be in flight)
            name = next(n for n in sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True))
                        if n.startswith(ACTOR_PREFIX))
            ray.kill(ray.get_actor(name))
            killed.append(name)

    rep = extract_pools(on_ray(tiny_model), trajs, tmp_path / "s", progress=progress, **EXTRACT)
    assert killed and rep.n_extracted == 5
    again = extract_pools(on_ray(tiny_model), trajs, tmp_path / "s", **EXTRACT)
    assert (again.n_extracted, again.n_skipped) == (0, 5)
    assert_same_store(single, StateStore(tmp_path / "s").open())
    # a shard truncated after the run is not trusted on a resume over Ray: its trajectories are redone
    store = StateStore(tmp_path / "s").open()
    shard = sorted((tmp_path / "s" / "shards").glob("*.safetensors"))[0]
    lost = sorted(t["traj_id"] for t in store.trajectories() if t["shard"] == shard.name)
    shard.write_bytes(shard.read_bytes()[:100])
    redo = extract_pools(on_ray(tiny_model), trajs, tmp_path / "s", **EXTRACT)
    assert lost and (redo.n_extracted, redo.n_skipped) == (len(lost), 5 - len(lost))
    assert_same_store(single, StateStore(tmp_path / "s").open())


def test_bad_input_ends_with_clear_errors_and_a_valid_store(cluster, tiny_model, trajs, single, tmp_path):
    import shutil

    dst = tmp_path / "s"
    shutil.copytree(single.path, dst)
    n = len(StateStore(dst).open())
    with pytest.raises(LatentSiftError, match="No Ray head answers at 127.0.0.1:9"):
        extract_pools(RayBackend(tiny_model, ray_address="127.0.0.1:9", workers=1), trajs, dst, **EXTRACT)
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(LatentSiftError, match="could not load the model"):
        extract_pools(RayBackend(broken, workers=1), trajs, dst, **EXTRACT)
    from typer.testing import CliRunner

    from latentsift.cli import app
    from latentsift.trajectories.trajectory import save_jsonl

    save_jsonl(trajs, tmp_path / "pools.jsonl")
    with StateStore(dst).lock():  # another writer holds the store
        with pytest.raises(LatentSiftError, match="Another process is writing"):
            extract_pools(on_ray(tiny_model, workers=1), trajs, dst, **EXTRACT)
        res = CliRunner().invoke(app, ["extract", str(tmp_path / "pools.jsonl"), "--out", str(dst), "--model",
                                       str(tiny_model), "--ray", "local", "--workers", "2", "--max-tokens", "384"])
        assert res.exit_code == 2 and "Another process is writing" in res.output  # a message, no traceback
    store = StateStore(dst).open()
    assert len(store) == n and store.verify() >= 1
    assert_same_store(single, store)


# ------------------------------------------------------------------ sharded bank search


@pytest.fixture(scope="module")
def world():
    """A bank with exact duplicate trajectories (ties across shards) and 3 pools of 6 candidates."""
    rng = np.random.default_rng(0)
    states, labels, inst, repos = {}, {}, {}, {}
    for i in range(30):
        t = f"bank/b{i:02d}"
        y = int(i % 2 == 0)
        states[t] = make_states(t, rng, 1.0 if y else -1.0, 2 + i % 4, 40)
        labels[t], inst[t], repos[t] = y, f"bankrepo__{i}", "org/bankrepo"
    for i in (0, 1):  # copies sort after the originals: their rows lie in the last shard
        t = f"bank/z-copy-of-{i:02d}"
        src = states[f"bank/b{i:02d}"]
        states[t] = TrajectoryStates(t, src.layers.copy(), src.step, src.channel, src.n_tokens)
        labels[t], inst[t], repos[t] = labels[f"bank/b{i:02d}"], f"copy__{i}", "org/bankrepo"
    bank = Bank().fit(states, labels, inst, repos, FP)
    pools, cand = [], {}
    for p in range(3):
        cs = []
        for k in range(6):
            t = f"run{k}/evalrepo__{p}"
            q = [1.2, 0.8, 0.3, -0.3, -0.8, -1.2][(k + p) % 6]
            cand[t] = make_states(t, rng, q, 2 + (k * 3 + p) % 5, 40)
            steps = [Step(cot="c", fn="f", obs="o") for _ in range(2 + (k * 3 + p) % 5)]
            cs.append(Trajectory(traj_id=t, instance_id=f"evalrepo__{p}", repo="org/evalrepo", task_prompt="x",
                                 steps=steps, reward=float(q > 0)))
        pools.append(Pool(f"evalrepo__{p}", cs))
    return bank, pools, cand, states


def test_sharded_search_gives_the_same_distances_and_owners(cluster, world):
    bank, pools, cand, bank_states = world
    sharded = shard_bank(bank, 2)
    try:
        for c in CHANNELS:
            # queries: candidates' states and the bank's own duplicated rows (exact ties across shards)
            z = np.concatenate([bank_states["bank/b00"].distance_states()[bank_states["bank/b00"].channel ==
                                                                            CHANNEL_ID[c]]] +
                               [s.distance_states()[s.channel == CHANNEL_ID[c]] for s in cand.values()])
            want, got = bank.distances(z, c), sharded.distances(z, c)
            for w, g in zip(want, got):
                assert np.array_equal(w, g)
            n_tied = (bank_states["bank/b00"].channel == CHANNEL_ID[c]).sum()
            assert np.all(got[0][:n_tied] == 0)
            assert set(sharded.owner(c, "pos", got[2][:n_tied])) == {"bank/b00"}  # the first row wins the tie
    finally:
        sharded.close()


def test_filter_on_a_sharded_bank_gives_the_same_scores_and_retained_sets(cluster, world):
    bank, pools, cand, _ = world
    want = [r.to_dict() for r in LatentSift(bank, branches="distance").score_pools(pools, cand, fingerprint=FP)]
    sharded = shard_bank(bank, 2)
    try:
        got = [r.to_dict() for r in LatentSift(sharded, branches="distance").score_pools(pools, cand, fingerprint=FP)]
    finally:
        sharded.close()
    assert got == want
    assert [r["retained"] for r in got] == [r["retained"] for r in want] and all(r["retained"] for r in got)


def test_approximate_backend_reports_recall_and_keeps_retention(world):
    pytest.importorskip("faiss", reason='the approximate backend needs faiss-cpu: pip install -e ".[faiss]"')
    from latentsift.scale.approx import approx_bank, recall_at_1

    bank, pools, cand, _ = world
    want = LatentSift(bank, branches="distance").score_pools(pools, cand, fingerprint=FP)
    z = np.concatenate([s.distance_states()[s.channel == CHANNEL_ID["cot"]] for s in cand.values()])
    d, _, i, _ = bank.distances(z, "cot")
    for kind in ("ivf", "hnsw"):
        ab = approx_bank(bank, kind)
        da, _, ia, _ = ab.distances(z, "cot")
        assert np.all(da >= d - 1e-6)  # an approximate row is never nearer than the exact one
        assert recall_at_1(ia, i, d, da) == 1.0  # a small bank: every cell probed, the graph exact
        got = LatentSift(ab, branches="distance").score_pools(pools, cand, fingerprint=FP)
        assert [r.retained for r in got] == [r.retained for r in want]
