"""The public API: ``import latentsift`` exposes the estimators a user composes, and ``__all__`` is exact."""
import importlib
import subprocess
import sys

import latentsift

ESTIMATORS = {"Bank": "bank.bank", "LinearScorer": "sift.scorer", "LatentSift": "sift.sift", "Sifter": "deploy.sifter",
              "StateStore": "states.store", "load_policy": "states.model", "import_paths": "trajectories.importers",
              "crossval": "protocol"}


def test_the_estimators_are_exported_and_are_the_modules_objects():
    for name, module in ESTIMATORS.items():
        assert name in latentsift.__all__
        assert getattr(latentsift, name) is getattr(importlib.import_module(f"latentsift.{module}"), name)


def test_all_names_exactly_what_the_package_exposes():
    assert len(set(latentsift.__all__)) == len(latentsift.__all__)
    namespace: dict = {}
    exec("from latentsift import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(latentsift.__all__)
    public = {n for n in dir(latentsift) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(latentsift, n)).__name__ == "module"}
    assert public - modules == set(latentsift.__all__)


def test_import_stays_light():
    """The estimators load on first use: a bare import pulls in neither torch nor scipy."""
    code = "import sys, latentsift; print(sorted(m for m in ('torch', 'scipy', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
