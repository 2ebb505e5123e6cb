"""The registry of Stage-1 filters, and the rule filters (baselines) registered in it.

A Stage-1 filter is one class plus one registration (in the style of inspect_ai's ``@scorer``)::

    import numpy as np
    from latentsift import RuleFilter, register_filter

    @register_filter("longest-patch", label="longest patch")
    class LongestPatchFilter(RuleFilter):
        def _raw(self, cands, states):          # one number per candidate, higher = keep
            return np.array([float(len(c.patch or "")) for c in cands])

Everything that lists filters reads this registry: ``latentsift filter --method`` (its help and
choices), the protocol's baselines (``latentsift crossval`` / ``reproduce``), its tables, labels
and headline, the report's order, pruning's length policies, the transfer matrix's baselines and
the diagnostics' built-in references. The names of the built-in rules appear in this file only (``random``,
which names other things too, in ``latentsift._core.words``).

Each filter has a command-line ``name`` ("shortest-chars"), the ``key`` under which results are
written ("shortest_chars" in summary.json; default: the name with '_' for '-') and a display
``label``. ``REFERENCE`` is the key of the rule every paired comparison is made against.

The filters live in the package's one registry (``latentsift._core.registry``, kind "filter"): modules
outside the package register when they are imported, those named in the environment variable
``LATENTSIFT_PLUGINS`` (comma-separated module names) and those of the entry-point groups
``latentsift.plugins`` and ``latentsift.filters`` are imported on the first listing or a missed
lookup, so their filters show everywhere, the command line included.
"""
from __future__ import annotations

from .._core import words
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._core.registry import registry_add, registry_entries, registry_find, registry_remove
from .._core.validation import PACKAGE, LatentSiftError, check_choice
from .sift import LatentSift, Prepared, Stage1Filter, as_pools, check_pools, resolve_states
from .rank import normalized_ranks
from ..states.states import TrajectoryStates
from ..trajectories.trajectory import Trajectory

#: The kinds of filter: the two a command line can run (``method_names``), then the protocol's own: an
#: ablation of the paper's method (``latentsift.sift.ablations``), the default, chosen by inner
#: cross-validation (``latentsift.sift.variants``), the EF verifier (``latentsift.cascade.verifier``), a
#: beyond-paper variant and the filters of a representation of the sweep (``latentsift.sift.variants``).
KINDS = ("state", "rule", "ablation", "choice", "verifier", "variant", "sweep")
METHOD_KINDS = KINDS[:2]
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
# e.g. "channels:cot+obs", "ef_verifier", "variant:stack:length"; a family of names ends with ":*"
_PROTOCOL_NAME = re.compile(r"^[a-z][a-z0-9_]*(:[a-z0-9+-]+)*(:\*)?$")
#: The end of a registered family's name: "sweep:*" names every "sweep:<setting>..." filter.
FAMILY = ":*"


@dataclass(frozen=True)
class FilterEntry:
    """One registered Stage-1 filter.

    ``name``: its command-line name; ``factory``: the class (``factory(**settings)`` -> a
    ``Stage1Filter``); ``key``: its name in results (summary.json); ``label``: its display name;
    ``kind``: "rule" (a rule score per candidate; built by the protocol per fold like the
    baselines) or "state" (needs a bank and a scorer); ``table_rank`` / ``headline_rank``: its
    place among the rules in the protocol's tables and report / in its headline (registered
    filters without one come after the built-ins, in registration order); ``tokenizer``: the
    protocol passes it the policy's tokenizer; ``column``: (candidate-table column, sign) when the
    rule is a plain column (the diagnostics add it as a reference without scoring); ``prune_policy``:
    the name of the early-stopping policy that applies it to prefixes (``latentsift.sift.prune``);
    ``color``: its colour in every chart of the report and the explorer (``latentsift.report.colors``;
    None: the next free colour of the run); ``params`` (an ablation): the paper's method's settings it changes;
    ``group`` (an ablation): the ablation table it belongs to; ``signals`` (a stacked variant): the per-candidate
    signals it fuses; ``post_hoc``: added after the evaluation folds had been seen (``protocol.decide``);
    ``premise_only`` (a rule): a free reference of the premise test, built by the protocol in premise runs only
    (``crossval(..., premise=True)``), and there only when its record is present (``RuleFilter.absent``).
    """

    name: str
    factory: Callable[..., Stage1Filter]
    key: str
    label: str
    kind: str
    table_rank: float
    headline_rank: float
    tokenizer: bool
    column: tuple[str, float] | None
    prune_policy: str | None
    color: str | None = None
    params: dict | None = None
    group: str | None = None
    signals: tuple[str, ...] | None = None
    post_hoc: bool = False
    premise_only: bool = False


