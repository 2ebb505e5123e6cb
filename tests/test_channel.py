"""Rendering: exact token ids under the real SmolLM2 chat template, span tables that reproduce each
channel's text, nothing of the task prompt or template markup in a channel, budgets, the plain
fallback template, structured tool calls, and per-step rendering for think-dropping templates."""
from __future__ import annotations

import copy
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from latentsift import LatentSiftError
from latentsift.states.channel import PLAIN_TEMPLATE, render, render_per_step
from latentsift.trajectories.importers import import_paths
from latentsift.trajectories.trajectory import CHANNEL_ID, CHANNELS, Step, Trajectory

FIX = Path(__file__).parent / "fixtures" / "trajectories"
THINK_TEMPLATE = (FIX / "think_dropping.jinja").read_text()
HERMES_TEMPLATE = (FIX / "hermes_tools.jinja").read_text()
_TAG = re.compile(r"</?think>")


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged SmolLM2 tokenizer only (the model weights are not needed here)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from latentsift.states.model import default_model_path
    p = default_model_path()
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)


@pytest.fixture(scope="session")
def real_trajs(data_dir):
    r = import_paths([data_dir / "r2egym" / "acr-run-1.jsonl.gz", data_dir / "r2egym" / "acr-val-sbfl.jsonl.gz",
                      data_dir / "sweagent" / "cost_2_1.tar.gz"])
    return r.trajectories


@pytest.fixture(scope="session")
def fixture_trajs():
    r = import_paths([FIX / "openai_toolcalls.jsonl", FIX / "openhands_run", FIX / "mini_run", FIX / "mini_think_run"])
    return {t.traj_id: t for t in r.trajectories}


def _sample(real_trajs, fixture_trajs):
    by_fmt: dict[str, list[Trajectory]] = {}
    for t in real_trajs[::40] + list(fixture_trajs.values()):
        by_fmt.setdefault(t.source_format, []).append(t)
    return by_fmt


def _layout_messages(traj: Trajectory, *, structured: bool) -> list[dict]:
    """Chat messages rebuilt from the canonical layout (independently of channel.py)."""
    msgs = [dict(m) for m in traj.context_messages()]
    for s in traj.steps:
        cur = {"cot": 0, "fn": 0, "obs": 0}
        for lm in s.messages_layout():
            content = ""
            for p in lm["parts"]:
                if p[0] == "markup":
                    content += p[1]
                elif p[0] == "skip":
                    cur[p[1]] += p[2]
                else:
                    content += getattr(s, p[0])[cur[p[0]]:cur[p[0]] + p[1]]
                    cur[p[0]] += p[1]
            m = {"role": lm["role"], "content": content}
            m.update({k: v for k, v in lm.items() if k in ("name", "tool_call_id")})
            calls = []
            for p in lm.get("tool_calls", []):
                if p[0] == "skip":
                    cur["fn"] += p[2]
                    continue
                c = json.loads(s.fn[cur["fn"]:cur["fn"] + p[1]])
                cur["fn"] += p[1]
                calls.append(c)
            if calls and structured:
                m["tool_calls"] = [{"id": i, "type": "function", "function": c}
                                   for i, c in zip(lm["tool_call_ids"], calls)]
            elif calls:
                m["content"] = "\n\n".join([content] * bool(content) + [json.dumps(c, ensure_ascii=False) for c in calls])
            msgs.append(m)
    return msgs


def _ids(out) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _check_spans(R, traj: Trajectory, tok, *, structured_fn: bool = False, complete: bool = True) -> int:
    """Each (step, channel) span: its tokens decode to the text they cover, every run of them is a
    piece of the channel's text in order, and what they leave out is whitespace, a <think> tag or an
    observation separator (the documented whitespace rule). Returns the number of spans checked."""
    n = 0
    for st, ch in R.span_keys():
        pos = np.flatnonzero((R.step == st) & (R.channel == ch))
        runs = np.split(pos, np.flatnonzero(np.diff(pos) != 1) + 1)
        src = getattr(traj.steps[st], CHANNELS[ch])
        cur = 0
        for r in runs:
            a, b = int(R.offsets[r[0], 0]), int(R.offsets[r[-1], 1])
            piece = R.text[a:b]
            assert tok.decode(R.input_ids[r]) == piece
            if structured_fn and ch == CHANNEL_ID["fn"]:
                continue
            k = src.find(piece, cur)
            assert k >= 0, (traj.traj_id, st, CHANNELS[ch], piece[:80])
            gap = src[cur:k]
            assert not gap.strip() or not _TAG.sub("", gap).strip(), (traj.traj_id, st, CHANNELS[ch], gap[:80])
            cur = k + len(piece)
        if not (structured_fn and ch == CHANNEL_ID["fn"]):
            assert not _TAG.sub("", src[cur:]).strip(), (traj.traj_id, st, CHANNELS[ch], src[cur:][:80])
        n += 1
    if complete:   # every non-empty channel text has a span
        expected = {(t, CHANNEL_ID[c]) for t, s in enumerate(traj.steps) for c in CHANNELS
                    if _TAG.sub("", getattr(s, c)).strip()}
        assert set(R.span_keys()) == expected
    return n


