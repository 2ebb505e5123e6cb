"""The EF verifier's backends (``VerifierBackend``): a local causal LM and an OpenAI-compatible endpoint.

Each reads P(YES) and P(NO) at the first answer position of a judge prompt (how, and its pitfalls:
:mod:`latentsift.cascade.verifier`, "Reading YES / NO") and answers ``judge(system, user, prefix)`` with a
``RawJudgement``, or raises ``CallFailed`` with the tokens it was charged. A backend is registered
(``latentsift._core.registry``, kind "verifier_backend") under the name ``latentsift verify --backend``
takes, and built from the command's options by its ``from_options``; a new one is one subclass and
one registration.
"""
from __future__ import annotations

import abc
import copy
import functools
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .._core.registry import registry_add, registry_lookup, registry_names
from .._core import words
from .._core.attention import exact_attention
from .._core.threads import NUMERIC_THREADS, fixed_threads
from .._core.validation import LatentSiftError, check_positive_int, param_error
from ..states.model import load_policy

YES, NO = "YES", "NO"
TOP_LOGPROBS = 20


def token_ids(tok, text: str) -> list[int]:
    """The ids of ``text`` with no special tokens added, as ``tok(text, add_special_tokens=False)``
    gives them: from the Rust tokenizer's ``encode_batch_fast`` (no character offsets: measured 1.5x
    faster on the judge prompts' 42,000 characters, the same ids) when it has no truncation or padding
    of its own (transformers' call would switch those off), else through transformers."""
    bt = getattr(tok, "backend_tokenizer", None)
    if bt is not None and hasattr(bt, "encode_batch_fast") and bt.truncation is None and bt.padding is None:
        return bt.encode_batch_fast([text], add_special_tokens=False)[0].ids
    return list(tok(text, add_special_tokens=False)["input_ids"])


class CallFailed(Exception):
    """One verifier call that produced no score (carries tokens charged and attempts)."""

    def __init__(self, msg: str, attempts: int, n_in: int = 0, n_out: int = 0):
        super().__init__(msg)
        self.attempts, self.n_in, self.n_out = attempts, n_in, n_out


def thread_tokenizer(tokenizer, local: threading.local):
    """``tokenizer`` in the main thread, a deep copy of it per other thread (the copies encode the same).

    Defensive: transformers' ``__call__`` resets truncation and padding on the shared Rust object
    whenever they differ from what the call asks, and a fast tokenizer mutated by one thread while
    another encodes raises "RuntimeError: Already borrowed" (huggingface/tokenizers#537). With this
    package's calls on the packaged tokenizer 8 threads did not trigger it (400 texts); a tokenizer
    that ships with truncation or padding set could."""
    if tokenizer is None or threading.current_thread() is threading.main_thread():
        return tokenizer
    tok = getattr(local, "tokenizer", None)
    if tok is None:
        tok = local.tokenizer = copy.deepcopy(tokenizer)
    return tok


@dataclass
class RawJudgement:
    p_yes: float
    p_no: float
    score: float
    n_in: int
    n_out: int
    attempts: int = 1


