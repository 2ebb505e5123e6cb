"""``latentsift transfer`` on files: the transfer matrix (``latentsift.protocol.transfer``) written as
OUT/summary.json and OUT/report.md (``latentsift.report.transfer``), under the output guard and lock."""
from __future__ import annotations

from dataclasses import dataclass, fields
from numbers import Integral
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from .._core.outputs import owned_output
from .._core.params import (BOOTSTRAP, COUNT, OUT, POSITIVE, SEED, CommandOptions, Each, ExistingPath, Interval,
                            OneOf, option)
from ..protocol.folds import group_noun
from ..protocol.transfer import TRANSFER_GROUP_BY, TransferSettings, transfer_summary
from ..report.transfer import transfer_markdown
from .crossval import STORES

__all__ = ["TransferOptions", "transfer_command", "transfer_matrix"]

_D = {f.name: f.default for f in fields(TransferSettings) if f.name not in ("pools", "states", "out")}


@dataclass(frozen=True, kw_only=True)
class TransferOptions(CommandOptions):
    """The options of ``latentsift transfer``, each declared once with the values it allows (``_core.params``);
    built = validated, before any file is read; ``protocol`` gives the ``TransferSettings`` fields they set."""

    command: ClassVar[str] = "transfer"

    pools: Sequence[Path] = option("POOLS", Each(ExistingPath("file")))
    states: Sequence[Path] = option("--states", STORES)
    out: Path = option("--out", OUT)
    folds: int = option("--folds", Interval(Integral, 2, None), default=_D["n_folds"])
    k: Sequence[int] = option("--k", Each(POSITIVE), default=_D["ks"])
    draws: int = option("--draws", POSITIVE, default=_D["n_draws"])
    boot: int = option("--bootstrap", BOOTSTRAP, default=_D["n_boot"])
    scorer_epochs: int = option("--scorer-epochs", COUNT, default=_D["scorer_epochs"])
    seed: int = option("--seed", SEED, default=_D["seed"])
    group_by: str = option("--group-by", OneOf(TRANSFER_GROUP_BY), default=_D["group_by"])

    def protocol(self) -> dict:
        """The ``TransferSettings`` fields these options set (``transfer_matrix``'s keywords)."""
        return dict(n_folds=self.folds, ks=tuple(self.k), n_draws=self.draws, n_boot=self.boot,
                    scorer_epochs=self.scorer_epochs, seed=self.seed, group_by=self.group_by)


def transfer_command(o: TransferOptions, *, log: Callable[[str], None] = print) -> Path:
    """``latentsift transfer`` with the options ``o`` (checked when built; its paths once the output is held)."""
    return transfer_matrix(list(o.pools), list(o.states), o.out, log=log, held=o.check_paths, **o.protocol())


def transfer_matrix(pools_paths: Sequence[str | Path], states_dirs: Sequence[str | Path], out: str | Path, *,
                    log: Callable[[str], None] = print, held: Callable[[], None] = lambda: None, **settings) -> Path:
    """``latentsift transfer``: the matrix over every evaluation set; writes OUT/summary.json and report.md.
    ``held()``: called once ``out`` is held, before any input is read (the command's path checks)."""
    out = Path(out)
    with owned_output(out, [*pools_paths, *states_dirs], kind="report") as o:
        held()
        summary = transfer_summary(pools_paths, states_dirs, out, log=log, **settings)
        o.write_text(transfer_markdown(summary, group_noun(summary["settings"].get("group_by", "repo"), 1)),
                     "report.md")
        o.write_json(summary, "summary.json")  # last: its presence means the report is complete
    log(f"[transfer] report: {out / 'report.md'}")
    return out
