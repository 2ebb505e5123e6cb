"""``latentsift verify`` on files: score canonical trajectories with the EF verifier through a registered
verifier backend (``latentsift.cascade.backends``) and write its verdicts."""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, Callable, ClassVar

from .._core.outputs import check_output, owned_output
from .._core.params import (COUNT, OUT, POSITIVE, CommandOptions, ExistingPath, Interval, Kind, Matches, OneOf,
                            Registered, option, pattern)
from .._core.validation import LatentSiftError
from ..cascade.backends import DEFAULT_BACKEND, open_verifier_backend, verifier_backends
from ..cascade.verifier import EFVerifier, save_results
from ..states.model import AUTO_DTYPE, DTYPES
from ..trajectories.trajectory import load_jsonl

__all__ = ["DEFAULT_BACKEND", "VerifyOptions", "run_verify", "verifier_backends", "verify_to_folder"]


@dataclass(frozen=True, kw_only=True)
class VerifyOptions(CommandOptions):
    """The options of ``latentsift verify``, each declared once with the values it allows (``_core.params``);
    built = validated, before any file is read or model loaded. ``model``, ``dtype`` and ``threads`` go to
    the local backend, ``base_url`` ... ``concurrency`` to the openai one (``backend_options``)."""

    command: ClassVar[str] = "verify"

    pools: Path = option("POOLS", ExistingPath("file"))
    out: Path = option("--out", OUT)
    name: str = option("--name", Matches("a name (not empty)", lambda t: bool(t.strip()), " "), default="ef")
    backend: str = option("--backend", Registered("verifier_backend"), default=DEFAULT_BACKEND)
    model: Path | None = option("--model", ExistingPath("path"), None, default=None)
    base_url: str | None = option("--base-url", Matches("an http(s) URL such as http://127.0.0.1:8000/v1",
                                                        pattern(r"https?://\S+"), "127.0.0.1:8000"), None, default=None)
    api_model: str | None = option("--api-model", Kind(str, "a model name"), None, default=None)
    api_key_env: str | None = option("--api-key-env", Matches("an environment variable's name",
                                                              pattern(r"[A-Za-z_][A-Za-z0-9_]*"), "API KEY"), None,
                                     default=None)
    max_prompt_tokens: int = option("--verifier-max-tokens", POSITIVE, default=1024)
    cache: Path | None = option("--cache", Kind(Path, "a folder"), None, default=None)
    ids: Path | None = option("--ids", ExistingPath("file"), None, default=None)
    timeout: float = option("--timeout", Interval(Real, 0, None, closed="neither"), default=60.0)
    retries: int = option("--retries", COUNT, default=3)
    concurrency: int = option("--concurrency", POSITIVE, default=4)
    dtype: str = option("--dtype", OneOf((AUTO_DTYPE, *DTYPES)), default=AUTO_DTYPE)
    threads: int | None = option("--threads", POSITIVE, None, default=None)

    def backend_options(self) -> dict[str, Any]:
        """The options the backends are built from (``VerifierBackend.from_options``)."""
        return {k: getattr(self, k) for k in ("model", "dtype", "threads", "base_url", "api_model", "api_key_env",
                                              "timeout", "retries", "concurrency")}


def verify_to_folder(o: VerifyOptions, *, progress: Callable[[int, int], None] | None = None,
                     log: Callable[[str], None] | None = None) -> dict:
    """``latentsift verify`` with the options ``o`` (checked when built; its paths once the output is held)."""
    return run_verify(o.pools, o.out, name=o.name, backend=o.backend, ids=o.ids, cache=o.cache,
                      max_prompt_tokens=o.max_prompt_tokens, progress=progress, log=log, held=o.check_paths,
                      **o.backend_options())


def run_verify(trajectories: str | Path, out: str | Path, *, name: str = "ef", backend: str = DEFAULT_BACKEND,
               ids: str | Path | None = None, cache: str | Path | None = None, max_prompt_tokens: int = 1024,
               progress: Callable[[int, int], None] | None = None, log: Callable[[str], None] | None = None,
               held: Callable[[], None] = lambda: None, **options: Any) -> dict:
    """``latentsift verify``: the verdicts of ``backend`` (built from ``options``) on the trajectories of a
    canonical JSONL (only the traj_ids listed in ``ids``, when given), written to ``out`` with the
    prompt cache in ``cache`` (default OUT/cache). ``held()``: called once ``out`` is held, before any input is
    read (the command's path checks). Returns the results keyed by traj_id."""
    out = Path(out)
    with owned_output(out, [trajectories, options.get("model"), ids], kind="verifier"):  # a second writer: refused
        held()
        if cache is not None:  # a prompt cache (shared by runs, written file by file atomically): checked, not locked
            check_output(cache, [trajectories, options.get("model"), ids], option="--cache")
        trajs = load_jsonl(trajectories)
        if ids is not None:
            wanted = [line.strip() for line in Path(ids).read_text(encoding="utf-8").splitlines() if line.strip()]
            by = {t.traj_id: t for t in trajs}
            unknown = [w for w in wanted if w not in by]
            if unknown:
                raise LatentSiftError(f"--ids: {len(unknown)} traj_id(s) not in {trajectories}, e.g. {unknown[:3]!r}.")
            trajs = [by[w] for w in wanted]
        if not trajs:  # said before the model loads; no empty results are written
            raise LatentSiftError(f"--ids {ids} names no traj_id: nothing to verify." if ids is not None else
                                  f"{trajectories} holds no trajectory: nothing to verify.")
        be = open_verifier_backend(backend, **options)
        if log is not None:
            log(f"verifier backend: {be.describe()}")
        try:
            ver = EFVerifier(be, max_prompt_tokens=max_prompt_tokens, cache_dir=cache or (out / "cache"))
            results = ver.score(trajs, progress=progress)
        finally:
            be.close()
        save_results(results, out, name=name, manifest=ver.manifest())
        return results