class VerifierBackend(abc.ABC):
    """Where the EF verifier's judge runs.

    ``backend_id`` names the model for the cache key; ``concurrency``: prompts scored at once;
    ``context_length``: the model's context when known (the prompt budget must fit it), else None.
    ``count_text`` / ``head`` / ``count_prompt`` measure and cut text in the judge's tokens (for the
    condensation of long logs), ``judge`` scores one prompt, ``describe`` goes to the manifest.
    """

    backend_id: str = ""
    concurrency: int = 1
    context_length: int | None = None

    @classmethod
    def from_options(cls, **options: Any) -> "VerifierBackend":
        """The backend ``latentsift verify`` builds from its options (``model``, ``dtype``, ``threads``,
        ``base_url``, ``api_model``, ``api_key_env``, ``timeout``, ``retries``, ``concurrency``; each
        backend reads those it needs)."""
        raise LatentSiftError(f"The verifier backend {cls.__name__} cannot be built from command-line options.")

    @abc.abstractmethod
    def judge(self, system: str, user: str, prefix: str, yes: str = YES, no: str = NO) -> RawJudgement:
        """P(YES), P(NO), the score and the tokens charged for one judge prompt."""

    @abc.abstractmethod
    def count_text(self, text: str) -> int:
        """Tokens of ``text``."""

    @abc.abstractmethod
    def head(self, text: str, n: int) -> str:
        """The first ``n`` tokens of ``text``."""

    @abc.abstractmethod
    def count_prompt(self, system: str, user: str, prefix: str) -> int:
        """Tokens of the whole judge prompt."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """What the manifest records of the backend."""

    def close(self) -> None:
        """Release what the backend holds (connections)."""


class LocalVerifierBackend(VerifierBackend):
    """A local causal LM (default: the packaged SmolLM2 via ``latentsift.states.model.load_policy``).

    The prompt is the model's chat template (system + user, ``add_generation_prompt=True``) followed
    by the answer prefix; one forward pass with ``logits_to_keep=1``; P(YES) and P(NO) by token id
    (module docstring). Pitfall: SmolLM2 splits ``"YES"`` into ``"Y" + "ES"``, so its YES id is the
    id of ``"Y"`` (the first token of the word as the tokenizer encodes it); ``"NO"`` is one token.

    Each forward runs at one torch thread (a score must not depend on the machine's core count:
    ``states.replay``), and ``concurrency`` prompts are scored at once: the torch thread count on a
    CPU, one on a GPU (``Policy.replay_workers``).
    """

    def __init__(self, model: str | os.PathLike | None = None, *, policy=None, dtype: str = "auto",
                 device: str | None = None, reuse_head: bool = True):
        if policy is None:
            policy = load_policy(model, dtype=dtype, device=device)
        self.policy = policy
        self.tokenizer = policy.tokenizer
        if not getattr(self.tokenizer, "chat_template", None):
            raise LatentSiftError(f"The verifier model {policy.path!r} has no chat template; the judge prompt "
                                  "needs one (use an instruction-tuned model).")
        self.backend_id = f"local:{policy.fingerprint.digest}"
        self.reuse_head = reuse_head
        self.concurrency = policy.replay_workers()
        self._head: tuple[str, list[int], Any] | None = None
        self._head_lock = threading.Lock()
        self._local = threading.local()
        # condensation counts the same blocks again and again
        self.count_text = functools.lru_cache(maxsize=4096)(self._count_text)

    @classmethod
    def from_options(cls, *, model=None, dtype: str = "auto", threads: int | None = None,
                     **_: Any) -> "LocalVerifierBackend":
        if threads is not None:
            import torch

            if threads < 1:
                raise LatentSiftError(f"--threads must be a positive int. Got {threads} instead.")
            torch.set_num_threads(threads)
        return cls(model, dtype=dtype)

    @property
    def context_length(self) -> int:
        return self.policy.context_length

    @property
    def _tok(self):
        return thread_tokenizer(self.tokenizer, self._local)

    def answer_ids(self, yes: str = YES, no: str = NO) -> tuple[int, int]:
        ids = [self.tokenizer.encode(w, add_special_tokens=False) for w in (yes, no)]
        if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
            raise LatentSiftError(f"The tokenizer does not give {yes!r} and {no!r} distinct first tokens.")
        return ids[0][0], ids[1][0]

    def encode(self, system: str, user: str, prefix: str) -> list[int]:
        tok = self._tok
        text = tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            add_generation_prompt=True, tokenize=False) + prefix
        return token_ids(tok, text)

    def _count_text(self, text: str) -> int:
        return len(token_ids(self._tok, text)) if text else 0

    def count_text(self, text: str) -> int:  # replaced per instance by a cached ``_count_text``
        return self._count_text(text)

    def count_prompt(self, system: str, user: str, prefix: str) -> int:
        return len(self.encode(system, user, prefix))

    def head(self, text: str, n: int) -> str:
        tok = self._tok
        return tok.decode(token_ids(tok, text)[:n])

    def judge(self, system: str, user: str, prefix: str, yes: str = YES, no: str = NO) -> RawJudgement:
        import torch

        ids = self.encode(system, user, prefix)
        if len(ids) > self.policy.context_length:
            raise CallFailed(f"prompt of {len(ids)} tokens exceeds the model context {self.policy.context_length}", 0)
        yes_id, no_id = self.answer_ids(yes, no)
        head, cache = self._shared_head(system) if self.reuse_head else ([], None)
        dev = self.policy.device
        with torch.inference_mode(), fixed_threads(NUMERIC_THREADS), exact_attention(dev):
            if cache is not None and len(ids) > len(head) and ids[:len(head)] == head:
                out = self.policy.model(input_ids=torch.tensor([ids[len(head):]], device=dev), logits_to_keep=1,
                                        past_key_values=copy.deepcopy(cache), use_cache=True)
            else:
                out = self.policy.model(input_ids=torch.tensor([ids], device=dev), logits_to_keep=1, use_cache=False)
        logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        lp_yes, lp_no = float(logp[yes_id]), float(logp[no_id])
        return RawJudgement(math.exp(lp_yes), math.exp(lp_no), yes_no_score(lp_yes, lp_no), len(ids), 1)

    def _shared_head(self, system: str) -> tuple[list[int], Any]:
        """The token head that every prompt with this system prompt starts with (the templated system
        message and the opening of the user turn) and its KV cache, computed once per system prompt.

        Each call then runs only the rest of its prompt on a copy of that cache: about a quarter of
        the default 512-token prompts. Tokens charged are unchanged (the whole prompt); the score
        equals a full forward pass up to float rounding (tested), and depends on the prompt alone,
        never on the order of calls. A model whose forward takes no cache gets full passes.
        """
        with self._head_lock:  # computed once, by whichever scoring thread comes first
            if self._head is None or self._head[0] != system:
                self._head = self._compute_head(system)
            return self._head[1], self._head[2]

    def _compute_head(self, system: str) -> tuple[str, list[int], Any]:
        import torch

        a, b = self.encode(system, "a", ""), self.encode(system, "b", "")
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if not n:
            return system, [], None
        try:
            with torch.inference_mode(), fixed_threads(NUMERIC_THREADS), exact_attention(self.policy.device):
                out = self.policy.model(input_ids=torch.tensor([a[:n]], device=self.policy.device),
                                        logits_to_keep=1, use_cache=True)
        except (TypeError, ValueError):  # a model without a KV cache: full passes
            return system, a[:n], None
        return system, a[:n], out.past_key_values

    def describe(self) -> dict:
        yes_id, no_id = self.answer_ids()
        return {"backend": words.LOCAL, "model": self.policy.path, "fingerprint": self.policy.fingerprint.to_dict(),
                "yes_token_id": yes_id, "no_token_id": no_id}


def yes_no_score(lp_yes: float, lp_no: float) -> float:
    """P(YES) / (P(YES) + P(NO)) from log-probabilities (computed as a sigmoid, no underflow)."""
    if lp_yes == -math.inf and lp_no == -math.inf:
        raise ValueError("both log-probabilities are -inf")
    d = lp_no - lp_yes  # score = 1 / (1 + P(NO)/P(YES))
    if d > 700:
        return 0.0
    return 1.0 / (1.0 + math.exp(d))


class OpenAIBackend(VerifierBackend):
    """Any OpenAI-compatible ``/v1/chat/completions`` endpoint with logprobs (vLLM, SGLang, ...).

    Request: ``max_tokens=1``, ``temperature=0``, ``logprobs=true``, ``top_logprobs=20``. With a
    non-empty answer prefix it is sent as a final assistant message with ``prefill_params``
    (default vLLM's ``continue_final_message=true, add_generation_prompt=false``); for a server
    without prefill support use ``answer_prefix=""`` in :class:`EFVerifier` and a system prompt
    asking for a bare YES/NO. YES/NO are read by token *text* from the first position's
    ``top_logprobs`` (remote APIs give text, not ids). Timeouts, transport errors, 429 and 5xx, and
    responses without logprobs are retried ``max_retries`` times (backoff ``backoff * 2**i`` s),
    then reported as a failure. Tokens are the response's ``usage``; a server without ``usage``
    needs ``tokenizer`` (the verifier's own, to count them locally), else the call is an error.
    ``count_text`` / ``head`` for condensation use ``tokenizer`` when given, else ~4 characters per
    token (documented estimate, used only to choose what to condense).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, backoff: float = 1.0, concurrency: int = 4, tokenizer=None,
                 prefill_params: Mapping[str, Any] | None = None, top_logprobs: int = TOP_LOGPROBS,
                 sleep: Callable[[float], None] = time.sleep):
        import httpx

        if not base_url.startswith(("http://", "https://")):
            raise param_error("base_url", "OpenAIBackend", "an http(s) URL such as http://127.0.0.1:8000/v1", base_url)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        if self.max_retries < 0:
            raise param_error("max_retries", "OpenAIBackend", "a non-negative int", max_retries)
        self.backoff = float(backoff)
        self.concurrency = check_positive_int(concurrency, "concurrency", "OpenAIBackend")
        self.tokenizer = tokenizer
        self._local = threading.local()
        self.top_logprobs = top_logprobs
        self.prefill_params = dict(prefill_params if prefill_params is not None else
                                   {"continue_final_message": True, "add_generation_prompt": False})
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=self.timeout, headers=headers)
        self.backend_id = f"openai:{self.url}:{model}"

    @classmethod
    def from_options(cls, *, base_url: str | None = None, api_model: str | None = None,
                     api_key_env: str | None = None, timeout: float = 60.0, retries: int = 3, concurrency: int = 4,
                     **_: Any) -> "OpenAIBackend":
        if not base_url or not api_model:
            raise LatentSiftError("--backend openai needs --base-url and --api-model.")
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and key is None:
            raise LatentSiftError(f"--api-key-env: the environment variable {api_key_env} is not set.")
        return cls(base_url, api_model, api_key=key, timeout=timeout, max_retries=retries, concurrency=concurrency)

    def close(self) -> None:
        self._client.close()

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        tok = thread_tokenizer(self.tokenizer, self._local)
        if tok is not None:
            return len(token_ids(tok, text))
        return max(1, len(text) // 4)

    def head(self, text: str, n: int) -> str:
        tok = thread_tokenizer(self.tokenizer, self._local)
        if tok is not None:
            return tok.decode(token_ids(tok, text)[:n])
        return text[: 4 * n]

    def count_prompt(self, system: str, user: str, prefix: str) -> int:
        tok = thread_tokenizer(self.tokenizer, self._local)
        if tok is not None and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": user}],
                add_generation_prompt=True, tokenize=False) + prefix
            return len(token_ids(tok, text))
        return self.count_text(system) + self.count_text(user) + self.count_text(prefix) + 16

    def judge(self, system: str, user: str, prefix: str, yes: str = YES, no: str = NO) -> RawJudgement:
        import httpx

        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0,
                                "logprobs": True, "top_logprobs": self.top_logprobs}
        if prefix:
            messages.append({"role": "assistant", "content": prefix})
            body.update(self.prefill_params)
        n_in = n_out = 0
        last = "no attempt"
        for attempt in range(1, self.max_retries + 2):
            if attempt > 1:
                self._sleep(self.backoff * 2 ** (attempt - 2))
            try:
                resp = self._client.post(self.url, json=body)
            except httpx.TimeoutException:
                last = f"timeout after {self.timeout:g} s"
                continue
            except httpx.TransportError as e:
                last = f"transport error: {type(e).__name__}: {e}"
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise CallFailed(f"HTTP {resp.status_code}: {resp.text[:200]}", attempt, n_in, n_out)
            try:
                payload = resp.json()
            except ValueError:
                last = "response is not JSON"
                continue
            usage = payload.get("usage") or {}
            if "prompt_tokens" in usage:
                n_in += int(usage["prompt_tokens"])
                n_out += int(usage.get("completion_tokens", 0))
            elif self.tokenizer is not None:
                n_in += self.count_prompt(system, user, prefix)
                n_out += 1
            else:
                raise LatentSiftError(f"The endpoint {self.url} returned no 'usage'; pass the verifier's "
                                      "tokenizer to OpenAIBackend(tokenizer=...) so tokens can be counted.")
            top = _first_top_logprobs(payload)
            if top is None:
                last = "response has no logprobs for the first answer token"
                continue
            lp = {yes: [], no: []}
            for entry in top:
                tok = str(entry.get("token", "")).strip()
                if tok in lp and entry.get("logprob") is not None:
                    lp[tok].append(float(entry["logprob"]))
            if not lp[yes] and not lp[no]:
                raise CallFailed(f"neither {yes!r} nor {no!r} among the top {len(top)} logprobs "
                                 f"({[e.get('token') for e in top[:5]]}...)", attempt, n_in, n_out)
            p_yes = sum(math.exp(v) for v in lp[yes])
            p_no = sum(math.exp(v) for v in lp[no])
            return RawJudgement(p_yes, p_no, p_yes / (p_yes + p_no), n_in, n_out, attempt)
        raise CallFailed(f"{last} (after {self.max_retries + 1} attempts)", self.max_retries + 1, n_in, n_out)

    def describe(self) -> dict:
        return {"backend": words.OPENAI, "url": self.url, "model": self.model, "top_logprobs": self.top_logprobs,
                "prefill_params": self.prefill_params, "max_retries": self.max_retries, "timeout": self.timeout}


def _first_top_logprobs(payload: Any) -> list | None:
    try:
        content = payload["choices"][0]["logprobs"]["content"]
        top = content[0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        return None
    return top if isinstance(top, list) and top else None


#: The default verifier backend (``latentsift verify --backend``).
DEFAULT_BACKEND = words.LOCAL
registry_add("verifier_backend", DEFAULT_BACKEND, LocalVerifierBackend)
registry_add("verifier_backend", words.OPENAI, OpenAIBackend)


def verifier_backends() -> tuple[str, ...]:
    """Every registered verifier backend (``latentsift verify --backend``)."""
    return registry_names("verifier_backend")


def open_verifier_backend(name: str, **options: Any) -> VerifierBackend:
    """The registered verifier backend ``name`` built from ``options`` (``VerifierBackend.from_options``)."""
    return registry_lookup("verifier_backend", name).from_options(**options)
