"""Storage profiles and the goodput model's defaults: sourced JSON files beside this module.

A checkpoint is written to (and, after a failure, read back from) some storage; how long that takes
decides how often it pays to checkpoint and how much a failure costs (cost_models.reliability). A
`StorageProfile` gives the bandwidth of one storage service for the whole job (aggregate) and for
one node; `null` in the file means "not the limit" (S3 has no bucket-wide bandwidth; a file system
without a published per-client limit is limited by the node's own network). `ReliabilityDefaults`
holds the failure rates, restart overhead, storage and save mode the planner assumes when the user
gives none. `storage_profiles/loader.py` validates every file: unknown keys refused, every number
sourced.

>>> s = load_storage("fsx-lustre")
>>> s.write_GBps_aggregate, s.write_GBps_per_node
(12.3, None)
>>> load_reliability_defaults().failure_rate_per_gpu_hour
1.2621e-05
"""

from __future__ import annotations

from storage_profiles.loader import available_storage, load_reliability_defaults, load_storage
from storage_profiles.profile import CHECKPOINT_MODES, ReliabilityDefaults, StorageProfile

__all__ = [
    "CHECKPOINT_MODES",
    "StorageProfile",
    "ReliabilityDefaults",
    "load_storage",
    "available_storage",
    "load_reliability_defaults",
]
