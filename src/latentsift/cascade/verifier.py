"""The execution-free (EF) verifier: an LLM judge read as P(YES) / (P(YES) + P(NO)).

The paper's verifiers: appendix "EF verifier configurations". This module holds the prompt, its
condensation, the results on disk and the ``EFVerifier`` driver; the two backends (a local model,
an OpenAI-compatible endpoint) are in :mod:`latentsift.cascade.backends`.

Prompt
------
A system message states the judging task; one user message holds the interaction log and the
final patch in the reference layout (R2E-Gym's verifier data format)::

    === INTERACTION LOG ===
    [USER] <task prompt> [/USER]
    [STEP] t [/STEP]  [ASSISTANT] <thought>\\n\\n<action> [/ASSISTANT]  [USER] <observation> [/USER]  ...
    === END INTERACTION ===
    === FINAL PATCH ===  [PATCH] <patch> [/PATCH]  === END FINAL PATCH ===
    <question, answer YES or NO>

The verdict is read at the first answer position. With the default ``answer_prefix``
``"<judgement>"`` (the reference verifiers answer ``<judgement>YES</judgement>``) the prefix is
placed at the start of the assistant turn, so the next token is the answer itself.

Reading YES / NO
----------------
- Local backend: one forward pass, logits at the last position only; log-softmax over the
  vocabulary; P(YES) and P(NO) are read **by token id**: the first id of ``tokenizer.encode("YES")``
  and of ``tokenizer.encode("NO")`` without special tokens, i.e. as the words are tokenized right
  after the prefix, with no leading space. ``N_out = 1`` (one answer token read).
- OpenAI-compatible backend: ``/v1/chat/completions`` with ``max_tokens=1``, ``logprobs=true``,
  ``top_logprobs=20``. Remote APIs return tokens as *text*, not ids, so YES / NO are the entries of
  the first position's ``top_logprobs`` whose text, stripped of whitespace, equals ``"YES"`` /
  ``"NO"`` (variants add up). A word absent from the top 20 counts as probability 0; neither
  present is a failure. Tokens are the server's ``usage`` (the verifier's own tokenizer) or, when
  the server gives none, the count of a local ``tokenizer`` passed to the backend.

Condensation (prompt longer than ``max_prompt_tokens``)
--------------------------------------------------------
1. Replace the longest assistant thoughts, one at a time and longest first, with
   ``THOUGHT_PLACEHOLDER``; the first thought is never condensed.
2. Then truncate the longest observations to their first ``head_tokens`` tokens plus
   ``OBS_MARKER``.
3. Then truncate the longest remaining actions, the first thought and the task prompt (longest
   first) to ``head_tokens`` tokens plus ``CUT_MARKER``.
4. Then drop whole steps, oldest after the first (the last step is kept), replaced by one
   ``[STEPS i-j omitted ...]`` line.
5. Then repeat rules 2-3 with the head halved (32, 16, 8 tokens) until the prompt fits, so the
   patch is kept whole as long as possible.
6. Last resort: truncate the final patch to the longest head that fits, plus ``CUT_MARKER``.
The counts record edits per rule (a block shortened twice counts twice).
A prompt that still does not fit is a :class:`VerifierFailure`. Every call records what was
condensed (``n_condensed`` and the per-rule counts).

Failures and caching
--------------------
A call that times out, gets a 5xx/429, or returns no usable logprobs is retried ``max_retries``
times with exponential backoff, then reported as a :class:`VerifierFailure` for that candidate (no
score; never 0.5). Results are keyed by ``traj_id``, never by completion order. Calls are cached on
disk by sha256 of (backend id, model fingerprint, prompt, answer settings), so a rerun costs
nothing; cached verdicts are marked ``cached=True`` and still report the tokens the call cost.
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .._core.io import atomic_write_text, iter_jsonl, read_json
from .._core.manifests import VerifierManifest, check_manifest
from .._core.validation import LatentSiftError, check_positive_int
from ..sift.rules import register_filter
# the backends are part of the verifier's API: VerifierBackend and its two, yes_no_score, RawJudgement
from .backends import (NO, YES, CallFailed, LocalVerifierBackend, OpenAIBackend, RawJudgement, VerifierBackend,
                       yes_no_score)

THOUGHT_PLACEHOLDER = "<Thought condensed for saving context>"
OBS_MARKER = "\n<Observation truncated for saving context>"
CUT_MARKER = "\n<Truncated for saving context>"
MAX_PROMPT_TOKENS = 1024   # default budget of the CPU run (SmolLM2 ~1,700 tok/s on 2 cores)
HEAD_TOKENS = 64           # kept head of a truncated block (rules 2 and 3)
MIN_HEAD_TOKENS = 8        # rule 5 halves the heads down to this size
ANSWER_PREFIX = "<judgement>"
RESULTS_FILE = "verdicts.jsonl"
MANIFEST_FILE = "manifest.json"

SYSTEM_PROMPT = (
    "You are judging whether a software engineering agent fixed a GitHub issue. You will read the "
    "whole interaction between the agent and its environment and the final patch it produced.\n\n"
    "Consider:\n"
    "1. Does the patch address the problem the issue describes?\n"
    "2. Does it handle the cases and requirements the issue states?\n"
    "3. Are there errors, missing pieces or regressions in the final solution?\n"
    "4. Did the agent check that the solution works?\n\n"
    "Answer only with \"<judgement>YES</judgement>\" or \"<judgement>NO</judgement>\"."
)
QUESTION = ("Based on the above interaction, did the assistant successfully resolve the user's "
            "initial request? Respond with YES or NO.")


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class Verdict:
    """One scored call. ``score = p_yes / (p_yes + p_no)``."""

    traj_id: str
    score: float
    p_yes: float
    p_no: float
    n_in: int
    n_out: int
    n_condensed: int = 0
    condensed: dict = field(default_factory=dict)
    attempts: int = 1
    cached: bool = False
    error: None = None


@dataclass(frozen=True)
class VerifierFailure:
    """A candidate the verifier could not score after all retries: it has no score (never 0.5).

    ``n_in`` / ``n_out``: tokens charged for the failed attempts when the server reported them
    (usually 0: a timeout reports nothing).
    """

    traj_id: str
    error: str
    attempts: int
    n_in: int = 0
    n_out: int = 0
    n_condensed: int = 0
    condensed: dict = field(default_factory=dict)
    cached: bool = False

    @property
    def score(self) -> None:
        return None


VerifierResult = Verdict | VerifierFailure


def result_to_dict(r: VerifierResult) -> dict:
    d = asdict(r)
    d["score"] = r.score
    d["kind"] = "failure" if isinstance(r, VerifierFailure) else "verdict"
    return d


def result_from_dict(d: Mapping, where: str = "record") -> VerifierResult:
    if not isinstance(d, Mapping):
        raise LatentSiftError(f"{where}: a verifier result must be a JSON object.")
    kind = d.get("kind")
    try:
        if kind == "verdict":
            s = d["score"]
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0.0 <= s <= 1.0):
                raise LatentSiftError(f"{where}: field 'score' must be a number in [0, 1]. Got {s!r} instead.")
            return Verdict(traj_id=str(d["traj_id"]), score=float(s), p_yes=float(d["p_yes"]),
                           p_no=float(d["p_no"]), n_in=int(d["n_in"]), n_out=int(d["n_out"]),
                           n_condensed=int(d.get("n_condensed", 0)), condensed=dict(d.get("condensed", {})),
                           attempts=int(d.get("attempts", 1)), cached=bool(d.get("cached", False)))
        if kind == "failure":
            if d.get("score") is not None:
                raise LatentSiftError(f"{where}: a failure record must have score null.")
            return VerifierFailure(traj_id=str(d["traj_id"]), error=str(d["error"]), attempts=int(d["attempts"]),
                                   n_in=int(d.get("n_in", 0)), n_out=int(d.get("n_out", 0)),
                                   n_condensed=int(d.get("n_condensed", 0)),
                                   condensed=dict(d.get("condensed", {})), cached=bool(d.get("cached", False)))
    except KeyError as e:
        raise LatentSiftError(f"{where}: missing field {e.args[0]!r} of a verifier result.") from None
    except (TypeError, ValueError) as e:  # e.g. p_yes "x", n_in 1.5e400, condensed a list
        raise LatentSiftError(f"{where}: a field of the verifier result has the wrong type or value ({e}).") from None
    raise LatentSiftError(f"{where}: field 'kind' must be 'verdict' or 'failure'. Got {kind!r} instead.")


def save_results(results: Mapping[str, VerifierResult], out_dir: str | Path, *, name: str,
                 manifest: Mapping[str, Any] | None = None) -> Path:
    """Write ``verdicts.jsonl`` (sorted by traj_id) and ``manifest.json`` (kind "ef") atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    man = {"kind": "ef", "name": name, "n_results": len(results),
           "n_failed": sum(1 for r in results.values() if r.score is None), **dict(manifest or {})}
    atomic_write_text(out / MANIFEST_FILE, json.dumps(man, indent=1, ensure_ascii=False) + "\n")
    lines = [json.dumps(result_to_dict(results[t]), ensure_ascii=False) for t in sorted(results)]
    atomic_write_text(out / RESULTS_FILE, "\n".join(lines) + ("\n" if lines else ""))
    return out