def _check_exclusions(R, traj: Trajectory, tok) -> None:
    """No control token, role header or context (system / task prompt) token lands in a channel."""
    special = np.isin(R.input_ids, tok.all_special_ids)
    assert special.any() and (R.step[special] == -1).all() and (R.channel[special] == -1).all()
    hits = np.zeros(R.n_tokens, dtype=bool)
    cur = 0
    for m in traj.context_messages():
        k = R.text.find(m["content"], cur)
        assert k >= 0
        hits |= (R.offsets[:, 1] > k) & (R.offsets[:, 0] < k + len(m["content"]))
        cur = k + len(m["content"])
    for h in re.finditer(r"<\|im_start\|>\w+\n", R.text):
        hits |= (R.offsets[:, 1] > h.start()) & (R.offsets[:, 0] < h.end())
    assert hits.sum() > 0 and (R.step[hits] == -1).all()
    assert R.text.find(traj.task_prompt.strip()[:200]) < R.offsets[np.flatnonzero(R.step >= 0)[0], 0]


@pytest.mark.parametrize("fmt", ["r2egym", "sweagent", "openai", "minisweagent"])
def test_render_is_exact_and_spans_reproduce_text(fmt, tokenizer, real_trajs, fixture_trajs):
    trajs = _sample(real_trajs, fixture_trajs)[fmt]
    assert trajs
    for t in trajs:
        R = render(t, tokenizer)
        ref = tokenizer.apply_chat_template(_layout_messages(t, structured=False), tokenize=True)
        assert list(R.input_ids) == _ids(ref)                     # the exact ids of the chat template
        assert R.input_ids.dtype == np.int64 and R.step.dtype == np.int32 and R.channel.dtype == np.int8
        assert R.n_steps == t.n_steps and R.traj_id == t.traj_id
        assert _check_spans(R, t, tokenizer) > 0
        _check_exclusions(R, t, tokenizer)


def test_smollm2_default_system_prompt_is_excluded(tokenizer, fixture_trajs):
    t = copy.deepcopy(fixture_trajs["mini_run/django__django-11099"])
    t.context = [m for m in t.context if m["role"] != "system"]
    t.system_prompt = None
    R = render(t, tokenizer)
    assert R.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    first = np.flatnonzero(R.step >= 0)[0]
    assert R.offsets[first, 0] > R.text.index("Consider the following PR description")
    assert _check_spans(R, t, tokenizer)


def test_acr_observation_parts_are_separate_user_messages(tokenizer, real_trajs):
    t = next(x for x in real_trajs if x.agent == "acr" and len(x.steps[0].meta["obs_msg_chars"]) == 2)
    R = render(t, tokenizer)
    obs = np.flatnonzero((R.step == 0) & (R.channel == CHANNEL_ID["obs"]))
    between = R.input_ids[obs[0]:obs[-1] + 1][R.step[obs[0]:obs[-1] + 1] == -1]
    assert tokenizer.decode(between).count("<|im_start|>user") == 1       # two messages, one header between


