"""``latentsift reproduce``: the paper's run end to end (``latentsift.protocol.reproduction``)."""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from .._core.params import (FLAG, OUT, POSITIVE, RECALL, SEED, CommandOptions, Each, ExistingPath, Interval, OneOf,
                            option)
from ..protocol.reproduction import SWEEP, ReproduceSettings, reproduce
from ..states.model import AUTO_DTYPE, DTYPES

__all__ = ["ReproduceOptions", "ReproduceSettings", "reproduce", "reproduce_command"]

_D = ReproduceSettings.defaults()
_DATASET = ExistingPath("folder", "an existing dataset folder (candidates.csv, r2egym/, sweagent/)")


@dataclass(frozen=True, kw_only=True)
class ReproduceOptions(CommandOptions):
    """The options of ``latentsift reproduce``, each declared once with the values it allows (``_core.params``);
    built = validated, before any file is read; ``settings`` is the run's ``ReproduceSettings``."""

    command: ClassVar[str] = "reproduce"

    data: Path = option("--data", _DATASET, default=Path("../shared/datasets/swebench-lite-pools"))
    out: Path = option("--out", OUT, default=Path("runs/reproduce"))
    full: bool = option("--full", FLAG, default=False)
    model: Path | None = option("--model", ExistingPath("path"), None, default=None)
    include_leaky: bool = option("--include-leaky", FLAG, default=False)
    n_unresolved: int = option("--n-unresolved", Interval(Integral, 0, None), default=_D["n_unresolved"])
    max_instances: int | None = option("--max-instances", POSITIVE, None, default=None)
    max_span_tokens: int = option("--max-span-tokens", POSITIVE, default=_D["max_span_tokens"])
    verifier_max_tokens: int = option("--verifier-max-tokens", POSITIVE, default=_D["verifier_max_tokens"])
    dtype: str = option("--dtype", OneOf((AUTO_DTYPE, *DTYPES)), default=_D["dtype"])
    folds: int = option("--folds", POSITIVE, default=_D["n_folds"])
    k: Sequence[int] = option("--k", Each(POSITIVE), default=_D["ks"])
    draws: int = option("--draws", POSITIVE, default=_D["n_draws"])
    seed: int = option("--seed", SEED, default=_D["seed"])
    variants: bool = option("--variants", FLAG, default=_D["variants"])
    sweep: Sequence[str] | None = option("--sweep", Each(OneOf((*SWEEP, "all"))), None, default=None)
    sweep_span_tokens: int = option("--sweep-span-tokens", POSITIVE, default=_D["sweep_span_tokens"])
    sweep_patch_tokens: int = option("--sweep-patch-tokens", POSITIVE, default=_D["sweep_patch_tokens"])
    target_recall: Sequence[float] | None = option("--target-recall", Each(RECALL), None, default=None)

    @property
    def settings(self) -> ReproduceSettings:
        """The run's settings (recorded in its manifest)."""
        return ReproduceSettings(
            data=str(self.data), out=str(self.out), full=self.full, model=str(self.model) if self.model else None,
            dtype=self.dtype, include_leaky=self.include_leaky, n_unresolved=self.n_unresolved,
            max_instances=self.max_instances, max_span_tokens=self.max_span_tokens,
            verifier_max_tokens=self.verifier_max_tokens, n_folds=self.folds, ks=tuple(self.k), n_draws=self.draws,
            seed=self.seed, variants=self.variants, sweep=tuple(self.sweep or ()),
            sweep_span_tokens=self.sweep_span_tokens, sweep_patch_tokens=self.sweep_patch_tokens,
            target_recalls=tuple(self.target_recall or _D["target_recalls"]))


def reproduce_command(o: ReproduceOptions, *, log: Callable[[str], None] = print,
                      progress: Callable | None = None) -> Path:
    """``latentsift reproduce`` with the options ``o`` (checked when built; its paths once the output is held):
    ``reproduce`` of its settings."""
    return reproduce(o.settings, log=log, progress=progress, held=o.check_paths)
