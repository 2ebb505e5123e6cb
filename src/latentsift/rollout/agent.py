"""The policy as a small tool-using agent: K rollouts of one coding task, states captured as it writes.

Scaffold (every string below is a setting of :class:`RolloutSettings`):

- context: a system prompt, then the user message (``user_template`` with the task's prompt);
- turn t: the policy writes its reasoning and the complete function in one fenced ``python`` block.
  The block is a call of the tool ``run_examples``: the code runs on the docstring's examples only
  (never the hidden tests) and the tool reports what passed and failed. All examples passing, or the
  last turn (``max_turns``), submits the code; otherwise the report comes back as a user message
  (``feedback_template``) and the policy revises;
- a reply without a code block gets ``no_code_message`` back (or, on the last turn, submits nothing).

Each turn is one step of the canonical trajectory: ``cot`` = the reply's text outside the block,
``fn`` = the code inside it (the fences are markup), ``obs`` = the tool's report shown to the policy
(empty for the submitting step: nothing more is shown). The label is the hidden tests' verdict on the
submitted code (``tests["hidden_passed"]``); ``tests["examples_passed"]`` is the submitted code's share
of the docstring's examples passed (absent where the task has none). So channels, banks and the explorer
read these trajectories like any other.

The environment (running the examples, judging) is passed in as two callables of ``(task, code)``, so
any sandbox plugs in (``latentsift rollout`` uses ``rollout.sandbox``).
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .._core.validation import LatentSiftError, check_positive_int, param_error
from ..states.channel import EXCLUDED, Rendering, render
from ..states.model_files import MAX_TOKEN_BYTES
from ..states.online import OnlineBatch, Sampling
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import Step, Trajectory

SYSTEM_PROMPT = ("You are an expert Python programmer. You solve a task by reasoning briefly, then writing the "
                 "complete function in one ```python code block. Each code block you write is run on the "
                 "examples in the function's docstring and you are shown which passed and which failed.")
#: The system prompt of a one-turn run without the tool (``--turns 1 --system-prompt``): the scaffold's own
#: without its sentence on running the examples (the confirmation run's rules, docs/studies/confirmation.md).
ONE_TURN_SYSTEM_PROMPT = SYSTEM_PROMPT[:SYSTEM_PROMPT.index(" Each code block")]
USER_TEMPLATE = ("Complete this Python function:\n\n```python\n{prompt}```\n\nReason briefly, then write the "
                 "complete function (signature, body and any imports it needs) in one ```python block.")
FEEDBACK_TEMPLATE = ("Result of running your code on the docstring's examples:\n{report}\n\nFix the function and "
                     "write the complete corrected function in one ```python block.")
NO_CODE_MESSAGE = "No ```python code block found. Write the complete function in one ```python block."
SCAFFOLD = "latentsift-rollout"
#: ``tests`` key of the submitted code's share of docstring examples passed (the cascade's Stage 3 score
#: for rollouts: tests that cost no generation tokens); absent where the task has no examples.
EXAMPLES_KEY = "examples_passed"
SOURCE_FORMAT = "latentsift-rollout"
_BLOCK = re.compile(r"```[ \t]*(?:python3?|py|Python)?[ \t]*\n(.*?)\n?```", re.DOTALL)
_OPEN = re.compile(r"```[ \t]*(?:python3?|py|Python)?[ \t]*\n", re.DOTALL)


@dataclass(frozen=True)
class ToolReport:
    """What ``run_examples`` returns: the text the policy reads and whether every example passed."""

    text: str
    passed: bool
    n_passed: int | None = None
    n_total: int | None = None


#: ``run_examples(task, codes) -> [ToolReport]``: each code (a reply's block) run on the task's docstring
#: examples only, in the order given (the K samples' tool calls of one turn, batched).
ExampleRunner = Callable[[Any, Sequence[str]], Sequence[ToolReport]]
#: ``judge(task, codes) -> [bool]``: each submitted code run against the hidden tests.
Judge = Callable[[Any, Sequence[str]], Sequence[bool]]


@dataclass(frozen=True)
class RolloutSettings:
    """Every constant of the scaffold and the sampling (recorded in the output's manifest)."""

    k: int = 16
    max_turns: int = 2
    seed: int = 0
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 384
    system_prompt: str = SYSTEM_PROMPT
    user_template: str = USER_TEMPLATE
    feedback_template: str = FEEDBACK_TEMPLATE
    no_code_message: str = NO_CODE_MESSAGE

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.max_new_tokens)

    def check(self) -> "RolloutSettings":
        check_positive_int(self.k, "k", "the rollout")
        check_positive_int(self.max_turns, "max_turns", "the rollout")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise param_error("seed", "the rollout", "a non-negative int", self.seed)
        if not isinstance(self.system_prompt, str) or not self.system_prompt.strip():
            raise param_error("system_prompt", "the rollout", "a non-empty text", self.system_prompt)
        if "{prompt}" not in self.user_template or "{report}" not in self.feedback_template:
            raise LatentSiftError("The rollout's user_template needs '{prompt}' and its feedback_template '{report}'.")
        self.sampling.check()
        return self

    def check_fits(self, tasks: Sequence[Any], context: int | None, where: str) -> None:
        """Refuse, before the model loads (and before a huge prompt is tokenised: 140 s and 6 GB for 49 MB), a
        task whose first message cannot fit the model's ``context`` (tokens, from its files; None: unknown, not
        checked): its system prompt and user message hold more bytes than ``context`` tokens of
        :data:`MAX_TOKEN_BYTES` each could. Nearer the limit the exact count refuses after the load (``turn``)."""
        if context is None:
            return
        for task in tasks:
            n = len(self.system_prompt.encode()) + len(self.user_template.format(prompt=task.prompt).encode())
            if n > context * MAX_TOKEN_BYTES:
                raise LatentSiftError(
                    f"{where}: the prompt of task {task.task_id!r} is {n:,} bytes with the system prompt, at least "
                    f"{-(-n // MAX_TOKEN_BYTES):,} tokens (no token spans more than {MAX_TOKEN_BYTES} bytes), past "
                    f"the model's context of {context:,}: shorten the prompt or leave the task out of the file, or "
                    "use a --model with a longer context.")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Rollout:
    """One finished sample: the trajectory (labelled) and its online states."""

    trajectory: Trajectory
    states: TrajectoryStates | None