def test_structured_tool_calls(tokenizer, fixture_trajs):
    t = fixture_trajs["vllm-qwen-run/astropy__astropy-12907"]
    R = render(t, tokenizer, template=HERMES_TEMPLATE)
    ref = tokenizer.apply_chat_template(_layout_messages(t, structured=True), chat_template=HERMES_TEMPLATE,
                                        tokenize=True)
    assert list(R.input_ids) == _ids(ref)
    _check_spans(R, t, tokenizer, structured_fn=True)
    fn1 = R.text[R.offsets[(R.step == 1) & (R.channel == CHANNEL_ID["fn"])][:, 0].min():
                 R.offsets[(R.step == 1) & (R.channel == CHANNEL_ID["fn"])][:, 1].max()]
    assert fn1.startswith("execute_bash") and "grep -n 'cright'" in fn1 and "git status" in fn1
    tags = [m.start() for m in re.finditer("<tool_call>", R.text)]
    assert tags and all(R.step[(R.offsets[:, 0] <= p) & (R.offsets[:, 1] > p)][0] == -1 for p in tags)
    # without tool-call support (SmolLM2) the call JSON is written after the reasoning
    R2 = render(t, tokenizer)
    fn0 = tokenizer.decode(R2.input_ids[(R2.step == 0) & (R2.channel == CHANNEL_ID["fn"])])
    assert fn0 == t.steps[0].fn


def test_budgets_keep_first_tokens(tokenizer, real_trajs):
    t = next(x for x in real_trajs if x.agent == "sweagent")
    full = render(t, tokenizer)
    cut = render(t, tokenizer, max_span_tokens=16, max_prompt_tokens=32)
    for st, ch in full.span_keys():
        f = full.input_ids[(full.step == st) & (full.channel == ch)]
        c = cut.input_ids[(cut.step == st) & (cut.channel == ch)]
        assert list(c) == list(f[:16])
    assert cut.span_keys() == full.span_keys()
    special = int(np.isin(full.input_ids, tokenizer.all_special_ids).sum())
    assert int(np.isin(cut.input_ids, tokenizer.all_special_ids).sum()) == special   # markup always kept
    ctx_full = int((full.step == -1).sum())
    ctx_cut = int((cut.step == -1).sum())
    assert ctx_cut < ctx_full and ctx_cut <= 32 * len(t.context) + 200
    with pytest.raises(LatentSiftError, match="'max_span_tokens' parameter of render"):
        render(t, tokenizer, max_span_tokens=0)


def test_plain_fallback_template(tokenizer, fixture_trajs):
    base = copy.deepcopy(tokenizer)
    base.chat_template = None
    t = fixture_trajs["mini_run/django__django-11099"]
    R = render(t, base)
    assert R.text.startswith((base.bos_token or "") + "### system\n") and "### assistant\n" in R.text
    assert list(R.input_ids) == _ids(base.apply_chat_template(_layout_messages(t, structured=False),
                                                              chat_template=PLAIN_TEMPLATE, tokenize=True))
    _check_spans(R, t, base)
    for h in re.finditer(r"### \w+\n", R.text):
        over = (R.offsets[:, 1] > h.start()) & (R.offsets[:, 0] < h.end())
        assert (R.step[over] == -1).all()


def test_think_tags_are_markup(tokenizer, fixture_trajs):
    t = fixture_trajs["mini_think_run/sympy__sympy-20590"]
    R = render(t, tokenizer)            # SmolLM2 keeps every turn: one sequence is exact
    for m in re.finditer(r"</?think>", R.text):
        over = (R.offsets[:, 1] > m.start()) & (R.offsets[:, 0] < m.end())
        assert over.any() and (R.step[over] == -1).all()
    cot0 = tokenizer.decode(R.input_ids[(R.step == 0) & (R.channel == CHANNEL_ID["cot"])])
    assert "Step 2: reason" in cot0 and "THOUGHT: I need to find" in cot0 and "think>" not in cot0


