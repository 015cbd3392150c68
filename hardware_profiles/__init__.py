"""Hardware profiles: one JSON file per machine type beside this module, units in every key.

`load_profile(name_or_path) -> HardwareProfile` validates on load and raises ConfigError naming
the bad key and the file. The record below is the contract the cost models read; the loader
(`hardware_profiles/loader.py`) fills it.

>>> p = load_profile("p4d.24xlarge")
>>> p.devices_per_node, p.peak_tflops["bf16"], p.inter_node_Gbps_per_node
(8, 312.0, 400.0)
"""

from __future__ import annotations

from hardware_profiles.loader import available_profiles, load_profile
from hardware_profiles.profile import HardwareProfile

__all__ = ["HardwareProfile", "available_profiles", "load_profile"]
