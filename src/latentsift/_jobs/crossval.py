"""``latentsift crossval`` on files: the evaluation protocol (``latentsift.protocol.crossval``) on a team's own
labelled pools, with the output guarded before any work."""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from .._core.outputs import owned_output
from .._core.params import (BOOTSTRAP, FLAG, OUT, POSITIVE, RATE, RECALL, SEED, CommandOptions, Each, ExistingPath,
                            Interval, Kind, OneOf, option)
from ..deploy.leak import ON_LEAK
from ..protocol.crossval import CrossvalSettings, crossval
from ..protocol.settings import GROUP_BY

__all__ = ["CrossvalOptions", "CrossvalSettings", "TARGET_RECALLS", "crossval_command", "run_crossval"]

_D = CrossvalSettings.defaults()
#: The operating-points evaluation's target recalls when ``--target-recall`` is not given (crossval, reproduce).
TARGET_RECALLS = _D["target_recalls"]
#: Declared once for crossval and premise: Stage 3's price in tokens, the state stores.
TOKENS = Interval(Real, 0, None)
STORES = Each(Kind(Path, "a state store folder"))


@dataclass(frozen=True, kw_only=True)
class CrossvalOptions(CommandOptions):
    """The options of ``latentsift crossval``, each declared once with the values it allows (``_core.params``);
    built = validated, before any file is read; ``protocol`` gives the ``CrossvalSettings`` fields they set.
    (``--on-leak allow`` passes here and is refused by ``CrossvalSettings``, which says why.)"""

    command: ClassVar[str] = "crossval"

    pools: Sequence[Path] = option("POOLS", Each(ExistingPath("file")))
    states: Sequence[Path] = option("--states", STORES)
    out: Path = option("--out", OUT)
    group_by: str = option("--group-by", OneOf(GROUP_BY), default=_D["group_by"])
    folds: int = option("--folds", POSITIVE, default=_D["n_folds"])
    k: Sequence[int] = option("--k", Each(POSITIVE), default=_D["ks"])
    draws: int = option("--draws", POSITIVE, default=_D["n_draws"])
    seed: int = option("--seed", SEED, default=_D["seed"])
    verifier: Path | None = option("--verifier", ExistingPath("path"), None, default=None)
    instances: int | None = option("--max-instances", POSITIVE, None, default=_D["first_instances"])
    boot: int = option("--bootstrap", BOOTSTRAP, default=_D["n_boot"])
    scorer_epochs: int = option("--scorer-epochs", POSITIVE, default=_D["scorer_epochs"])
    variants: bool = option("--variants", FLAG, default=_D["variants"])
    agent_transfer: bool = option("--agent-transfer", FLAG, default=_D["agent_transfer"])
    on_leak: str = option("--on-leak", OneOf(ON_LEAK), default=_D["on_leak"])
    guard_false_alarm: float = option("--guard-false-alarm", RATE, default=_D["guard_false_alarm"])
    target_recall: Sequence[float] | None = option("--target-recall", Each(RECALL), None, default=None)
    gen_test_key: str | None = option("--gen-test-key", Kind(str, "a key of the trajectories' tests"), None,
                                      default=_D["gen_test_key"])
    testgen_tokens: float = option("--testgen-tokens", TOKENS, default=_D["testgen_tokens"])

    def protocol(self) -> dict:
        """The ``CrossvalSettings`` fields these options set (``crossval``'s keywords)."""
        return dict(group_by=self.group_by, n_folds=self.folds, ks=tuple(self.k), n_draws=self.draws, seed=self.seed,
                    first_instances=self.instances, n_boot=self.boot, scorer_epochs=self.scorer_epochs,
                    variants=self.variants, agent_transfer=self.agent_transfer, on_leak=self.on_leak,
                    guard_false_alarm=self.guard_false_alarm,
                    target_recalls=tuple(self.target_recall or TARGET_RECALLS), gen_test_key=self.gen_test_key,
                    testgen_tokens=self.testgen_tokens)


def crossval_command(o: CrossvalOptions, *, log: Callable[[str], None] = print,
                     progress: Callable | None = None) -> Path:
    """``latentsift crossval`` with the options ``o`` (checked when built): ``run_crossval``."""
    pools, states = list(o.pools), list(o.states)
    return run_crossval(pools[0] if len(pools) == 1 else pools, states[0] if len(states) == 1 else states, o.out,
                        verifier=o.verifier, log=log, progress=progress, held=o.check_paths, **o.protocol())


def run_crossval(pools_path: str | Path | Sequence, states_dir: str | Path | Sequence, out: str | Path, *,
                 verifier: str | Path | None = None, held: Callable[[], None] = lambda: None, **settings) -> Path:
    """``latentsift crossval``: ``crossval`` into the run folder ``out`` (refused before any work when it
    would touch an input; a second writer to it is refused; ``held()`` is called once it is held, before
    any input is read); returns the report folder."""
    with owned_output(out, [pools_path, states_dir, verifier], kind="run"):
        held()
        return crossval(pools_path, states_dir, out, verifier=verifier, **settings)
