"""Reference PyTorch implementations of the catalog's architectures (used by the executor and
to check the analytic profiler against real FLOP counts and saved activations)."""

from planner.models.transformer import Transformer, build_model

__all__ = ["Transformer", "build_model"]