def load_results(path: str | Path) -> tuple[str, dict[str, VerifierResult], dict]:
    """Read a verifier output folder (or a ``verdicts.jsonl`` file). Returns (name, results, manifest)."""
    p = Path(path)
    man: dict = {}
    if p.is_dir():
        if (p / MANIFEST_FILE).is_file():
            man = check_manifest(read_json(p / MANIFEST_FILE), VerifierManifest, p / MANIFEST_FILE,
                                 "write the results again ('latentsift verify')")
        p = p / RESULTS_FILE
    if not p.is_file():
        raise LatentSiftError(f"No such verifier results file: {str(p)!r}.")
    results: dict[str, VerifierResult] = {}
    for where, d in iter_jsonl(p):
        r = result_from_dict(d, where)
        if r.traj_id in results:
            raise LatentSiftError(f"{where}: duplicate traj_id {r.traj_id!r}.")
        results[r.traj_id] = r
    name = man.get("name") or (p.parent.name if p.name == RESULTS_FILE else p.stem)
    return name, results, man


# ----------------------------------------------------------------------------- prompt

@dataclass
class _Parts:
    """The blocks of one judge prompt; condensation edits them in place."""

    task: str
    thoughts: list[str]
    actions: list[str]
    obs: list[str]
    patch: str
    dropped: list[bool]


