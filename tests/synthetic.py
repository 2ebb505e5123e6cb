"""Synthetic per-step states for tests that need banks and pools without the model: each state is
noise plus ``quality`` times a fixed direction, so good and bad trajectories separate."""
from __future__ import annotations

import numpy as np

from latentsift.states.model import Fingerprint
from latentsift.states.states import TrajectoryStates
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS

L, D = 3, 8
FP = Fingerprint("TestArch", L, D, "tok", "tpl", "w", "float32")
DIRECTION = np.linspace(-1, 1, D).astype(np.float32)


def make_states(tid: str, rng, quality: float, n_steps: int, tokens_per_step: int = 50) -> TrajectoryStates:
    """``n_steps`` steps of the three channels, (n_spans, L, D) states."""
    steps = [t for t in range(n_steps) for _ in CHANNELS]
    chans = [CHANNEL_ID[c] for _ in range(n_steps) for c in CHANNELS]
    layers = 0.3 * rng.standard_normal((len(steps), L, D)).astype(np.float32) + np.float32(quality) * DIRECTION
    return TrajectoryStates(tid, layers, np.array(steps, np.int32), np.array(chans, np.int8),
                            n_tokens=tokens_per_step * n_steps)