def test_per_step_rendering_for_think_dropping_template(tokenizer, fixture_trajs):
    t = fixture_trajs["mini_think_run/sympy__sympy-20590"]
    with pytest.raises(LatentSiftError, match="render_per_step"):
        render(t, tokenizer, template=THINK_TEMPLATE)
    rs = render_per_step(t, tokenizer, template=THINK_TEMPLATE)
    assert len(rs) == t.n_steps + 1
    seen = [k for R in rs for k in R.span_keys()]
    assert sorted(seen) == sorted(set(seen))                     # every span labelled exactly once
    assert set(seen) == {(s, CHANNEL_ID[c]) for s in range(t.n_steps) for c in CHANNELS
                         if getattr(t.steps[s], c).strip()}
    msgs = _layout_messages(t, structured=False)
    n_ctx = len(t.context_messages())
    for k, R in enumerate(rs[:-1]):
        # rendering k = the context, steps < k as the template shows history, then step k's turn
        upto = n_ctx + sum(len(s.messages_layout()) for s in t.steps[:k]) + 1
        ref = tokenizer.apply_chat_template(msgs[:upto], chat_template=THINK_TEMPLATE, tokenize=True)
        assert list(R.input_ids) == _ids(ref)
        cot = tokenizer.decode(R.input_ids[(R.step == k) & (R.channel == CHANNEL_ID["cot"])])
        assert f"Step {2 * k + 2}: reason" in cot                  # the step's own reasoning, as generated
        assert "Step 2: reason" not in R.text or k == 0             # earlier reasoning dropped from history
        assert {s for s, _ in R.span_keys()} <= {k - 1, k}
        _check_spans(R, t, tokenizer, complete=False)
    assert rs[-1].span_keys() == [(t.n_steps - 1, CHANNEL_ID["obs"])]


def test_layout_errors_are_reported():
    t = Trajectory("r/i", "i", "", "task", [Step(cot="abc", fn="", obs="x", layout=[
        {"role": "assistant", "parts": [["cot", 2]]}, {"role": "user", "parts": [["obs", 1]]}])])

    class Tok:
        chat_template = PLAIN_TEMPLATE
    with pytest.raises(LatentSiftError, match="covers 2 of the 3 characters of cot"):
        render(t, Tok())


def test_render_speed(tokenizer, real_trajs):
    sample = real_trajs[::25]
    t0 = time.perf_counter()
    n = sum(render(t, tokenizer).n_tokens for t in sample)
    per = (time.perf_counter() - t0) / len(sample)
    assert n > 0 and per < 0.25        # measured ~20 ms for ~10K tokens; bench/import_all.py prints it


def test_patch_step_finds_the_step_that_wrote_the_final_patch(real_trajs):
    from latentsift.states.channel import patch_step
    acr = [t for t in real_trajs if t.run == "acr-run-1"]
    swe = [t for t in real_trajs if t.agent == "sweagent"]
    for t in acr:
        p = patch_step(t)
        if not t.patch.strip():
            assert p is None
            continue
        # AutoCodeRover: the evaluated write_patch attempt holds the diff in its call
        assert t.steps[p].meta["kind"] == "write_patch" and t.steps[p].meta.get("evaluated"), t.traj_id
    found = [patch_step(t) for t in swe if t.patch.strip()]
    # SWE-agent: the final 'submit' shows the diff in its observation (checked, not assumed, per trajectory)
    hits = [(t, p) for t, p in zip([t for t in swe if t.patch.strip()], found) if p is not None]
    assert len(hits) >= 0.9 * len(found)
    assert all(t.steps[p].fn.startswith("submit") for t, p in hits)
    assert all(patch_step(t) is None for t in swe if not t.patch.strip())


def test_patch_step_tokens_lengthens_only_the_patch_writing_step(tokenizer, real_trajs):
    from latentsift.states.channel import patch_step
    t = next(x for x in real_trajs if x.run == "acr-run-1" and x.patch.count("\n") > 20)
    p = patch_step(t)
    cut = render(t, tokenizer, max_span_tokens=16, max_prompt_tokens=32)
    longer = render(t, tokenizer, max_span_tokens=16, max_prompt_tokens=32, patch_step_tokens=64)
    full = render(t, tokenizer)
    for st, ch in full.span_keys():
        f = full.input_ids[(full.step == st) & (full.channel == ch)]
        w = longer.input_ids[(longer.step == st) & (longer.channel == ch)]
        assert list(w) == list(f[:64] if st == p else f[:16])
    fn = CHANNEL_ID["fn"]
    assert ((longer.step == p) & (longer.channel == fn)).sum() == 64 > ((cut.step == p) & (cut.channel == fn)).sum()
    # without a span budget, the patch step alone is cut; a bad value is a clear error
    only = render(t, tokenizer, patch_step_tokens=64)
    assert ((only.step == p) & (only.channel == fn)).sum() == 64
    assert ((only.step != p) & (only.step >= 0)).sum() == ((full.step != p) & (full.step >= 0)).sum()
    with pytest.raises(LatentSiftError, match="patch_step_tokens"):
        render(t, tokenizer, patch_step_tokens=0)