def register_filter(name: str, *, key: str | None = None, label: str | None = None, kind: str = "rule",
                    table_rank: float = math.inf, headline_rank: float = math.inf, tokenizer: bool = False,
                    column: tuple[str, float] | None = None, prune_policy: str | None = None,
                    color: str | None = None, params: dict | None = None, group: str | None = None,
                    signals: tuple[str, ...] | None = None, post_hoc: bool = False, premise_only: bool = False):
    """Decorator: register a ``Stage1Filter`` subclass under ``name`` (see ``FilterEntry``); a filter of the
    protocol's own kinds ("ablation", "choice", "verifier", "variant", "sweep") may be any factory, its name
    may hold ':' and, ending with ``FAMILY`` (":*"), names a family of filters (``find_filter``)."""
    check_choice(kind, "kind", "register_filter", KINDS)
    method = kind in METHOD_KINDS
    if not isinstance(name, str) or not (_NAME if method else _PROTOCOL_NAME).match(name):
        words = "lowercase words joined by '-'" if method else "a lowercase word, then optionally ':' and a setting"
        raise LatentSiftError(f"The 'name' parameter of register_filter must be {words}. Got {name!r} instead.")
    key = key or name.replace("-", "_")

    def register(cls):
        if method and not (isinstance(cls, type) and issubclass(cls, Stage1Filter)):
            raise LatentSiftError(f"register_filter({name!r}) decorates a Stage1Filter subclass. Got {cls!r} instead.")
        old = registry_find("filter", name, plugins=False)
        if old is not None and old.obj.__qualname__ != cls.__qualname__:
            raise LatentSiftError(f"register_filter: the name {name!r} is taken by {old.obj.__qualname__}.")
        taken = {e.info["key"]: e.name for e in registry_entries("filter", plugins=False) if e.name != name}
        if key in taken:
            raise LatentSiftError(f"register_filter: the key {key!r} is taken by the filter {taken[key]!r}.")
        if method:
            cls.name = name
        registry_add("filter", name, cls, key=key, label=label or name, kind=kind, table_rank=table_rank,
                     headline_rank=headline_rank, tokenizer=tokenizer, column=column, prune_policy=prune_policy,
                     color=color, params=params, group=group, signals=signals, post_hoc=post_hoc,
                     premise_only=premise_only)
        return cls

    return register


def unregister_filter(name: str) -> None:
    """Remove a registered filter (a plugin's, e.g. at the end of a test); built-ins stay."""
    e = registry_find("filter", name, plugins=False)
    if e is None:
        raise LatentSiftError(f"unregister_filter: no filter {name!r} is registered.")
    if str(e.obj.__module__).startswith(PACKAGE + "."):
        raise LatentSiftError(f"unregister_filter: {name!r} is a built-in filter.")
    registry_remove("filter", name)


def filters(kind: str | None = None) -> list[FilterEntry]:
    """The registered filters (of ``kind``, one of ``KINDS``), in registration order."""
    out = [FilterEntry(e.name, e.obj, **e.info) for e in registry_entries("filter")]
    return [e for e in out if kind is None or e.kind == kind]


def rules() -> list[FilterEntry]:
    """The rule filters (baselines), in registration order (the order the protocol builds them)."""
    return filters("rule")


def method_names() -> tuple[str, ...]:
    """Every filter's command-line name (``latentsift filter --method``): the state and rule filters."""
    return tuple(e.name for e in filters() if e.kind in METHOD_KINDS)


def filter_entry(name: str) -> FilterEntry:
    """The entry of a command-line name or a results key."""
    hit = registry_find("filter", name)  # a name: loads the plugins on a miss
    for e in filters():
        if name in (e.name, e.key) or (hit is not None and e.name == hit.name):
            return e
    raise LatentSiftError(f"Unknown Stage-1 filter {name!r}; registered: {', '.join(method_names())}.")


def find_filter(name: str) -> FilterEntry | None:
    """The entry of a command-line name or results key, else of the registered family the name belongs to
    (``"sweep:*"`` for ``"sweep:gemma:default"``), else None."""
    try:
        return filter_entry(name)
    except LatentSiftError:
        pass
    return next((e for e in filters() if e.name.endswith(FAMILY) and name.startswith(e.name[:-1])), None)


def rule_keys(view: str = "table") -> list[str]:
    """The rules' keys in the order of a ``view``: "table" (the protocol's tables, the report) or
    "headline" (the main table); registered rules without a rank follow the built-ins."""
    check_choice(view, "view", "rule_keys", ("table", "headline"))
    order = list(rules())
    return [e.key for e in sorted(order, key=lambda e: (getattr(e, f"{view}_rank"), order.index(e)))]


