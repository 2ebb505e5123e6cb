"""``latentsift verify`` on files: score canonical trajectories with the EF verifier through a registered
verifier backend (``latentsift.cascade.backends``) and write its verdicts."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .._core.outputs import check_output, owned_output
from .._core.validation import LatentSiftError
from ..cascade.backends import DEFAULT_BACKEND, open_verifier_backend, verifier_backends
from ..cascade.verifier import EFVerifier, save_results
from ..trajectories.trajectory import load_jsonl

__all__ = ["DEFAULT_BACKEND", "run_verify", "verifier_backends"]


def run_verify(trajectories: str | Path, out: str | Path, *, name: str = "ef", backend: str = DEFAULT_BACKEND,
               ids: str | Path | None = None, cache: str | Path | None = None, max_prompt_tokens: int = 1024,
               progress: Callable[[int, int], None] | None = None, log: Callable[[str], None] | None = None,
               **options: Any) -> dict:
    """``latentsift verify``: the verdicts of ``backend`` (built from ``options``) on the trajectories of a
    canonical JSONL (only the traj_ids listed in ``ids``, when given), written to ``out`` with the
    prompt cache in ``cache`` (default OUT/cache). Returns the results keyed by traj_id."""
    out = Path(out)
    with owned_output(out, [trajectories, options.get("model"), ids], kind="verifier"):  # a second writer: refused
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
