"""Scale-out on Ray: distributed state extraction and sharded bank search (docs/scale.md).

Ray is an optional extra (``pip install -e ".[ray]"``) imported only inside this subpackage; the
extraction backend ``RayBackend`` runs under the one driver ``latentsift.states.extract.extract_pools``, and the
results do not depend on the backend (one process, or N Ray workers give the same store and the same
distances). ``backends`` maps the command-line options onto this process or Ray workers. ``approx`` adds an optional FAISS IVF/HNSW bank backend (approximate, measured). Note: it is a second FAISS search path
beside the exact one in ``latentsift.bank.knn``; kept apart for now (docs/scale.md).
"""
from .backends import backend_from_options, check_backend_options, check_model_options, open_backend
from .cluster import connect, require_ray
from .extract import RayBackend
from .bank import ShardedBank, shard_bank

__all__ = ["backend_from_options", "check_backend_options", "check_model_options", "open_backend", "connect",
           "require_ray", "RayBackend", "ShardedBank", "shard_bank"]
