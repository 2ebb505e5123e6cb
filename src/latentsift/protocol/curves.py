"""Training-set size curves of the learned branch (gated head and logistic probe), per outer fold."""
from __future__ import annotations

from .._core.validation import LatentSiftError
from ..sift.rules import PAPER
from ..sift.scorer import early_stopping_groups, fit_once
from ..sift.variants import bank_subsample, probe_once


def learning_curves(run, k, bank_trajs, eval_ids, states, fingerprint, probe_eval, per_instance) -> None:
    """Training-set size curves of the learned branch (gated head and logistic probe) in fold k.

    Bank instances are taken in a fixed hash order (seeded; nested subsets), so fraction f uses
    the first f of them; the full bank reuses the fold's paper scorer and probe. Scores of the
    fold's evaluation candidates go to ``run.curve_scores['curve:<learner>@<f>']`` (per
    candidate; the report computes their within-pool AUC), bank sizes to ``run.curve_sizes``.
    """
    s = run.settings
    labels = {t.traj_id: int(t.label) for t in bank_trajs}
    eval_set = set(eval_ids)
    q_lin = {t: float(v) for _, p in per_instance[PAPER].values() if p.q_lin is not None
             for t, v in zip(p.traj_ids, p.q_lin) if t in eval_set}
    for f in s.curve_fractions:
        tag = f"{round(100 * f)}%"
        if f >= 1.0:
            got = {"gated": q_lin, "probe": probe_eval}
            n = len(bank_trajs)
        else:
            sub = bank_subsample(bank_trajs, f, seed=s.seed)
            ids = sorted(t.traj_id for t in sub)
            n = len(ids)
            try:
                probe = probe_once(run.fits, states, {i: labels[i] for i in ids},
                                   early_stopping_groups(sub, run.group), seed=s.seed)
            except LatentSiftError as e:
                run.log(f"[curves] fold {k}: {tag} of the bank skipped ({e})")
                continue
            gated = fit_once(run.fits, run.scorer_params, states, {i: labels[i] for i in ids},
                             fingerprint=fingerprint, groups=early_stopping_groups(sub, run.group))
            ev = [states[i] for i in eval_ids]
            got = {"gated": dict(zip(eval_ids, gated.decision_function(ev).tolist())),
                   "probe": dict(zip(eval_ids, probe.decision_function(ev).tolist()))}
        for learner, sc in got.items():
            run.curve_scores.setdefault(f"curve:{learner}@{tag}", {}).update(
                {t: float(v) for t, v in sc.items()})
        run.curve_sizes.setdefault(tag, {})[str(k)] = n
