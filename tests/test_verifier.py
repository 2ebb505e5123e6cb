"""The EF verifier: prompt layout, condensation, the local SmolLM2 backend, the OpenAI-compatible
backend against a stub server on 127.0.0.1, failures, caching, result files."""
from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from latentsift.trajectories.trajectory import Step, Trajectory
from latentsift.cascade.verifier import (THOUGHT_PLACEHOLDER, EFVerifier, LocalVerifierBackend, OpenAIBackend, Verdict,
                                         VerifierFailure, build_prompt, load_results, save_results, yes_no_score)

DATA = "/work/shared/datasets/swebench-lite-pools"


def traj(tid, task="Fix the bug.", thoughts=("look",), obs=None, patch="diff --git a/x b/x"):
    obs = obs or [f"observation {i}" for i in range(len(thoughts))]
    steps = [Step(cot=c, fn=f"<function=search>\n  <parameter=q>{i}</parameter>\n</function>", obs=o)
             for i, (c, o) in enumerate(zip(thoughts, obs))]
    return Trajectory(traj_id=tid, instance_id=tid.split("/")[-1], repo="o/r", task_prompt=task, steps=steps,
                      patch=patch, reward=0.0)


def test_prompt_shows_the_interaction_log_and_the_patch():
    system, user = build_prompt(traj("r/x", thoughts=("I will search", ""), obs=["found it", "done"]))
    assert "YES" in system and "NO" in system
    assert "[USER]\nFix the bug.\n[/USER]" in user
    assert "[STEP]\n0\n[/STEP]\n\n[ASSISTANT]\nI will search\n\n<function=search>" in user
    assert "[/ASSISTANT]\n\n[USER]\nfound it\n[/USER]" in user
    assert "[STEP]\n1\n[/STEP]\n\n[ASSISTANT]\n<function=search>" in user  # no thought: action only
    assert user.index("=== FINAL PATCH ===") < user.index("[PATCH]\ndiff --git a/x b/x\n[/PATCH]")
    assert user.rstrip().endswith("Respond with YES or NO.")


def test_yes_no_score_is_the_normalised_probability():
    assert yes_no_score(math.log(0.6), math.log(0.2)) == pytest.approx(0.75)
    assert yes_no_score(-1000.0, 0.0) == pytest.approx(0.0)


# ----------------------------------------------------------------------------- local model


@pytest.fixture(scope="module")
def backend():
    from latentsift.states.model import load_policy

    return LocalVerifierBackend(policy=load_policy())


@pytest.mark.model
def test_condensation_replaces_longest_thoughts_first_never_the_first(backend):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa "
    lengths = [60, 10, 40, 25, 50, 5]  # step 0 is the longest and must survive
    t = traj("r/c", thoughts=[words * n for n in lengths])
    ver = EFVerifier(backend, max_prompt_tokens=4096)
    full = ver.prompt(t)[2]
    # A budget that needs exactly two thoughts condensed: the two longest after step 0 (4 and 2).
    saved = [backend.count_text(words * n) - backend.count_text(THOUGHT_PLACEHOLDER) for n in lengths]
    budget = full - saved[4] - saved[2] // 2
    system, user, n, counts = EFVerifier(backend, max_prompt_tokens=budget).prompt(t)
    assert n <= budget and counts == {"thoughts": 2, "observations": 0, "blocks": 0, "steps_dropped": 0, "patch": 0}
    blocks = re.findall(r"\[ASSISTANT\]\n(.*?)\n\n<function", user, flags=re.S)
    assert blocks[0] == words * 60  # the first thought is never condensed, though it is the longest
    assert [i for i, b in enumerate(blocks) if b == THOUGHT_PLACEHOLDER] == [2, 4]
    assert [blocks[i] for i in (1, 3, 5)] == [words * lengths[i] for i in (1, 3, 5)]
    # A tight budget walks through the later rules and still fits.
    long_obs = ["result line\n" * 300, "x", "result line\n" * 100, "y", "z", "w"]
    t2 = traj("r/d", thoughts=[words * n for n in lengths], obs=long_obs)
    _, user2, n2, counts2 = EFVerifier(backend, max_prompt_tokens=700).prompt(t2)
    assert n2 <= 700 and counts2["thoughts"] == 5 and counts2["observations"] >= 1
    assert "<Observation truncated for saving context>" in user2
    # A budget below the fixed part of the prompt is a per-candidate failure, not a crash.
    res = EFVerifier(backend, max_prompt_tokens=100).score([t2])
    assert isinstance(res["r/d"], VerifierFailure) and res["r/d"].score is None


