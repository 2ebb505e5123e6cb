"""The four-stage hybrid verification cascade (paper section "Overview", appendix "Token accounting details").

One cascade run takes the K drawn candidates of one instance and returns the expected label of the
candidate it selects, which candidates survived each stage, and what the run was charged:

1. **Stage 1** (filter): keep what the keep rule keeps (``latentsift.sift.keep``); by default the
   paper's ``FixedKeep``, the ``retain_count(K) = max(3, floor(K/2))`` highest Stage-1 scores (higher
   score first, ties at the cut broken by a deterministic hash of ``(seed, traj_id)``). The filter is
   a LatentSift score, a length rule, a random score, an EF verifier, or ``None`` (no filter: keep all K).
2. **Stage 2** (regression tests): keep the candidates with the maximum passed count.
3. **Stage 3** (generated tests): keep the candidates with the maximum generated-test score. It
   is *skipped, and not charged*, when no candidate of the pool has a generated-test score.
4. **Stage 4** (EF verifier): pick the highest EF score among the survivors.

Two workflows (paper appendix "EF verifier configurations"):

- *original*: the Stage-1 filter is an EF verifier (a :class:`VerifierTable`); all K drawn
  candidates are charged in Stage 1 and Stage 4 reuses those scores (no new calls);
- *token-free Stage 1* (LatentSift, length rules, random, none): Stage 4 calls the final EF
  verifier only on the Stage-3 survivors and is charged for exactly those calls.

Documented rules (each a setting where a choice exists):

- ``missing`` -- a candidate without a regression count (Stage 2) or generated-test score
  (Stage 3) never gets an invented value. If no survivor has a value the stage is a no-op
  (rule ``"none-known"``). If every survivor has one, the maximum is kept (``"applied"``). If only
  some have one: ``missing="skip-stage"`` (default) skips the stage for this draw
  (``"skipped-missing"``); ``missing="keep"`` keeps the maximum among the known *and* every
  candidate without a value (``"kept-missing"``). The rule that fired is recorded per run.
- ``stop_when_single`` (default True) -- once a single candidate is left the workflow has made its
  choice: later stages are not reached (rule ``"single"``), so neither test generation nor a final
  EF call is charged. This is what makes the paper's Stage-3 reach rate (95.5% / 93.7%) below 1.
- Test generation is charged once per run, ``testgen_tokens`` of the pool, when Stage 3 is
  reached (more than one candidate enters it and the pool has generated tests).
- EF failures (a :class:`~latentsift.cascade.verifier.VerifierFailure`: timeout, no logprobs, ...) have no
  score, never 0.5. In Stage 1 they rank below every scored candidate (kept only when fewer than
  ``retain_count(K)`` candidates have a score, ties among them broken by the same hash). In Stage 4
  the pick is among the survivors that have a score; if none has, all survivors are tied (rule
  ``"all-failed"``). Failed calls are charged the tokens the verifier recorded for them.
- ``tie`` -- candidates still tied after Stage 4 count as the mean label of the tied set
  (``"mean"``, the reference notebook's expected resolution), or one of them is drawn uniformly
  with a generator seeded by ``(seed, draw key)`` (``"random"``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, Union

import numpy as np

from .._core.validation import LatentSiftError, check_choice
from .._core import words
from ..sift.keep import FixedKeep, KeepRule
from ..sift.retain import KEEP_FRAC, MIN_KEEP, order_by_score, tie_key

MISSING_RULES = ("skip-stage", "keep")
#: The tie rules: the mean label of the tied set, or one of them drawn (seeded).
TIE_MEAN = "mean"
TIE_RANDOM = words.RANDOM  # a tie rule (a seeded draw among the tied), not the random filter
TIE_RULES = (TIE_MEAN, TIE_RANDOM)


class VerifierRecord(Protocol):
    """What the cascade reads from one EF-verifier result (``latentsift.cascade.verifier``)."""

    traj_id: str
    score: float | None  # P(YES) / (P(YES) + P(NO)); None = the call failed
    n_in: int            # input tokens charged (all attempts)
    n_out: int           # output tokens charged


#: EF-verifier results by trajectory id, as the cascade reads them.
VerifierTable = Mapping[str, VerifierRecord]
ScoreTable = Mapping[str, float]
DrawScorer = Callable[[str, Sequence[str]], Mapping[str, float]]
Filter = Union[None, ScoreTable, DrawScorer, VerifierTable]


@dataclass(frozen=True)
class CandidateRecord:
    """Per-candidate inputs of the cascade other than Stage-1 and EF scores.

    ``regression``: regression tests passed (Stage 2), None = unknown.
    ``gen_test``: generated-test score (Stage 3), None = none.
    """

    traj_id: str
    instance_id: str
    label: int
    regression: float | None = None
    gen_test: float | None = None


@dataclass(frozen=True)
class PoolSpec:
    """One fixed pool: its candidates and the cost of one test generation (Stage 3)."""

    instance_id: str
    traj_ids: tuple[str, ...]
    testgen_tokens: float | None = None

    @property
    def n(self) -> int:
        return len(self.traj_ids)


@dataclass(frozen=True)
class CascadeOutcome:
    """What one cascade run did. Survivor tuples are in the order of the drawn ids."""

    value: float                    # expected label of the pick (mean over the tied set)
    stage1: tuple[str, ...]
    stage2: tuple[str, ...]
    stage3: tuple[str, ...]
    final: tuple[str, ...]          # the tied set the pick comes from (one id when no tie)
    stage2_rule: str
    stage3_rule: str
    stage4_rule: str
    stage3_reached: bool
    ef_calls: tuple[str, ...]       # candidates the EF verifier was called on (charged)
    ef_tokens: int
    testgen_tokens: float
    failures: tuple[str, ...] = field(default=())  # charged EF calls that returned no score

    @property
    def total_tokens(self) -> float:
        return self.ef_tokens + self.testgen_tokens


def is_verifier_table(f: Any) -> bool:
    """A Mapping whose values carry ``score``/``n_in``/``n_out`` (an EF verifier's results)."""
    if not isinstance(f, Mapping) or not f:
        return False
    v = next(iter(f.values()))
    return all(hasattr(v, a) for a in ("score", "n_in", "n_out"))


def filter_kind(f: Any, name: str = "filter") -> str:
    """``"none"``, ``"ef"`` (verifier table, original workflow), ``"table"`` or ``"callable"``."""
    if f is None:
        return "none"
    if is_verifier_table(f):
        return "ef"
    if isinstance(f, Mapping):
        return "table"
    if callable(f):
        return "callable"
    raise LatentSiftError(f"The filter {name!r} must be None, a mapping traj_id -> score, a "
                          f"verifier table, or a callable score_draw(instance_id, traj_ids). "
                          f"Got {type(f).__name__} instead.")


def stage1_retain(ids: Sequence[str], scores: Sequence[float | None], *, seed: int = 0,
                  min_keep: int = MIN_KEEP, keep_frac: float = KEEP_FRAC, rule: KeepRule | None = None) -> list[str]:
    """Stage 1: the candidates of the K drawn ids that the keep ``rule`` keeps, in drawn order.

    ``rule``: a fitted ``sift.keep.KeepRule``; default the paper's ``FixedKeep(min_keep, keep_frac,
    seed)``, the ``retain_count(K)`` best (higher score first, ties at the cut by sha256 of ``(seed,
    traj_id)``). A ``None`` score (EF failure) is passed as NaN, which ranks below every score;
    several failures tie among themselves by the same hash.
    """
    arr = np.array([np.nan if s is None else float(s) for s in scores], dtype=np.float64)
    mask = (FixedKeep(min_keep, keep_frac, seed) if rule is None else rule).keep(arr, list(ids))
    return [t for t, m in zip(ids, mask) if m]


def _keep_max(ids: list[str], values: Sequence[float | None], missing: str) -> tuple[list[str], str]:
    """Stages 2 and 3: keep the maximum; never invent a missing value (module docstring)."""
    known = [v for v in values if v is not None]
    if not known:
        return ids, "none-known"
    top = max(known)
    if len(known) == len(ids):
        return [t for t, v in zip(ids, values) if v == top], "applied"
    if missing == "skip-stage":
        return ids, "skipped-missing"
    return [t for t, v in zip(ids, values) if v is None or v == top], "kept-missing"


def stage1_scores(stage1: Filter, kind: str, ids: Sequence[str], instance_id: str) -> list[float | None]:
    """The Stage-1 scores of the drawn ``ids`` (a callable filter is called once, on this draw)."""
    table = stage1(instance_id, tuple(ids)) if kind == "callable" else stage1
    out: list[float | None] = []
    for t in ids:
        if t not in table:
            raise LatentSiftError(f"The Stage-1 filter has no score for candidate {t!r} (instance {instance_id!r}).")
        v = table[t]
        s = v.score if kind == "ef" else v
        if s is not None:
            s = float(s)
            if not math.isfinite(s):
                raise LatentSiftError(f"The Stage-1 filter gives candidate {t!r} a non-finite score {s!r}.")
        elif kind != "ef":
            raise LatentSiftError(f"The Stage-1 filter gives candidate {t!r} no score (None); only an "
                                  "EF verifier table may hold failures.")
        out.append(s)
    return out


def pool_priority(ids: Sequence[str], scores: Sequence[float | None], *, seed: int = 0) -> dict[str, int]:
    """Position of each candidate in the pool-wide Stage-1 order (0 = best).

    ``select_retained``'s order (score descending, NaN/None last, ties by the (seed, traj_id)
    hash) is a total order fixed per candidate, so on any drawn subset its top ``r`` are the ``r``
    drawn candidates with the smallest priority: evaluation computes the order once per pool
    instead of once per draw (a test checks the two agree).
    """
    arr = np.array([np.nan if s is None else float(s) for s in scores], dtype=np.float64)
    order = order_by_score(arr, list(ids), seed=seed)
    return {ids[int(i)]: pos for pos, i in enumerate(order)}


def run_cascade(
    ids: Sequence[str],
    stage1: Filter,
    records: Mapping[str, CandidateRecord],
    *,
    final_verifier: VerifierTable | None = None,
    testgen_tokens: float | None = None,
    pool_has_gen_tests: bool | None = None,
    instance_id: str | None = None,
    seed: int = 0,
    tie: str = TIE_MEAN,
    missing: str = "skip-stage",
    stop_when_single: bool = True,
    draw_key: str = "",
    min_keep: int = MIN_KEEP,
    keep_frac: float = KEEP_FRAC,
    keep_rule: KeepRule | None = None,
) -> CascadeOutcome:
    """Run the four stages on the drawn candidates ``ids`` of one instance.

    ``stage1`` is a filter (module docstring). A verifier table means the *original* workflow
    (its scores are reused in Stage 4, ``final_verifier`` is ignored); any other filter needs
    ``final_verifier``. ``pool_has_gen_tests`` says whether the *pool* (not only the draw) has
    generated tests; by default it is read from the drawn records. ``draw_key`` names the draw
    (seeds ``tie="random"``). ``keep_rule``: Stage 1's fitted ``KeepRule`` (default: the paper's
    ``FixedKeep(min_keep, keep_frac, seed)``).
    """
    owner = "run_cascade"
    check_choice(tie, "tie", owner, TIE_RULES)
    check_choice(missing, "missing", owner, MISSING_RULES)
    ids = list(ids)
    if not ids:
        raise LatentSiftError("The 'ids' parameter of run_cascade must be a non-empty list of traj_ids. Got [] instead.")
    if len(set(ids)) != len(ids):
        raise LatentSiftError(f"The 'ids' parameter of run_cascade has duplicate traj_ids: {ids!r}.")
    for t in ids:
        if t not in records:
            raise LatentSiftError(f"run_cascade: no candidate record for traj_id {t!r}.")
    iid = instance_id or records[ids[0]].instance_id
    kind = filter_kind(stage1)
    if kind != "ef" and final_verifier is None:
        raise LatentSiftError("The 'final_verifier' parameter of run_cascade is required when the "
                              "Stage-1 filter is not an EF verifier (Stage 4 needs EF scores).")
    if kind == "none":
        s1 = list(ids)
    else:
        s1 = stage1_retain(ids, stage1_scores(stage1, kind, ids, iid), seed=seed,
                           min_keep=min_keep, keep_frac=keep_frac, rule=keep_rule)
    has_gen = (pool_has_gen_tests if pool_has_gen_tests is not None
               else any(records[t].gen_test is not None for t in ids))
    return after_stage1(ids, s1, records, stage1 if kind == "ef" else final_verifier, kind == "ef",
                        instance_id=iid, has_gen=has_gen, testgen_tokens=testgen_tokens, seed=seed,
                        tie=tie, missing=missing, stop_when_single=stop_when_single, draw_key=draw_key)


def after_stage1(ids: list[str], s1: list[str], records: Mapping[str, CandidateRecord],
                 verifier: VerifierTable, reuse: bool, *, instance_id: str, has_gen: bool,
                 testgen_tokens: float | None, seed: int, tie: str, missing: str,
                 stop_when_single: bool, draw_key: str) -> CascadeOutcome:
    """Stages 2-4 and the charges, given the Stage-1 survivors ``s1`` of the drawn ``ids``.

    ``reuse``: the original workflow (``verifier`` scored all drawn ids in Stage 1 and is reused).
    Inner function: arguments are trusted (validated by ``run_cascade`` / ``evaluate_run``).
    """
    ef_calls: list[str] = list(ids) if reuse else []
    # Stage 2: regression tests.
    if stop_when_single and len(s1) == 1:
        s2, rule2 = s1, "single"
    else:
        s2, rule2 = _keep_max(s1, [records[t].regression for t in s1], missing)
    # Stage 3: generated tests (charged when reached).
    reached3 = False
    if stop_when_single and len(s2) == 1:
        s3, rule3 = s2, "single"
    elif not has_gen:
        s3, rule3 = s2, "no-tests"
    else:
        reached3 = True
        s3, rule3 = _keep_max(s2, [records[t].gen_test for t in s2], missing)
    charged_testgen = 0.0
    if reached3:
        if testgen_tokens is None:
            raise LatentSiftError(f"Pool {instance_id!r} has generated-test scores but no test-generation "
                                  "cost ('testgen_tokens'); the cost of Stage 3 cannot be charged.")
        charged_testgen = float(testgen_tokens)
    # Stage 4: EF verifier on the survivors (the original workflow reuses its Stage-1 scores).
    if stop_when_single and len(s3) == 1:
        final, rule4 = s3, "single"
    else:
        for t in s3:
            if t not in verifier:
                raise LatentSiftError(f"The final EF verifier has no result for candidate {t!r} "
                                      f"(instance {instance_id!r}).")
        if not reuse:
            ef_calls = list(s3)
        vals = [verifier[t].score for t in s3]
        known = [v for v in vals if v is not None]
        if not known:
            final, rule4 = s3, "all-failed"
        else:
            top = max(known)
            final = [t for t, v in zip(s3, vals) if v is not None and v == top]
            rule4 = "applied" if len(known) == len(vals) else "some-failed"
    # Ties left after the last stage.
    labels = [records[t].label for t in final]
    if tie == TIE_MEAN or len(final) == 1:
        value = float(sum(labels)) / len(labels)  # expected label of a uniform pick from the tied set
    else:
        rng = np.random.default_rng(tie_key(f"{instance_id}/{draw_key}", seed))
        value = float(labels[int(rng.integers(len(labels)))])
    ef_tokens = sum(int(verifier[t].n_in) + int(verifier[t].n_out) for t in ef_calls)
    failures = tuple(t for t in ef_calls if verifier[t].score is None)
    return CascadeOutcome(
        value=value, stage1=tuple(s1), stage2=tuple(s2), stage3=tuple(s3), final=tuple(final),
        stage2_rule=rule2, stage3_rule=rule3, stage4_rule=rule4, stage3_reached=reached3,
        ef_calls=tuple(ef_calls), ef_tokens=ef_tokens, testgen_tokens=charged_testgen, failures=failures,
    )


def total_tokens(ef_tokens: float, stage3_rate: float, testgen_tokens: float) -> float:
    """Verification tokens per instance: V = EF tokens + (Stage-3 reach rate) x test-gen cost (paper appendix "Token accounting details")."""
    return ef_tokens + stage3_rate * testgen_tokens


def saving(reference: float, ours: float) -> float:
    """Fraction of tokens saved against a reference workflow: 1 - ours / reference."""
    if reference <= 0:
        return float("nan")
    return 1.0 - ours / reference
