"""scikit-learn's estimator contract on every class that claims it (``_core.estimator``): ``get_params(deep=True)``
and ``set_params`` from the constructor's arguments, ``fit`` returns self, and ``sklearn.base.clone`` gives an
unfitted copy with the same settings, also of a fitted estimator."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import Pipeline
from synthetic import FP, write_single_policy

from latentsift import Bank, LatentSiftError, LinearScorer, Sifter, load_jsonl
from latentsift.sift.keep import FixedKeep, RecallKeep
from latentsift.sift.keep_adaptive import GapRecallKeep
from latentsift.sift.keep_confident import ConfidentRecallKeep
from latentsift.states.store import StateStore

#: Each estimator built with settings other than its defaults, and one of its parameters with another value.
ESTIMATORS = [
    (Bank(layer=1, normalize="l2", center="mean", channels=("cot", "fn")), "layer", 2),
    (LinearScorer(lr=1e-3, max_epochs=3, seed=5, patience=2, train_loss=False), "max_epochs", 7),
    (Sifter(scorer_epochs=2, channels=("cot", "obs"), min_keep=2, frac=0.25, seed=3), "branches", "distance"),
    (FixedKeep(min_keep=2, frac=0.25, seed=1), "frac", 0.75),
    (RecallKeep(target_recall=0.95, min_keep=2, seed=4), "target_recall", 0.8),
    (ConfidentRecallKeep(target_recall=0.9, confidence=0.8), "confidence", 0.95),
    (GapRecallKeep(target_recall=0.9), "seed", 9),
]
IDS = [type(e).__name__ for e, _, _ in ESTIMATORS]


@pytest.mark.parametrize("est, name, value", ESTIMATORS, ids=IDS)
def test_get_params_set_params_and_clone(est, name, value):
    params = est.get_params(deep=True)
    assert params == est.get_params(deep=False)         # no parameter is an estimator itself
    assert params == {p: getattr(est, p) for p in type(est)._param_names()}
    copy = clone(est)
    assert type(copy) is type(est) and copy is not est and copy.get_params() == params
    assert copy.set_params(**{name: value}) is copy
    assert copy.get_params()[name] == value and est.get_params()[name] == params[name]
    with pytest.raises(LatentSiftError, match="'no_such' parameter"):
        copy.set_params(no_such=1)


def test_nested_parameters_reach_an_estimator_inside_another():
    pipe = Pipeline([("scorer", LinearScorer(max_epochs=3))])
    assert pipe.get_params(deep=True)["scorer__max_epochs"] == 3
    pipe.set_params(scorer__max_epochs=8)
    assert pipe.named_steps["scorer"].max_epochs == 8
    assert clone(pipe).named_steps["scorer"].get_params() == pipe.named_steps["scorer"].get_params()


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    pools, states = write_single_policy(tmp_path_factory.mktemp("est"), n_instances=8, k=4)
    trajs = load_jsonl(pools)
    return trajs, StateStore(states).load([t.traj_id for t in trajs])


def test_fit_returns_self_and_a_clone_of_a_fitted_estimator_is_unfitted(labelled):
    trajs, states = labelled
    ids = [t.traj_id for t in trajs]
    labels = [int(t.label) for t in trajs]
    bank = Bank(channels=("cot", "fn"))
    assert bank.fit_trajectories(trajs, states, FP) is bank and hasattr(bank, "pos_")
    scorer = LinearScorer(max_epochs=2, seed=1)
    assert scorer.fit([states[i] for i in ids], labels, fingerprint=FP) is scorer and hasattr(scorer, "W_")
    sifter = Sifter(scorer_epochs=2, seed=1, min_keep=2)
    assert sifter.fit(trajs, states, fingerprint=FP) is sifter
    assert sifter.filter_params()["min_keep"] == 2 and "scorer_epochs" not in sifter.filter_params()
    for fitted, learned in ((bank, "pos_"), (scorer, "W_"), (sifter, "config_")):
        copy = clone(fitted)
        assert not hasattr(copy, learned) and copy.get_params() == fitted.get_params()
    again = clone(sifter).fit(trajs, states, fingerprint=FP)    # the same settings fit the same sifter
    assert np.array_equal(again.scorer.W_, sifter.scorer.W_)