def _parts(traj) -> _Parts:
    steps = traj.steps
    return _Parts(task=traj.task_prompt, thoughts=[s.cot for s in steps], actions=[s.fn for s in steps],
                  obs=[s.obs for s in steps], patch=traj.patch, dropped=[False] * len(steps))


def render_log(p: _Parts, question: str = QUESTION) -> str:
    """The user message: interaction log ([ASSISTANT] thought + action, [USER] observation per
    step) and the final patch, then the YES/NO question (reference layout)."""
    out = ["Please evaluate the following interaction between an AI assistant and a user:\n\n",
           "=== INTERACTION LOG ===\n\n", f"[USER]\n{p.task}\n[/USER]"]
    t, n = 0, len(p.thoughts)
    while t < n:
        if p.dropped[t]:
            j = t
            while j + 1 < n and p.dropped[j + 1]:
                j += 1
            out.append(f"\n\n[STEPS {t}-{j} omitted for saving context]")
            t = j + 1
            continue
        th, act = p.thoughts[t], p.actions[t]
        resp = f"{th}\n\n{act}" if th else act
        out.append(f"\n\n[STEP]\n{t}\n[/STEP]\n\n[ASSISTANT]\n{resp}\n[/ASSISTANT]\n\n[USER]\n{p.obs[t]}\n[/USER]")
        t += 1
    out.append(f"\n\n=== END INTERACTION ===\n\n=== FINAL PATCH ===\n\n[PATCH]\n{p.patch}\n[/PATCH]"
               f"\n\n=== END FINAL PATCH ===\n\n{question}")
    return "".join(out)


