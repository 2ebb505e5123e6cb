"""States captured while transformers ``generate`` samples K = 4 answers to two prompts as one batch.

    PYTHONPATH=src python examples/capture_generate.py [--out runs/capture] [--max-new-tokens 24] [--seed 0]

Two small coding tasks, two samples each, run on the embedded SmolLM2 model in float32 (a CPU decodes
float32 far faster than bfloat16). Each turn, the samples still going are one left-padded batch
(``BatchRecorder.inputs``); a sample that writes a stop token is fed pads by ``generate`` until the batch
ends, and those are never pooled. A reply is labelled ``cot`` up to its first backtick (where this toy
agent's "tool call" starts) and ``fn`` from there on; the tool's answer comes back as the next user turn,
labelled ``obs``. Samples 0 and 2 stop after one turn, 1 and 3 take a second: finished samples leave the
batch. The states go to a state store (``OUT/states``); each sample's states are then compared with a
replay of the same tokens (the largest relative difference is printed).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from latentsift.states import BatchRecorder, exact_attention, load_policy, replay

TASKS = {
    "toy__add": "The test test_add fails: add(2, 2) returns 0. Fix add() in math.py.",
    "toy__greet": "greet('Ann') should return 'Hello, Ann!' but returns 'Hello Ann'. Fix greet() in hello.py.",
}
OBSERVATION = "$ python -m pytest -q\n1 failed, 3 passed"
SYSTEM = "You are a coding agent. Run shell commands in backticks, e.g. `ls`."
TURNS = (1, 2, 1, 2)   # turns of samples 0..3


def _enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _reply_channels(tok, new: list[int], stop: set[int]) -> list[str]:
    """Each reply token's channel: cot before the first backtick, fn from the token that writes it; the
    stop token excluded."""
    chans, fn = [], False
    for i, t in enumerate(new):
        if t in stop:
            chans.append("excluded")
            continue
        fn = fn or "`" in tok.decode(new[:i + 1])
        chans.append("fn" if fn else "cot")
    return chans


def main(out: str | Path = "runs/capture", max_new_tokens: int = 24, seed: int = 0, policy=None,
         log=print) -> dict:
    policy = policy or load_policy(dtype="float32")
    tok = policy.tokenizer
    tasks = [task for task in TASKS for _ in range(2)]                      # K = 4: two samples per prompt
    rec = BatchRecorder(policy, [f"capture/{task}#{i % 2}" for i, task in enumerate(tasks)])
    for r, task in enumerate(tasks):                                        # system + task prompt: context only
        rec.extend(r, _enc(tok, f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TASKS[task]}"
                                "<|im_end|>\n<|im_start|>assistant\n"))
    torch.manual_seed(seed)
    with rec, torch.inference_mode(), exact_attention(policy.device):
        for t in range(max(TURNS)):
            rows = [r for r in range(rec.k) if TURNS[r] > t]                 # finished samples leave the batch
            batch = rec.inputs(rows)
            output = policy.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=True,
                                           temperature=0.8, top_p=0.95, pad_token_id=rec.pad_id)
            for r, new in zip(rows, rec.new_tokens(output)):
                rec.extend(r, new, t, _reply_channels(tok, new, rec.stop))        # the reply, labelled per token
                head = "\n" if new and new[-1] in rec.stop else "<|im_end|>\n"
                rec.extend(r, _enc(tok, f"{head}<|im_start|>user\n"))
                rec.extend(r, _enc(tok, OBSERVATION), t, "obs")
                rec.extend(r, _enc(tok, "<|im_end|>\n<|im_start|>assistant\n"))
            log(f"turn {t}: samples {rows} wrote {[len(n) for n in rec.new_tokens(output)]} tokens "
                f"(prompts left-padded to {batch['input_ids'].shape[1]})")
    store = rec.write(Path(out) / "states", instance_ids=tasks)             # runs the last observations first
    worst = 0.0
    for r in range(rec.k):
        online, again = rec.states(r), replay(policy, rec.rendering(r))
        diff = np.linalg.norm(online.layers - again.layers, axis=-1) / np.linalg.norm(again.layers, axis=-1)
        worst = max(worst, float(diff.max()))
    log(f"states of {rec.k} samples ({sum(rec.states(r).n_spans for r in range(rec.k))} spans) in {store.path}; "
        f"online against a replay of the same tokens: largest relative difference {worst:.1e}")
    return {"store": store, "recorder": rec, "worst": worst}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/capture")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    main(a.out, a.max_new_tokens, a.seed)
