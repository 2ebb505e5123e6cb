"""The power of a pre-registered claim: will an effect of a given size be decided at a family's level?

The probe study's rules (docs/studies/probe.md) size their runs with it, from the confirmation run's own
bootstrap: ``python -m latentsift.protocol.power`` prints the rules' table. A normal approximation of the
percentile bootstrap: an interval at level L around an estimate with standard error ``se`` has half-width
z_{(1+L)/2} se, so

- ``se_from_interval``: se = (hi - lo) / (2 z_{(1+L)/2}) of a published interval;
- ``scaled_se``: se scaled to another sample size, se sqrt(n_from / n_to) (the bootstrap is over tasks,
  and a task's AUC difference is an average over its candidates' pairs: fewer candidates per task, a
  noisier task; the rules state which count they scale by);
- ``decision_power``: the chance that the interval at level L of an effect ``effect`` (true, > 0) lies
  above 0, Phi(effect / se - z_{(1+L)/2}) (the chance it lies below 0 is added: both decide).
"""
from __future__ import annotations

from statistics import NormalDist

_Z = NormalDist()


def bonferroni_level(m: int, alpha: float = 0.05) -> float:
    """The level each of a family's ``m`` intervals is read at: 1 - alpha / m."""
    return 1.0 - alpha / m


def _z(level: float) -> float:
    return _Z.inv_cdf((1.0 + level) / 2.0)


def se_from_interval(lo: float, hi: float, level: float) -> float:
    """The standard error behind a two-sided interval [lo, hi] at ``level`` (normal approximation)."""
    return (hi - lo) / (2.0 * _z(level))


def scaled_se(se: float, n_from: float, n_to: float) -> float:
    """``se`` of a sample of ``n_from`` units carried to ``n_to`` units: se sqrt(n_from / n_to)."""
    return se * (n_from / n_to) ** 0.5


def decision_power(effect: float, se: float, level: float) -> float:
    """The chance that the interval at ``level`` around an estimate of a true ``effect`` with standard error
    ``se`` excludes 0 (normal approximation): Phi(|effect|/se - z) + Phi(-|effect|/se - z)."""
    d, z = abs(effect) / se, _z(level)
    return _Z.cdf(d - z) + _Z.cdf(-d - z)


#: The confirmation run (docs/studies/confirmation.md): the probe minus shortest-in-characters, its
#: interval in the premise table's family (m = 32), and the run's size (164 tasks, K = 16).
CONFIRMATION_PROBE = {"effect": 0.141, "lo": 0.079, "hi": 0.203, "m": 32, "tasks": 164, "k": 16}
#: Own minus proxy of the probe, in its own table's family (4 filters): +0.063 [+0.026, +0.103].
CONFIRMATION_PROXY = {"effect": 0.063, "lo": 0.026, "hi": 0.103, "m": 4, "tasks": 164, "k": 16}


def study_power(runs=((164, 16), (164, 8)), m: int = 14, alpha: float = 0.05) -> list[dict]:
    """The probe study's power table: for each (tasks, K) of ``runs`` and each effect of the confirmation
    (``CONFIRMATION_PROBE``, ``CONFIRMATION_PROXY``) its standard error there (scaled by the candidates'
    count, tasks x K) and the power at the study's family level 1 - alpha / m, with the smallest effect
    decided with 90% power."""
    level = bonferroni_level(m, alpha)
    out = []
    for name, ref in (("probe minus shortest-in-characters", CONFIRMATION_PROBE),
                      ("probe own minus proxy", CONFIRMATION_PROXY)):
        se0 = se_from_interval(ref["lo"], ref["hi"], bonferroni_level(ref["m"], alpha))
        for tasks, k in runs:
            se = scaled_se(se0, ref["tasks"] * ref["k"], tasks * k)
            out.append({"effect_of": name, "effect": ref["effect"], "se_confirmation": se0, "tasks": tasks, "k": k,
                        "se": se, "m": m, "level": level, "power": decision_power(ref["effect"], se, level),
                        "effect_90": se * (_z(level) + _Z.inv_cdf(0.9))})
    return out


def main() -> None:
    rows = study_power()
    print(f"family m = {rows[0]['m']}, Bonferroni level {rows[0]['level']:.5f} "
          f"(z = {_z(rows[0]['level']):.3f}); SE from the confirmation's interval, scaled by sqrt(candidates)")
    print(f"{'effect of':36s} {'effect':>7s} {'SE conf.':>8s} {'tasks':>5s} {'K':>3s} {'SE':>7s} {'power':>6s} "
          f"{'90% at':>7s}")
    for r in rows:
        print(f"{r['effect_of']:36s} {r['effect']:+7.3f} {r['se_confirmation']:8.4f} {r['tasks']:5d} {r['k']:3d} "
              f"{r['se']:7.4f} {r['power']:6.3f} {r['effect_90']:+7.3f}")


if __name__ == "__main__":
    main()
