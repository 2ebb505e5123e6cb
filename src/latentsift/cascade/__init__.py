"""The cascade after Stage 1: the stages cheapest-first (``cascade``), the EF verifier (``verifier``)
and the models it asks (``backends``: a local causal LM or an OpenAI-compatible endpoint, or a registered one)."""
from .backends import LocalVerifierBackend, OpenAIBackend, VerifierBackend
from .cascade import CandidateRecord, PoolSpec, VerifierTable, run_cascade
from .verifier import EFVerifier, Verdict, VerifierFailure, load_results, save_results

__all__ = ["CandidateRecord", "EFVerifier", "LocalVerifierBackend", "OpenAIBackend", "PoolSpec", "Verdict",
           "VerifierBackend", "VerifierFailure", "VerifierTable", "load_results", "run_cascade", "save_results"]