def labels() -> dict[str, str]:
    """key -> display label of every filter."""
    return {e.key: e.label for e in filters()}


def column_scores() -> dict[str, tuple[str, float]]:
    """key -> (candidate-table column, sign) of the rules that are a plain column."""
    return {e.key: e.column for e in rules() if e.column is not None}


def make_baseline(name: str, **kw) -> "RuleFilter":
    """A rule filter by command-line name or key, e.g. ``make_baseline("random", seed=0)``."""
    e = filter_entry(name)
    if e.kind != "rule":
        raise LatentSiftError(f"{e.name!r} is not a rule filter; rules: {', '.join(x.name for x in rules())}.")
    return e.factory(**kw)


register_filter(LatentSift.name, kind="state", label="LatentSift (paper)", color="#1f77b4")(LatentSift)


class RuleFilter(Stage1Filter):
    """A rule filter (baseline): s = normalised within-subset rank of a per-candidate rule score ``raw``.

    A subclass implements ``_raw(cands, states)`` (one number per candidate, higher = keep); set
    ``needs_states = True`` to receive the candidates' states (else ``states`` is None).
    """

    needs_states = False

    @classmethod
    def absent(cls, trajs: list[Trajectory]) -> str | None:
        """Why the rule cannot score ``trajs`` (the record it reads is absent), or None: the protocol then
        names it missing instead of running it (the premise's free references)."""
        return None

    def _raw(self, cands: list[Trajectory], states: dict[str, TrajectoryStates] | None) -> np.ndarray:
        raise NotImplementedError

    def prepare_many(self, pools, states: Any = None, *, fingerprint: Any = None) -> dict[str, Prepared]:
        pools = as_pools(pools)
        check_pools(pools)
        out = {}
        for p in pools:
            cands = sorted(p.candidates, key=lambda c: c.traj_id)
            st = None
            if states is not None and self.needs_states:
                st, _ = resolve_states(states, [c.traj_id for c in cands], fingerprint, owner=f"{self.name}.prepare",
                                       need_fingerprint=False)
            out[p.instance_id] = Prepared(instance_id=p.instance_id, traj_ids=[c.traj_id for c in cands],
                                          raw=self._raw(cands, st))
        return out

    def _rank(self, prepared: Prepared, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {"s": normalized_ranks(prepared.raw[idx])}


@register_filter(words.RANDOM, label=words.RANDOM, table_rank=3, headline_rank=0, prune_policy=words.RANDOM,
                 color="#7f7f7f")
class RandomFilter(RuleFilter):
    """Random Stage 1: raw = a uniform number in [0, 1) from sha256("random:{seed}:{traj_id}").

    A fixed random order per seed (a draw's retained set is random because draws differ).
    """

    def _raw(self, cands, states):
        return np.array([int.from_bytes(hashlib.sha256(f"random:{self.seed}:{c.traj_id}".encode()).digest()[:8],
                                        "big") / 2.0 ** 64 for c in cands])


@register_filter("shortest-tokens", label="shortest (tokens)", table_rank=0, headline_rank=2, tokenizer=True,
                 prune_policy="longest-so-far", color="#ff7f0e")
class ShortestTokensFilter(RuleFilter):
    """Prefer fewer tokens: raw = -n_tokens, from the states (``TrajectoryStates.n_tokens``, the
    tokens the policy saw) or, without states, from ``tokenizer`` over cot + fn + obs text."""

    needs_states = True

    def __init__(self, *, tokenizer: Any = None, **kw):
        super().__init__(**kw)
        self.tokenizer = tokenizer

    def _raw(self, cands, states):
        vals = []
        for c in cands:
            if states is not None:
                n = int(states[c.traj_id].n_tokens)
                if n <= 0:
                    raise LatentSiftError(f"The states of {c.traj_id!r} record no token count (n_tokens=0); "
                                          "pass a tokenizer instead.")
            elif self.tokenizer is not None:
                text = "".join(s.cot + s.fn + s.obs for s in c.steps)
                n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            else:
                raise LatentSiftError(f"{self.name} needs the candidates' states (n_tokens) or a tokenizer.")
            vals.append(-float(n))
        return np.array(vals)


@register_filter("shortest-chars", label="shortest (chars)", table_rank=1, headline_rank=1,
                 column=("n_chars", -1.0), color="#8c564b")
class ShortestCharsFilter(RuleFilter):
    """Prefer fewer characters: raw = -(characters of cot + fn + obs over all steps)."""

    def _raw(self, cands, states):
        return np.array([-float(c.n_chars) for c in cands])


@register_filter("fewest-steps", label="fewest steps", table_rank=2, headline_rank=3, column=("n_steps", -1.0),
                 prune_policy="most-steps-so-far", color="#9467bd")
class FewestStepsFilter(RuleFilter):
    """Prefer fewer agent steps: raw = -n_steps."""

    def _raw(self, cands, states):
        return np.array([-float(c.n_steps) for c in cands])


# The premise's free references (issue: length in the rollout scaffold is partly an execution signal): pure
# length beside fewest steps and shortest-in-characters, and the docstring examples' outcome named on its own.
# Read from the rollout's records (``latentsift rollout``), no state and no label; built in premise runs only.
@register_filter("shortest-patch", label="shortest code (chars)", table_rank=2.1, premise_only=True)
class ShortestPatchFilter(RuleFilter):
    """Prefer shorter submitted code: raw = -(characters of the final patch; 0 for none)."""

    @classmethod
    def absent(cls, trajs):
        return None if any((t.patch or "") for t in trajs) else "no candidate has a patch (submitted code)"

    def _raw(self, cands, states):
        return np.array([-float(len(c.patch or "")) for c in cands])


def generated_tokens(traj: Trajectory) -> int | None:
    """The tokens the policy generated over the trajectory (each step's ``meta["tokens"]``, written by
    ``latentsift rollout``); None when a step does not record them."""
    n = [s.meta.get("tokens") for s in traj.steps]
    return None if not n or any(not isinstance(x, int) or isinstance(x, bool) for x in n) else sum(n)


@register_filter("fewest-generated-tokens", label="fewest generated tokens", table_rank=2.2, premise_only=True)
class FewestGeneratedTokensFilter(RuleFilter):
    """Prefer fewer generated tokens: raw = -(tokens the policy generated, all turns; ``generated_tokens``).
    Unlike ``shortest-tokens`` (the tokens the policy saw), observations and prompts are not counted."""

    @classmethod
    def absent(cls, trajs):
        bad = next((t.traj_id for t in trajs if generated_tokens(t) is None), None)
        return None if bad is None else (f"{bad!r} records no generated-token count per step (step meta 'tokens', "
                                         "written by latentsift rollout)")

    def _raw(self, cands, states):
        out = []
        for c in cands:
            n = generated_tokens(c)
            if n is None:
                raise LatentSiftError(f"{self.name}: {self.absent([c])}.")
            out.append(-float(n))
        return np.array(out)


@register_filter("most-examples-passed", label="docstring examples passed (share)",
                 table_rank=2.3, premise_only=True)
class ExamplesPassedFilter(RuleFilter):
    """Prefer candidates whose submitted code passed more of the task's docstring examples: raw =
    ``tests["examples_passed"]`` (a share in [0, 1]). A task whose docstring has no example records none: its
    candidates tie (missing ranks lowest, all of them)."""

    @classmethod
    def absent(cls, trajs):
        return None if any(t.tests.get("examples_passed") is not None for t in trajs) else \
            "no candidate records tests['examples_passed'] (the docstring examples' pass share)"

    def _raw(self, cands, states):
        return np.array([np.nan if c.tests.get("examples_passed") is None else float(c.tests["examples_passed"])
                         for c in cands])


#: The key of the paper's filter (the method every table starts with).
PAPER = registry_find("filter", LatentSift.name, plugins=False).info["key"]
#: The key of the rule every paired comparison is made against (keep the shortest in characters).
REFERENCE = registry_find("filter", ShortestCharsFilter.name, plugins=False).info["key"]
#: The key of the random rule (the chance-level comparison).
RANDOM = registry_find("filter", RandomFilter.name, plugins=False).info["key"]
#: The key of the fewest-steps rule (a length reference of the premise test).
FEWEST_STEPS = registry_find("filter", FewestStepsFilter.name, plugins=False).info["key"]
#: The key of the shortest-in-tokens rule (the tokens the policy saw; a length rule of the confirmation's claims).
SHORTEST_TOKENS = registry_find("filter", ShortestTokensFilter.name, plugins=False).info["key"]
#: The premise's pure length references (the submitted code's characters, the tokens the policy generated).
PURE_LENGTH = tuple(registry_find("filter", c.name, plugins=False).info["key"]
                    for c in (ShortestPatchFilter, FewestGeneratedTokensFilter))
#: The premise's execution reference: the docstring examples' pass share.
EXAMPLES_PASSED = registry_find("filter", ExamplesPassedFilter.name, plugins=False).info["key"]