def build_prompt(traj, *, system_prompt: str = SYSTEM_PROMPT, question: str = QUESTION) -> tuple[str, str]:
    """(system, user) messages of the judge prompt for a canonical Trajectory, uncondensed."""
    return system_prompt, render_log(_parts(traj), question)


#: Threads that build the judge prompts (the tokenizer releases the GIL; each thread uses its own copy).
PROMPT_THREADS = max(1, min(8, os.cpu_count() or 1))


class PromptTooLong(Exception):
    """The prompt does not fit the budget even after every condensation rule."""

    def __init__(self, msg: str, counts: dict):
        super().__init__(msg)
        self.counts = counts


def condense(traj, budget: int, count_prompt: Callable[[str, str], int], count_text: Callable[[str], int],
             head: Callable[[str, int], str], *, system_prompt: str = SYSTEM_PROMPT,
             question: str = QUESTION, head_tokens: int = HEAD_TOKENS) -> tuple[str, str, int, dict]:
    """Fit the judge prompt into ``budget`` tokens (module docstring, rules 1-6).

    ``count_prompt(system, user)`` counts the full templated prompt (what is charged);
    ``count_text`` counts one block (to choose what to condense); ``head(text, n)`` keeps the first
    ``n`` tokens of a text. Returns (system, user, n_tokens, per-rule counts).
    Length: rules 1-6 run in their documented order on one set of prompt parts and one running
    count, each only while the prompt is still over budget; kept together so that order reads in one place.
    """
    system, user = build_prompt(traj, system_prompt=system_prompt, question=question)
    n = count_prompt(system, user)
    counts = {"thoughts": 0, "observations": 0, "blocks": 0, "steps_dropped": 0, "patch": 0}
    if n <= budget:
        return system, user, n, counts
    p = _parts(traj)
    ph = count_text(THOUGHT_PLACEHOLDER)

    def run(cands: list[tuple[int, Callable[[], int]]], key: str, n: int) -> int:
        """Apply edits longest first; recount the real prompt whenever the estimate fits."""
        est = n
        for size, apply in sorted(cands, key=lambda c: -c[0]):
            if est <= budget:
                n = count_prompt(system_prompt, render_log(p, question))
                if n <= budget:
                    return n
                est = n
            saved = apply()
            counts[key] += 1
            est -= saved
        return count_prompt(system_prompt, render_log(p, question))

    def set_thought(i):
        def f():
            old = count_text(p.thoughts[i])
            p.thoughts[i] = THOUGHT_PLACEHOLDER
            return old - ph
        return f

    # Rule 1: longest assistant thoughts first, never the first one.
    cands = [(count_text(p.thoughts[i]), set_thought(i)) for i in range(1, len(p.thoughts))
             if p.thoughts[i] and p.thoughts[i] != THOUGHT_PLACEHOLDER and count_text(p.thoughts[i]) > ph]
    n = run(cands, "thoughts", n)
    heads = [head_tokens]
    while heads[-1] // 2 >= MIN_HEAD_TOKENS:
        heads.append(heads[-1] // 2)
    for i, h in enumerate(heads):  # rules 2-3 at head_tokens, then (rule 5) at halved heads
        if n > budget:  # Rule 2: longest observations to a head.
            n = run(_head_edits(p, "obs", range(len(p.obs)), count_text, head, h, OBS_MARKER), "observations", n)
        if n > budget:  # Rule 3: longest remaining actions, first thought, task prompt to a head.
            edits = (_head_edits(p, "actions", range(len(p.actions)), count_text, head, h, CUT_MARKER)
                     + _head_edits(p, "thoughts", [0] if p.thoughts else [], count_text, head, h, CUT_MARKER)
                     + _head_edits(p, "task", [None], count_text, head, h, CUT_MARKER))
            n = run(edits, "blocks", n)
        if n > budget and i == 0:  # Rule 4: drop whole steps, oldest after the first (the last step stays).
            est = n
            for t in range(1, len(p.dropped) - 1):
                p.dropped[t] = True
                counts["steps_dropped"] += 1
                est -= sum(count_text(x) for x in (p.thoughts[t], p.actions[t], p.obs[t])) + 20
                if est <= budget or t == len(p.dropped) - 2:
                    n = count_prompt(system_prompt, render_log(p, question))
                    if n <= budget:
                        break
                    est = n
        if n <= budget:
            break
    if n > budget and p.patch:  # Rule 6 (last resort): the final patch to the head that fits.
        size = count_text(p.patch)
        original = p.patch
        keep = size - (n - budget) - count_text(CUT_MARKER) - 2
        for _ in range(4):
            if keep <= 0:
                break
            p.patch = head(original, keep) + CUT_MARKER
            counts["patch"] = 1
            n = count_prompt(system_prompt, render_log(p, question))
            if n <= budget:
                break
            keep -= (n - budget) + 2
    if n > budget:
        raise PromptTooLong(f"the prompt needs {n} tokens after condensation; the budget is {budget}", counts)
    return system_prompt, render_log(p, question), n, counts


def _head_edits(p: _Parts, field_name: str, idx, count_text, head, head_tokens: int, marker: str):
    out = []
    for i in idx:
        text = getattr(p, field_name) if i is None else getattr(p, field_name)[i]
        size = count_text(text) if text else 0
        if size <= head_tokens + count_text(marker):
            continue

        def apply(i=i, text=text, size=size):
            new = head(text, head_tokens) + marker
            if i is None:
                setattr(p, field_name, new)
            else:
                getattr(p, field_name)[i] = new
            return size - count_text(new)
        out.append((size, apply))
    return out


# ----------------------------------------------------------------------------- the verifier

class EFVerifier:
    """Score canonical trajectories with an LLM judge; results keyed by ``traj_id``.

    Settings: ``max_prompt_tokens`` (budget; longer prompts are condensed), ``head_tokens``,
    ``answer_prefix``, ``system_prompt``, ``question``, ``cache_dir`` (None = no cache).
    """

    def __init__(self, backend, *, max_prompt_tokens: int = MAX_PROMPT_TOKENS, head_tokens: int = HEAD_TOKENS,
                 answer_prefix: str = ANSWER_PREFIX, system_prompt: str = SYSTEM_PROMPT, question: str = QUESTION,
                 cache_dir: str | os.PathLike | None = None):
        self.backend = backend
        self.max_prompt_tokens = check_positive_int(max_prompt_tokens, "max_prompt_tokens", "EFVerifier")
        self.head_tokens = check_positive_int(head_tokens, "head_tokens", "EFVerifier")
        ctx = getattr(backend, "context_length", None)
        if ctx is not None and self.max_prompt_tokens > ctx:
            raise LatentSiftError(f"The 'max_prompt_tokens' parameter of EFVerifier must be at most the model "
                                  f"context ({ctx}). Got {max_prompt_tokens} instead.")
        self.answer_prefix = answer_prefix
        self.system_prompt = system_prompt
        self.question = question
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None

    def _count_prompt(self, system: str, user: str) -> int:
        return self.backend.count_prompt(system, user, self.answer_prefix)

    def prompt(self, traj) -> tuple[str, str, int, dict]:
        """(system, user, n_prompt_tokens, condensation counts) for one trajectory."""
        return condense(traj, self.max_prompt_tokens, self._count_prompt, self.backend.count_text,
                        self.backend.head, system_prompt=self.system_prompt, question=self.question,
                        head_tokens=self.head_tokens)

    def cache_key(self, system: str, user: str) -> str:
        blob = json.dumps([self.backend.backend_id, system, user, self.answer_prefix, YES, NO], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _built_prompt(self, traj) -> tuple[str, str, int, dict] | PromptTooLong:
        try:
            return self.prompt(traj)
        except PromptTooLong as e:
            return e

    def score_one(self, traj, built: tuple[str, str, int, dict] | PromptTooLong | None = None) -> VerifierResult:
        """Score one trajectory; ``built`` is its :meth:`prompt` (or the ``PromptTooLong`` it raised)
        when already computed."""
        built = self._built_prompt(traj) if built is None else built
        if isinstance(built, PromptTooLong):  # no call is made: nothing charged
            return VerifierFailure(traj.traj_id, str(built), attempts=0, n_condensed=sum(built.counts.values()),
                                   condensed=built.counts)
        system, user, _, counts = built
        n_cond = sum(counts.values())
        key = self.cache_key(system, user)
        hit = self._cache_get(key)
        if hit is not None:
            return Verdict(traj.traj_id, hit["score"], hit["p_yes"], hit["p_no"], hit["n_in"], hit["n_out"],
                           n_cond, counts, hit["attempts"], cached=True)
        try:
            raw = self.backend.judge(system, user, self.answer_prefix)
        except CallFailed as e:
            return VerifierFailure(traj.traj_id, str(e), e.attempts, e.n_in, e.n_out, n_cond, counts)
        self._cache_put(key, {"score": raw.score, "p_yes": raw.p_yes, "p_no": raw.p_no, "n_in": raw.n_in,
                              "n_out": raw.n_out, "attempts": raw.attempts})
        return Verdict(traj.traj_id, raw.score, raw.p_yes, raw.p_no, raw.n_in, raw.n_out, n_cond, counts,
                       raw.attempts)

    def score(self, trajectories: Sequence, progress: Callable[[int, int], None] | None = None
              ) -> dict[str, VerifierResult]:
        """Score every trajectory; a dict keyed by traj_id (never by completion order)."""
        trajs = list(trajectories)
        ids = [t.traj_id for t in trajs]
        if len(set(ids)) != len(ids):
            raise LatentSiftError("EFVerifier.score: duplicate traj_ids in the input.")
        results: dict[str, VerifierResult] = {}
        workers = int(getattr(self.backend, "concurrency", 1))
        if workers <= 1:
            # the prompts first, on every core (the tokenizer releases the GIL; tokenizing is most of a
            # cached rerun's time), then the calls one at a time (the model uses the cores itself)
            with ThreadPoolExecutor(max_workers=PROMPT_THREADS) as pool:
                built = list(pool.map(self._built_prompt, trajs))
            for i, (t, b) in enumerate(zip(trajs, built)):
                results[t.traj_id] = self.score_one(t, b)
                if progress:
                    progress(i + 1, len(trajs))
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = {t.traj_id: pool.submit(self.score_one, t) for t in trajs}
                try:
                    for i, (tid, fut) in enumerate(futures.items()):
                        results[tid] = fut.result()
                        if progress:
                            progress(i + 1, len(trajs))
                except BaseException:  # an error, Ctrl-C or a stop from progress: no prompt is started after it
                    for fut in futures.values():
                        fut.cancel()
                    raise
        return {t: results[t] for t in ids}

    def manifest(self) -> dict:
        return {"backend": self.backend.describe(), "max_prompt_tokens": self.max_prompt_tokens,
                "head_tokens": self.head_tokens, "answer_prefix": self.answer_prefix, "yes": YES, "no": NO,
                "system_prompt_sha": hashlib.sha256(self.system_prompt.encode()).hexdigest()[:16],
                "question": self.question}

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cache_get(self, key: str) -> dict | None:
        if self.cache_dir is None:
            return None
        p = self._cache_path(key)
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, OSError):
            return None  # a torn cache entry is recomputed, never trusted

    def _cache_put(self, key: str, value: dict) -> None:
        if self.cache_dir is None:
            return
        p = self._cache_path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, json.dumps(value))


#: The EF verifier's name among the filters (its scores as a Stage-1 filter: the original workflow).
EF = "ef_verifier"
register_filter(EF, kind="verifier", label="LLM EF verifier (original workflow)", color="#2ca02c")(EFVerifier)
