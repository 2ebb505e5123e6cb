"""``latentsift premise``: the premise test on one policy's pools (file driver of ``protocol.premise``):
``crossval`` on the policy's own state store and on a proxy store of the same candidates, then own
against proxy, written as OUT/summary.json and OUT/report.md."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Sequence, Union

from .._core.io import atomic_write_json, atomic_write_text
from .._core.outputs import PREMISE_OWN, owned_output
from .._core.params import (BOOTSTRAP, OUT, POSITIVE, SEED, CommandOptions, Each, ExistingPath, Kind, OneOf,
                            option)
from .._core.validation import check_states_present
from ..deploy.library import open_stores
from ..metrics.formats import check_gen_test_key
from ..protocol.claims import run_claims
from ..protocol.crossval import CrossvalSettings, crossval
from ..protocol.settings import GROUP_BY
from ..protocol.premise import PREMISE_KS, PREMISE_RECALLS, check_premise_stores, own_vs_proxy, premise_ks
from ..report.premise_report import premise_report_markdown
from ..rollout.agent import EXAMPLES_KEY
from ..trajectories.trajectory import group_pools, load_jsonl
from .crossval import STORES, TOKENS

#: A state store folder, or several of the same model and settings read as one.
StoreArg = Union[str, Path, Sequence[Union[str, Path]]]

__all__ = ["CrossvalSettings", "EXAMPLES_KEY", "PREMISE_KS", "PremiseOptions", "premise", "premise_command",
           "run_premise"]

_D = CrossvalSettings.defaults()


@dataclass(frozen=True, kw_only=True)
class PremiseOptions(CommandOptions):
    """The options of ``latentsift premise``, each declared once with the values it allows (``_core.params``);
    built = validated, before any file is read. ``gen_test_key`` None: the rollouts' examples when the
    candidates hold them."""

    command: ClassVar[str] = "premise"

    pools: Path = option("POOLS", ExistingPath("file"))
    states: Sequence[Path] = option("--states", STORES)
    proxy_states: Sequence[Path] | None = option("--proxy-states", STORES, None, default=None)
    out: Path = option("--out", OUT)
    group_by: str = option("--group-by", OneOf(GROUP_BY), default="instance")
    folds: int = option("--folds", POSITIVE, default=_D["n_folds"])
    k: Sequence[int] = option("--k", Each(POSITIVE), default=PREMISE_KS)
    draws: int = option("--draws", POSITIVE, default=_D["n_draws"])
    boot: int = option("--bootstrap", BOOTSTRAP, default=_D["n_boot"])
    scorer_epochs: int = option("--scorer-epochs", POSITIVE, default=_D["scorer_epochs"])
    seed: int = option("--seed", SEED, default=_D["seed"])
    verifier: Path | None = option("--verifier", ExistingPath("path"), None, default=None)
    gen_test_key: str | None = option("--gen-test-key", Kind(str, "a key of the trajectories' tests"), None,
                                      default=None)
    testgen_tokens: float = option("--testgen-tokens", TOKENS, default=_D["testgen_tokens"])


def premise_command(o: PremiseOptions, *, log: Callable[[str], None] = print,
                    progress: Callable[[str, int, int, str], None] | None = None) -> Path:
    """``latentsift premise`` with the options ``o`` (checked when built): ``run_premise``."""
    return run_premise(o.pools, list(o.states), o.out, proxy_states=list(o.proxy_states) if o.proxy_states else None,
                       ks=tuple(o.k), group_by=o.group_by, n_folds=o.folds, n_draws=o.draws, n_boot=o.boot,
                       scorer_epochs=o.scorer_epochs, seed=o.seed, verifier=o.verifier, gen_test_key=o.gen_test_key,
                       testgen_tokens=o.testgen_tokens, log=log, progress=progress, held=o.check_paths)


def premise(pools: str | Path, states: StoreArg, out: str | Path, *, proxy_states: StoreArg | None = None,
            ks: Sequence[int] = PREMISE_KS, log: Callable[[str], None] = print,
            progress: Callable[[str, int, int, str], None] | None = None, **settings) -> Path:
    """``latentsift premise``: the premise test on one policy's pools.

    Runs ``crossval`` (folds by task unless ``group_by`` says otherwise, the operating points at R = 0.9
    and 0.95, Stage 3 scored by ``tests[gen_test_key]`` (default: the rollouts' docstring examples when
    the candidates hold them, else none; a key no candidate holds is refused),
    retention@K for ``ks`` up to the pool size) on the policy's own ``states`` into OUT/own and, with
    ``proxy_states`` (the same candidates encoded by another model), on those into OUT/proxy; then
    writes OUT/summary.json and OUT/report.md (own, proxy, own - proxy, and the claims (a)-(d) of the
    confirmation's rules at their family's Bonferroni level: ``protocol.claims``). ``settings``: further
    ``CrossvalSettings`` fields (``n_folds``, ``n_draws``, ``n_boot``, ``seed``, ``scorer_epochs``, ...).
    Reruns reuse each run's cached folds. ``states`` / ``proxy_states``: a store, or several of the same
    model and settings (rollout shards) read as one. Returns OUT.
    """
    out = Path(out)
    trajs = load_jsonl(pools)
    use_ks = premise_ks([len(p.candidates) for p in group_pools(trajs)], ks)
    if settings.get("gen_test_key") is None:  # the rollouts' examples when the candidates hold them
        settings["gen_test_key"] = EXAMPLES_KEY if any(EXAMPLES_KEY in t.tests for t in trajs) else None
    check_gen_test_key(trajs, settings["gen_test_key"], "premise")
    kw = {"group_by": "instance", "agent_transfer": False, "target_recalls": PREMISE_RECALLS} | settings
    kw |= {"ks": use_ks, "premise": True}
    runs = {PREMISE_OWN: states} | ({"proxy": proxy_states} if proxy_states is not None else {})
    runs = {name: [st] if isinstance(st, (str, os.PathLike)) else list(st) for name, st in runs.items()}
    stores = {}
    for name, st in runs.items():  # both hold every candidate: checked before any run starts
        who = f"premise ({name} states)"
        stores[name] = open_stores(st, who)
        check_states_present(stores[name], trajs, who)
    check_premise_stores(trajs, stores[PREMISE_OWN], stores.get("proxy"))
    shown = {name: ", ".join(map(str, st)) for name, st in runs.items()}   # each run's stores, as logged and recorded
    (out / "summary.json").unlink(missing_ok=True)  # presence of summary.json = this premise run finished
    for name, st in runs.items():
        log(f"[premise] {name} states: {shown[name]}")
        crossval(pools, st[0] if len(st) == 1 else st, out / name, log=log, progress=progress, **kw)
    summary = {"format": "latentsift-premise", "version": 1,
               "inputs": {"pools": str(pools), **{f"{n}_states": s for n, s in shown.items()}},
               "settings": {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                            for k, v in kw.items()}, "runs": {}}
    for name in runs:
        s = json.loads((out / name / "report" / "summary.json").read_text())
        summary["runs"][name] = {"composition": s.get("composition"), "premise": s["premise"],
                                 "fingerprint": s["settings"]["meta"].get("fingerprint")}
    boot = {"n_boot": kw.get("n_boot", 1000), "seed": kw.get("seed", 0)}
    if proxy_states is not None:
        summary["own_vs_proxy"] = own_vs_proxy(out / PREMISE_OWN, out / "proxy", **boot)
    # the confirmation's claims (a)-(d) by its committed rules (protocol.claims); without a proxy (c) says why
    summary["claims"] = run_claims(out / PREMISE_OWN, out / "proxy" if proxy_states is not None else None, **boot)
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "report.md", premise_report_markdown(summary))
    log(f"[premise] report: {out / 'report.md'}")
    return out


def run_premise(pools: str | Path, states: StoreArg, out: str | Path, *, proxy_states: StoreArg | None = None,
                verifier: str | Path | None = None, held: Callable[[], None] = lambda: None, **kwargs) -> Path:
    """``latentsift premise``: ``premise`` into ``out``, refused before any work when it would touch an input (a
    second writer to it is refused; ``held()`` is called once it is held, before any input is read)."""
    with owned_output(out, [pools, states, proxy_states, verifier], kind="premise"):   # (lists of stores too)
        held()
        return premise(pools, states, out, proxy_states=proxy_states, verifier=verifier, **kwargs)