@pytest.mark.model
def test_token_ids_are_the_tokenizers_ids_on_real_prompts(backend, data_dir):
    """Counting and heads take their ids from the Rust tokenizer's offset-free batch encoder: the same
    ids as transformers' call on real judge prompts (special tokens, code, whitespace runs); a
    tokenizer that carries its own truncation goes through transformers, which switches it off."""
    import copy

    from latentsift.cascade.backends import token_ids
    from latentsift.trajectories.importers import import_paths

    tok = backend.tokenizer
    trajs = import_paths(data_dir / "sweagent" / "cost_2_1.tar.gz").trajectories[:6]
    texts = [tok.apply_chat_template([{"role": "system", "content": s}, {"role": "user", "content": u}],
                                     add_generation_prompt=True, tokenize=False) + "Answer:"
             for s, u in (build_prompt(t) for t in trajs)]
    texts += ["<|im_end|>\n\n\n  x <|endoftext|>  ", "  \t naïve 日本語 ’s  \n", ""]
    for text in texts:
        assert token_ids(tok, text) == list(tok(text, add_special_tokens=False)["input_ids"])
    assert max(len(token_ids(tok, t)) for t in texts) > 5000
    truncating = copy.deepcopy(tok)
    truncating.backend_tokenizer.enable_truncation(max_length=8)
    assert token_ids(truncating, texts[0]) == token_ids(tok, texts[0])