@dataclass
class TaskStats:
    generated: int = 0       # tokens sampled
    forward: int = 0         # tokens run through the model (prefills and decode steps)
    seconds: float = 0.0     # wall time of the task (generation, tool and judge)
    tool_seconds: float = 0.0


def sample_traj_ids(run: str, task_id: str, k: int) -> list[str]:
    """The trajectory ids of a task's K samples (``RUN/TASK/sNN``): what the store and a resume look up."""
    return [f"{run}/{task_id}/s{i:02d}" for i in range(k)]


def sample_seeds(seed: int, task_id: str, k: int) -> list[int]:
    """The recorded per-sample seeds of one task: sha256 of ``seed:task_id:k`` (stable across runs,
    independent of the task's place in the file)."""
    return [int.from_bytes(hashlib.sha256(f"{seed}:{task_id}:{i}".encode()).digest()[:8], "big") >> 1
            for i in range(k)]


def parse_reply(text: str) -> tuple[str, str, list[list]]:
    """``(cot, fn, parts)`` of one reply: the first fenced python block is ``fn`` (an unclosed block,
    cut by the token limit, runs to the end), the text around it ``cot``, the fences markup."""
    m = _BLOCK.search(text)
    if m is not None:
        a, s, e, d = m.start(), m.start(1), m.end(1), m.end()
    else:
        o = _OPEN.search(text)
        if o is None:
            return text, "", [["cot", len(text)]] if text else []
        a, s, e, d = o.start(), o.end(), len(text), len(text)
    parts = [["cot", a]] if a else []
    parts += [["markup", text[a:s]]] if s > a else []
    parts += [["fn", e - s]] if e > s else []
    parts += [["markup", text[e:d]]] if d > e else []
    parts += [["cot", len(text) - d]] if d < len(text) else []
    return text[:a] + text[d:], text[s:e], parts


def generation_suffix(tokenizer) -> list[int]:
    """The token ids the chat template appends to open the assistant's turn."""
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    a = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    b = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    if not b.startswith(a):
        raise LatentSiftError("The chat template's generation prompt does not extend the conversation.")
    return list(tokenizer(b[len(a):], add_special_tokens=False)["input_ids"])


def stop_ids(policy) -> list[int]:
    """The tokens that end a turn: the tokenizer's EOS, the generation config's, ``<|im_end|>``."""
    tok = policy.tokenizer
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    eos = getattr(getattr(policy.model, "generation_config", None), "eos_token_id", None)
    ids |= set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())
    for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        i = tok.convert_tokens_to_ids(name)
        if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
            ids.add(i)
    return sorted(ids)


def target_of(traj: Trajectory, tokenizer, suffix: Sequence[int] = ()) -> Rendering:
    """``render(traj)`` (full spans: the default span settings), then ``suffix`` (excluded)."""
    r = render(traj, tokenizer)
    n = len(suffix)
    return Rendering(traj_id=traj.traj_id, input_ids=np.concatenate([r.input_ids, np.asarray(suffix, dtype=np.int64)]),
                     step=np.concatenate([r.step, np.full(n, EXCLUDED, dtype=np.int32)]),
                     channel=np.concatenate([r.channel, np.full(n, EXCLUDED, dtype=np.int8)]), n_steps=r.n_steps)


