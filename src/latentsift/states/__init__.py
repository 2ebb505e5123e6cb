"""The policy's hidden states: loading the policy (``model``), rendering a trajectory into token spans
per channel (``channel``), replaying it through the decoder stack (``states``), the on-disk store
(``store``) and the extraction driver (``extract``); the policy's own rollouts are the wing
``latentsift.rollout``."""
from .channel import Rendering, render
from .extract import ExtractionBackend, LocalExtractionBackend, extract_pools
from .model import Fingerprint, Policy, load_policy
from .capture import BatchRecorder
from .states import TrajectoryStates, exact_attention, replay, replay_many
from .store import StateStore

__all__ = ["BatchRecorder", "ExtractionBackend", "Fingerprint", "LocalExtractionBackend", "Policy",
           "Rendering", "StateStore", "TrajectoryStates", "exact_attention", "extract_pools",
           "load_policy", "render", "replay", "replay_many"]
