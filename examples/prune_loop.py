"""Early pruning in an agent-like loop: K short rollouts of the embedded model, pruned online.

    PYTHONPATH=src python examples/prune_loop.py [--k 6] [--steps 3] [--new-tokens 6]

Each of K candidates answers a small task over a few steps (assistant turn = generated tokens,
labelled cot then fn; a fixed tool observation after it), with a ``StateRecorder`` capturing its
pooled states while it generates. At every step boundary a ``Pruner`` reads the states so far and
says which candidates to stop; stopped candidates generate nothing more.

The configuration is hand-made so that the answer is known: the bank holds two reference
rollouts written in plain English about the task (resolved) and two written in random characters
(unresolved); ``n_garbled`` of the K candidates start every turn with forced random characters
(then the model continues). A state-based pruner should stop those first. This shows the mechanics
end to end; it says nothing about the success rate of a real agent on a real task.
"""
from __future__ import annotations

import argparse
import json
import random
import time

from latentsift.bank import Bank
from latentsift.sift import Pruner
from latentsift.sift import LatentSift
from latentsift.states.states import StateRecorder
from latentsift.trajectories import CHANNEL_ID

SYSTEM = ("<|im_start|>system\nYou are a coding agent. Call tools as <function=bash>cmd</function>.<|im_end|>\n"
          "<|im_start|>user\nThe test test_add fails: add(2, 2) returns 0. Fix add() in math.py.<|im_end|>\n"
          "<|im_start|>assistant\n")
OBSERVATIONS = ["def add(a, b):\n    return a - b", "File updated.", "1 passed, 0 failed"]
GOOD = ["I will look at math.py to see how add is written.", "The function subtracts; it should add. I fix it.",
        "The test passes now, so the fix is done."]


def garble(rng: random.Random, n: int = 40) -> str:
    return "".join(rng.choice("qxzjkvwy#@%&") for _ in range(n))


class Candidate:
    """One rollout, advanced one step at a time (its recorder is re-entered for each turn, so the K
    candidates can run in lock-step on one model). Per step: ``forced[t]`` (may be "") then
    ``new_tokens`` sampled tokens (labelled cot then fn), then the observation."""

    def __init__(self, policy, traj_id: str, forced: list[str], *, new_tokens: int, seed: int):
        from transformers import DynamicCache

        self.policy, self.forced, self.new_tokens, self.seed = policy, forced, new_tokens, seed
        self.cache = DynamicCache(config=policy.model.config)
        self.rec = StateRecorder(policy, traj_id)
        self.ids: list[int] = []
        self.generated = 0
        with self.rec:
            self._feed(SYSTEM, -1, -1)

    def _feed(self, text: str, step: int, channel) -> None:
        t = self.policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        self.rec.label(len(t), step, channel)
        self.ids.extend(t)

    def step(self, t: int) -> None:
        import torch

        policy, tok, ids = self.policy, self.policy.tokenizer, self.ids
        with self.rec, torch.inference_mode():
            if self.forced[t]:
                self._feed(self.forced[t], t, "cot")
            new: list[int] = []
            if self.new_tokens:
                torch.manual_seed(self.seed * 1000 + t)
                out = policy.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                            dtype=torch.long), past_key_values=self.cache,
                                            max_new_tokens=self.new_tokens, do_sample=True, temperature=1.0,
                                            top_k=50, pad_token_id=tok.eos_token_id)
                new = out[0, len(ids):].tolist()
            self.generated += len(new)
            ch = [CHANNEL_ID["cot"]] * (len(new) // 2) + [CHANNEL_ID["fn"]] * (len(new) - len(new) // 2)
            if new and new[-1] == tok.eos_token_id:
                ch[-1] = -1
            self.rec.label_tokens([t] * len(new), ch)
            ids.extend(new)
            self._feed("<|im_end|>\n<|im_start|>user\n", -1, -1)
            self._feed(OBSERVATIONS[t % len(OBSERVATIONS)], t, "obs")
            self._feed("<|im_end|>\n<|im_start|>assistant\n", -1, -1)
            # run the observation through the model now (all but the last template token, which the
            # next generate call prefills), so the recorder holds every span of steps 0..t
            policy.base(input_ids=torch.tensor([ids[self.cache.get_seq_length():-1]]), past_key_values=self.cache)

    def states(self):
        return self.rec.states()


def main(k: int = 6, steps: int = 3, new_tokens: int = 6, n_garbled: int = 2, threshold: float = 0.3,
         seed: int = 0, policy=None, log=print) -> dict:
    from latentsift.states import load_policy

    policy = policy or load_policy()
    rng = random.Random(seed)
    t0 = time.perf_counter()
    # 1. the bank: reference rollouts with known outcomes (forced text only, no sampling)
    bank_states, labels = {}, {}
    for i in range(2):
        for good in (True, False):
            tid = f"ref-{'good' if good else 'bad'}-{i}/ref__{i}"
            forced = list(GOOD) if good else [garble(rng) for _ in range(steps)]
            forced = (forced * steps)[:steps]
            ref = Candidate(policy, tid, forced, new_tokens=0, seed=seed)
            for t in range(steps):
                ref.step(t)
            bank_states[tid] = ref.states()
            labels[tid] = int(good)
    bank = Bank().fit(bank_states, labels, {t: t.split("/")[1] for t in bank_states},
                      {t: "ref/repo" for t in bank_states}, policy.fingerprint)
    filt = LatentSift(bank, None, branches="distance", channels=("cot",), n_evidence=1)
    # 2. K candidates of one task, run step by step in lock-step, pruned at each step boundary
    ids = [f"cand-{j}" for j in range(k)]
    garbled = set(ids[:n_garbled])
    forced = {t: [garble(rng, 24) if t in garbled else "" for _ in range(steps)] for t in ids}
    pruner = Pruner(filt, ids, threshold=threshold, checkpoints=tuple(range(1, steps)), instance_id="toy__task",
                    fingerprint=policy.fingerprint, seed=seed)
    cands = {t: Candidate(policy, t, forced[t], new_tokens=new_tokens, seed=seed + j) for j, t in enumerate(ids)}
    decisions = []
    for n in range(1, steps + 1):
        for t in pruner.alive:        # stopped candidates generate nothing more
            cands[t].step(n - 1)
            pruner.update(t, cands[t].states(), finished=n >= steps)
        d = pruner.step(n)
        decisions.append(d.to_dict())
        if d.checked:
            log(f"after step {n}: stop {d.stop or 'none'}; scores "
                + ", ".join(f"{c}={s:.2f}" for c, s in sorted(d.scores.items())))
    stopped = dict(pruner.stopped)
    out = {"k": k, "generated": {t: c.generated for t, c in cands.items()},
           "steps_not_run": {t: steps - n for t, n in stopped.items()}, "garbled": sorted(garbled), "stopped": stopped, "survivors": pruner.alive,
           "decisions": decisions, "seconds": round(time.perf_counter() - t0, 2),
           "garbled_stopped_first": sorted(decisions[0]["stop"]) == sorted(garbled)}
    log(f"stopped {sorted(stopped)} (garbled: {sorted(garbled)}); survivors {pruner.alive}; "
        f"{out['seconds']:.1f} s")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=6)
    ap.add_argument("--n-garbled", type=int, default=2)
    ap.add_argument("--threshold", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args()
    res = main(a.k, a.steps, a.new_tokens, a.n_garbled, a.threshold, a.seed)
    if a.json:
        print(json.dumps({k: v for k, v in res.items() if k != "decisions"}, indent=2))
