"""The policy's hidden states: loading the policy (``model``), rendering a trajectory into token spans
per channel (``channel``), replaying it through the decoder stack (``states``), the on-disk store
(``store``) and the extraction driver (``extract``)."""
from .channel import Rendering, render
from .extract import ExtractionBackend, LocalExtractionBackend, extract_pools
from .model import Fingerprint, Policy, load_policy
from .states import TrajectoryStates, replay, replay_many
from .store import StateStore

__all__ = ["ExtractionBackend", "Fingerprint", "LocalExtractionBackend", "Policy", "Rendering", "StateStore",
           "TrajectoryStates", "extract_pools", "load_policy", "render", "replay", "replay_many"]
