"""Words that name more than one thing, each spelled here once.

A registered name (``latentsift._core.registry``) is spelled in the one module that registers it. A
few words are registered in two kinds, or also name another concept (a tie rule, a summary key, a Ray
address, a dataset folder, an agent); such a word is spelled here only, and every module that means it,
in whichever sense, reads it from here (most under a name of their own that says which sense:
``cascade.TIE_RANDOM``, ``scale.cluster.RAY_LOCAL``). A test checks that no other source file spells them.
"""

#: The random filter (``sift.rules``); the cascade's tie rule (a seeded draw among the tied); best@k's random
#: pick among k (a summary key).
RANDOM = "random"
#: The inner-CV default filter (``sift.variants``); the bank the transfer verdict recommends; reproduce's
#: instance-selection rule.
DEFAULT = "default"
#: The transfer verdict's key of the recommended bank ("nearest" or "all"; ``protocol.transfer`` writes it,
#: ``report.transfer`` reads it): not the default filter.
VERDICT_BANK = DEFAULT
#: The local extraction backend (``states.extract``) and verifier backend (``cascade.backends``); Ray's
#: address of a cluster started on this machine.
LOCAL = "local"
#: The OpenAI-chat importer (``trajectories._chat``); the OpenAI-compatible verifier backend.
OPENAI = "openai"
#: The torch kNN backend (``bank.knn``); the scorer's initialisation as ``torch.nn.Linear`` does it.
TORCH = "torch"
#: The SWE-agent importer (``trajectories._sweagent``); the SWE-agent scaffold's agent name; a folder of the
#: shared dataset.
SWEAGENT = "sweagent"
#: The mini-swe-agent importer (``trajectories._chat``); that scaffold's agent name.
MINISWEAGENT = "minisweagent"
#: The R2E-Gym importer (``trajectories._r2egym``); that scaffold's agent name; a folder of the shared dataset.
R2EGYM = "r2egym"
#: The OpenHands importer (``trajectories._openhands``); that scaffold's agent name (its completion logs too).
OPENHANDS = "openhands"