def rollout_task(policy, task, settings: RolloutSettings, run_examples: ExampleRunner, judge: Judge, *,
                 run: str, agent: str, fingerprint: str, capture: bool = True) -> tuple[list[Rollout], TaskStats]:
    """K rollouts of ``task`` generated as one batch, their states captured online (``capture``).

    ``task``: any object with ``task_id`` and ``prompt`` (the signature and docstring shown to the
    policy), e.g. ``rollout.tasks.Task``.
    ``run`` names the run (``traj_id = run/task_id/sNN``), ``agent`` the policy, ``fingerprint`` its
    digest (recorded per trajectory). ``run_examples`` and ``judge`` get the K samples' code at once
    (the sandbox runs them side by side, each in its own process); a reply without code calls nothing."""
    settings.check()
    t0 = time.perf_counter()
    stats = TaskStats()
    tok = policy.tokenizer
    seeds = sample_seeds(settings.seed, task.task_id, settings.k)
    batch = OnlineBatch(policy, seeds, stop_ids(policy), capture=capture)
    suffix = generation_suffix(tok)
    sampling = settings.sampling
    trajs = [Trajectory(traj_id=tid, instance_id=task.task_id, repo="", steps=[],
                        task_prompt=settings.user_template.format(prompt=task.prompt),
                        system_prompt=settings.system_prompt, agent=agent, run=run, source_format=SOURCE_FORMAT,
                        source_id=task.task_id,
                        meta={"scaffold": SCAFFOLD, "seed": seeds[i], "sample": i, "policy": fingerprint,
                              "temperature": settings.temperature, "top_p": settings.top_p,
                              "max_new_tokens": settings.max_new_tokens, "max_turns": settings.max_turns})
             for i, tid in enumerate(sample_traj_ids(run, task.task_id, settings.k))]
    code = [""] * settings.k
    code_rep: list[ToolReport | None] = [None] * settings.k   # the examples' result of code[i]
    active = list(range(settings.k))
    for turn in range(settings.max_turns):
        gen = batch.turn(active, [target_of(trajs[i], tok, suffix) for i in active], sampling)
        stats.generated += sum(len(g) for g in gen)
        texts, stops = [], []
        for g in gen:
            stopped = bool(g) and g[-1] in batch.stop
            texts.append(tok.decode(g[:-1] if stopped else g, skip_special_tokens=False))
            stops.append("stop" if stopped else "length")
        parsed = [parse_reply(t) for t in texts]
        t1 = time.perf_counter()
        calls = [j for j, p in enumerate(parsed) if p[1].strip()]
        got = list(run_examples(task, [parsed[j][1] for j in calls])) if calls else []
        reports: list[ToolReport | None] = [None] * len(parsed)
        for j, rep in zip(calls, got):
            reports[j] = rep
        stats.tool_seconds += time.perf_counter() - t1
        last = turn == settings.max_turns - 1
        still = []
        for i, (cot, fn, parts), rep, stop, n in zip(active, parsed, reports, stops, map(len, gen)):
            if fn.strip():
                code[i], code_rep[i] = fn, rep
            done = last or (rep is not None and rep.passed)
            obs = "" if done else (settings.feedback_template.format(report=rep.text) if rep is not None
                                   else settings.no_code_message)
            meta: dict[str, Any] = {"turn": turn, "action": "submit" if done else "run_examples",
                                    "stop": stop, "tokens": n}
            if rep is not None:
                meta["examples"] = {"passed": rep.passed, "n_passed": rep.n_passed, "n_total": rep.n_total,
                                    "report": rep.text}
            layout = [{"role": "assistant", "parts": parts}] + ([{"role": "user", "parts": [["obs", len(obs)]]}]
                                                                 if obs else [])
            trajs[i].steps.append(Step(cot=cot, fn=fn, obs=obs, fn_style="text", obs_role="user", meta=meta,
                                       layout=layout))
            if not done:
                still.append(i)
        active = still
        if not active:
            break
    finals = [target_of(t, tok) for t in trajs]
    batch.finish_many(range(settings.k), finals)
    t1 = time.perf_counter()
    submitted = [i for i, c in enumerate(code) if c.strip()]
    verdicts = [False] * settings.k
    for i, ok in zip(submitted, judge(task, [code[i] for i in submitted]) if submitted else []):
        verdicts[i] = bool(ok)
    stats.tool_seconds += time.perf_counter() - t1
    out = []
    for i, (t, ok) in enumerate(zip(trajs, verdicts)):
        t.patch = code[i]
        t.reward = float(ok)
        t.tests = {"hidden_passed": int(ok)}
        rep = code_rep[i]
        if rep is not None and rep.n_total:   # the submitted code's share of docstring examples passed
            t.tests[EXAMPLES_KEY] = rep.n_passed / rep.n_total
        t.meta["turns"] = t.n_steps
        out.append(Rollout(t, batch.states(i, finals[i], t.traj_id) if capture else None))
    stats.forward = batch.n_forward_tokens
    stats.seconds = time.perf_counter() - t0
    return out, stats
