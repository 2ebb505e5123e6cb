"""Synthetic per-step states for tests that need banks and pools without the model: each state is
noise plus ``quality`` times a fixed direction, so good and bad trajectories separate."""
from __future__ import annotations

import numpy as np

from latentsift.states.model import Fingerprint
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS

L, D = 3, 8
FP = Fingerprint("TestArch", L, D, "tok", "tpl", "w", "float32")
#: Another model of the same shape (a proxy encoder of the same candidates).
PROXY_FP = Fingerprint("ProxyArch", L, D, "tok2", "tpl2", "w2", "float32")
DIRECTION = np.linspace(-1, 1, D).astype(np.float32)


def make_states(tid: str, rng, quality: float, n_steps: int, tokens_per_step: int = 50) -> TrajectoryStates:
    """``n_steps`` steps of the three channels, (n_spans, L, D) states."""
    steps = [t for t in range(n_steps) for _ in CHANNELS]
    chans = [CHANNEL_ID[c] for _ in range(n_steps) for c in CHANNELS]
    layers = 0.3 * rng.standard_normal((len(steps), L, D)).astype(np.float32) + np.float32(quality) * DIRECTION
    return TrajectoryStates(tid, layers, np.array(steps, np.int32), np.array(chans, np.int8),
                            n_tokens=tokens_per_step * n_steps)


def write_single_policy(folder, *, n_instances: int = 16, k: int = 4, agent: str = "policy-a",
                        repo: str = "humaneval", mixed: int | None = None, seed: int = 0, prefix: str = "HumanEval",
                        examples: bool = False, rollout_records: bool = False, fingerprint: Fingerprint = FP,
                        policy: str | None = None):
    """A one-agent, one-repository data set as a team has it (HumanEval-like tasks): ``folder/pools.jsonl``
    (canonical labelled pools, K candidates per task) and ``folder/states`` (a state store of synthetic
    states: resolved candidates lean along ``DIRECTION``). ``mixed``: how many tasks have both outcomes
    (default all); the others alternate all-resolved / all-unresolved. ``examples``: each candidate's
    ``tests["examples_passed"]`` is its label (perfect generated tests). ``rollout_records``: each candidate has
    the records of ``latentsift rollout`` the premise's free references read (a patch, and the tokens generated
    per step in ``meta["tokens"]``). ``fingerprint``: the store's model; ``policy``: recorded as each candidate's
    ``meta["policy"]`` (as a rollout records the policy's fingerprint digest). Returns (pools path, states path)."""
    from pathlib import Path

    from latentsift.trajectories.trajectory import Step, Trajectory

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    mixed = n_instances if mixed is None else mixed
    trajs, states = [], {}
    for i in range(n_instances):
        inst = f"{prefix}/{i}"
        for j in range(k):
            label = int(j < k // 2) if i < mixed else int(i % 2 == 0)
            tid = f"{agent}/{inst}/{j}"
            n_steps = 1 + (i + j) % 3
            states[tid] = make_states(tid, rng, (0.6 if label else -0.6) + 0.3 * rng.standard_normal(), n_steps)
            steps = [Step(cot="think " * (1 + (i * 7 + j * 3 + s) % 11), fn=f"run_examples({s})",
                          obs="ok " * (2 + (i + 5 * j + s) % 7),
                          meta={"tokens": 3 + (i * 7 + j * 3 + s) % 11} if rollout_records else {})
                     for s in range(n_steps)]
            trajs.append(Trajectory(traj_id=tid, instance_id=inst, repo=repo, task_prompt=f"Write task {i}.",
                                    steps=steps, reward=float(label), agent=agent, run=agent,
                                    tests={"examples_passed": float(label)} if examples else {},
                                    patch="x = 1\n" * (1 + (i + 3 * j) % 5) if rollout_records else "",
                                    meta={} if policy is None else {"policy": policy}))
    return write_runs(folder, trajs, states, fingerprint)


def labelled_runs(*, signal: str, n_repos: int = 4, n_instances: int = 6, k: int = 4, seed: int = 0):
    """Labelled pools of several repositories (mixed pools: half of each pool resolved) and their synthetic
    states, with the signal planted in one place only: ``signal="length"``: resolved candidates are shorter
    (fewer characters and steps) and their states carry no outcome; ``signal="states"``: resolved states lean
    along ``DIRECTION`` and the lengths are drawn independently of the outcome. Returns (trajectories, states)."""
    from latentsift.trajectories.trajectory import Step, Trajectory

    if signal not in ("length", "states"):
        raise ValueError(signal)
    rng = np.random.default_rng(seed)
    trajs, states = [], {}
    for r in range(n_repos):
        for i in range(n_instances):
            inst = f"repo{r}__task-{i}"
            for j in range(k):
                label = int(j < k // 2)
                tid = f"agent/{inst}/{j}"
                if signal == "length":
                    n_steps, words = (2, 3 + j) if label else (3, 9 + j)
                    quality = 0.6 * rng.standard_normal()
                else:
                    n_steps, words = 1 + int(rng.integers(3)), 2 + int(rng.integers(9))
                    quality = (0.6 if label else -0.6) + 0.3 * rng.standard_normal()
                states[tid] = make_states(tid, rng, quality, n_steps)
                steps = [Step(cot="think " * words, fn=f"edit({s})", obs="ok " * words) for s in range(n_steps)]
                trajs.append(Trajectory(traj_id=tid, instance_id=inst, repo=f"repo{r}", task_prompt=f"Task {inst}.",
                                        steps=steps, reward=float(label), agent="agent", run="agent"))
    return trajs, states


def write_runs(folder, trajs, states, fingerprint: Fingerprint = FP):
    """``folder/pools.jsonl`` and a state store ``folder/states`` of ``trajs`` and their ``states``."""
    from pathlib import Path

    from latentsift.states.store import StateStore
    from latentsift.trajectories.trajectory import save_jsonl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    store = StateStore(folder / "states").create(fingerprint, {"layers": list(range(1, L + 1)),
                                                               "store_dtype": "float32"})
    ids = sorted(states)
    inst_of = {t.traj_id: t.instance_id for t in trajs}
    store.write([states[t] for t in ids], [inst_of[t] for t in ids])
    save_jsonl(trajs, folder / "pools.jsonl")
    return folder / "pools.jsonl", folder / "states"
