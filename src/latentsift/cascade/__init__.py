"""The cascade after Stage 1: the stages cheapest-first (``cascade``), the EF verifier (``verifier``)
and the models it asks (``backends``: a local causal LM or an OpenAI-compatible endpoint)."""
from .backends import LocalBackend, OpenAIBackend
from .cascade import CandidateRecord, PoolSpec, VerifierTable, run_cascade
from .verifier import EFVerifier, Verdict, VerifierFailure, load_results, save_results

__all__ = ["CandidateRecord", "EFVerifier", "LocalBackend", "OpenAIBackend", "PoolSpec", "Verdict",
           "VerifierFailure", "VerifierTable", "load_results", "run_cascade", "save_results"]
