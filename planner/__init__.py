"""planner: a parallelism-strategy planner and cost-model advisor for training large PyTorch models.

Python API (docs/cli-contract): `load_plan(path)`, `estimate(...)`, `recommend(...)`; imported lazily
so that `import planner` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["load_plan", "estimate", "recommend", "__version__"]


def __getattr__(name: str):
    if name == "load_plan":
        from planner.plan import load_plan

        return load_plan
    if name == "estimate":
        from planner.estimate import estimate

        return estimate
    if name == "recommend":
        from planner.search import recommend

        return recommend
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