@pytest.mark.model
def test_local_backend_reads_yes_no_by_token_id_on_real_trajectories(backend, tmp_path):
    import torch

    from latentsift.trajectories.importers import import_paths

    pool = import_paths([f"{DATA}/r2egym/acr-run-1.jsonl.gz"]).trajectories[:40]
    trajs = sorted(pool, key=lambda t: t.n_chars)[:2]  # the two shortest: condensed, but cheap to run
    ver = EFVerifier(backend, max_prompt_tokens=800, cache_dir=tmp_path / "cache")
    res = ver.score(trajs)
    assert list(res) == [t.traj_id for t in trajs]
    for t in trajs:
        v = res[t.traj_id]
        assert isinstance(v, Verdict) and 0.0 < v.score < 1.0 and v.n_out == 1 and not v.cached
        system, user, n, _ = ver.prompt(t)
        ids = backend.encode(system, user, ver.answer_prefix)
        assert v.n_in == n == len(ids) <= 800 and v.n_condensed > 0
        head, cache = backend._shared_head(system)  # the call ran on the cached shared head ...
        assert len(head) > 100 and cache is not None and ids[:len(head)] == head
        # Independent read-out: decoder stack, LM head on the last state, softmax, ids of "YES"/"NO".
        with torch.inference_mode():
            h = backend.policy.base(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            logits = backend.policy.model.lm_head(h).float()
        p = torch.softmax(logits, -1)
        y = backend.tokenizer.encode("YES", add_special_tokens=False)[0]
        no = backend.tokenizer.encode("NO", add_special_tokens=False)[0]
        assert v.score == pytest.approx(float(p[y] / (p[y] + p[no])), abs=2e-3)  # ... and equals a full pass
    again = ver.score(trajs[::-1])
    for t in trajs:
        assert again[t.traj_id].cached and again[t.traj_id].score == res[t.traj_id].score
        assert again[t.traj_id].n_in == res[t.traj_id].n_in  # the tokens the call cost are still reported
    save_results(res, tmp_path / "out", name="smol", manifest=ver.manifest())
    name, back, man = load_results(tmp_path / "out")
    assert name == "smol" and man["backend"]["backend"] == "local"
    assert {k: v.score for k, v in back.items()} == {k: v.score for k, v in res.items()}


# ----------------------------------------------------------------------------- OpenAI-compatible stub


class _Stub(BaseHTTPRequestHandler):
    """Behaviour chosen by the task text: MODE=<ok|nologprobs|timeout|500|noanswer> P=<p_yes> D=<delay>."""

    requests: list = []

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Stub.requests.append(body)
        user = body["messages"][1]["content"]
        mode = re.search(r"MODE=(\w+)", user).group(1)
        p_yes = float(re.search(r"P=([0-9.]+)", user).group(1))
        delay = float(re.search(r"D=([0-9.]+)", user).group(1))
        time.sleep(delay)
        if mode == "timeout":
            time.sleep(0.6)
        if mode == "500":
            self._send(500, {"error": {"message": "overloaded"}})
            return
        top = [{"token": "YES", "logprob": math.log(p_yes), "bytes": [89, 69, 83]},
               {"token": "NO", "logprob": math.log(1 - p_yes) - 0.1, "bytes": [78, 79]},
               {"token": " NO", "logprob": math.log(1 - p_yes) - 2.0, "bytes": [32, 78, 79]},
               {"token": "Maybe", "logprob": -9.0, "bytes": [77]}]
        if mode == "noanswer":
            top = [{"token": "<", "logprob": -0.01, "bytes": [60]}]
        content = [{"token": top[0]["token"], "logprob": top[0]["logprob"], "bytes": top[0]["bytes"],
                    "top_logprobs": top}]
        payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": top[0]["token"]},
                                "logprobs": None if mode == "nologprobs" else {"content": content},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": len(user) // 3, "completion_tokens": 1,
                             "total_tokens": len(user) // 3 + 1}}
        self._send(200, payload)

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture(scope="module")
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _remote(stub_url, **kw):
    return OpenAIBackend(stub_url, "judge-14b", timeout=0.3, max_retries=2, backoff=0.0, concurrency=4,
                         sleep=lambda s: None, **kw)


def test_openai_backend_scores_by_candidate_id_not_completion_order(stub_url, tmp_path):
    # The first candidate answers last: results must still be keyed by traj_id.
    cands = [traj(f"r/{i}", task=f"MODE=ok P={p} D={d}") for i, (p, d) in
             enumerate([(0.9, 0.25), (0.2, 0.0), (0.6, 0.1), (0.5, 0.0)])]
    _Stub.requests.clear()
    ver = EFVerifier(_remote(stub_url), max_prompt_tokens=100_000, cache_dir=tmp_path / "c")
    res = ver.score(cands)
    for c, p in zip(cands, (0.9, 0.2, 0.6, 0.5)):
        p_no = (1 - p) * (math.exp(-0.1) + math.exp(-2.0))  # "NO" and " NO" both count for NO
        assert res[c.traj_id].score == pytest.approx(p / (p + p_no))
        user = ver.prompt(c)[1]
        assert res[c.traj_id].n_in == len(user) // 3 and res[c.traj_id].n_out == 1
    body = _Stub.requests[0]
    assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == 20
    assert body["messages"][-1] == {"role": "assistant", "content": "<judgement>"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    n = len(_Stub.requests)
    again = ver.score(cands)  # cached: no new request
    assert len(_Stub.requests) == n and all(r.cached for r in again.values())


@pytest.mark.parametrize("mode, error", [("nologprobs", "no logprobs"), ("timeout", "timeout"),
                                         ("500", "HTTP 500")])
def test_openai_failures_are_retried_then_reported_per_candidate(stub_url, mode, error):
    cands = [traj("r/bad", task=f"MODE={mode} P=0.9 D=0"), traj("r/good", task="MODE=ok P=0.7 D=0")]
    _Stub.requests.clear()
    res = EFVerifier(_remote(stub_url), max_prompt_tokens=100_000).score(cands)
    bad = res["r/bad"]
    assert isinstance(bad, VerifierFailure) and bad.score is None and bad.attempts == 3
    assert error in bad.error
    assert sum(1 for b in _Stub.requests if "MODE=" + mode in b["messages"][1]["content"]) == 3
    assert isinstance(res["r/good"], Verdict) and res["r/good"].score > 0.5
    if mode == "nologprobs":  # the server reported usage for each failed attempt: charged
        assert bad.n_in > 0 and bad.n_out == 3


def test_openai_answer_outside_top_logprobs_is_a_failure_not_half(stub_url):
    res = EFVerifier(_remote(stub_url), max_prompt_tokens=100_000).score([traj("r/x", task="MODE=noanswer P=0.5 D=0")])
    assert isinstance(res["r/x"], VerifierFailure) and "neither 'YES' nor 'NO'" in res["r/x"].error


def test_cli_verify_writes_results_keyed_by_traj_id(stub_url, tmp_path):
    from typer.testing import CliRunner

    from latentsift.cli import app
    from latentsift.trajectories.trajectory import save_jsonl

    cands = [traj("r/a", task="MODE=ok P=0.8 D=0"), traj("r/b", task="MODE=nologprobs P=0.8 D=0")]
    save_jsonl(cands, tmp_path / "t.jsonl")
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "t.jsonl"), "--out",
                                   str(tmp_path / "ef"), "--name", "stub-judge", "--backend", "openai",
                                   "--base-url", stub_url, "--api-model", "judge", "--timeout", "2",
                                   "--retries", "1", "--verifier-max-tokens", "100000"])
    assert res.exit_code == 0, res.output
    assert "1 failures" in res.output
    name, results, man = load_results(tmp_path / "ef")
    assert name == "stub-judge" and man["n_failed"] == 1 and man["backend"]["backend"] == "openai"
    assert results["r/a"].score > 0.5 and results["r/b"].score is None and results["r/b"].attempts == 2


def test_a_stop_from_progress_starts_no_further_prompt(stub_url, tmp_path):
    """Scoring that is stopped (an error or Ctrl-C while it waits) cancels the prompts not started (it
    used to run every queued one first); the finished ones stay in the cache, a rerun asks for the others."""
    cands = [traj(f"r/s{i}", task=f"MODE=ok P=0.{i + 1} D=0.05") for i in range(24)]
    _Stub.requests.clear()
    ver = EFVerifier(_remote(stub_url), max_prompt_tokens=100_000, cache_dir=tmp_path / "c")

    def progress(i, n):
        if i == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ver.score(cands, progress=progress)
    asked = len(_Stub.requests)
    assert asked < 12                         # 4 at a time: those under way finish, none is started after
    again = ver.score(cands)
    assert sum(r.cached for r in again.values()) == asked     # every prompt asked was finished and kept
    assert len(_Stub.requests) == 24                          # the rerun asked for the others only
