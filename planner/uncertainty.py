"""How far a predicted step can be trusted, and which ranked plans the model cannot tell apart
(issue 32, "near-ties are ties").

The error is measured, not assumed: the leave-one-source-out MAPE of the step time on published
runs of the plan's stack at the plan's scale (benchmarks/accuracy_frameworks.py --loo, shipped as
planner/data/model_error.json by benchmarks/model_error.py), and for a mixture-of-experts model the
larger of that and the error on the published MoE runs at that scale (benchmarks/accuracy_moe.py,
all of them Megatron-Core or NeMo AutoModel steps). A plan's band is its predicted step +- that
error. Two plans whose steps differ by less than it are a tie: the ranking between them is
the model's noise. Among the plans tied with the fastest, the one with the fewest parallel axes and
then the most memory headroom is the one to prefer (fewer process groups to debug, room for a
longer sequence or a kernel that needs memory): recommend ranks it first and says which plan is the
fastest (`--prefer fastest` keeps the predicted order).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

ERRORS = Path(__file__).resolve().parent / "data" / "model_error.json"
SCALE_BANDS = (("<= 512", 512), ("513-4,096", 4096), ("> 4,096", math.inf))
"""The accuracy benchmark's scale bands: name and largest GPU count."""
AXES = ("dp", "tp", "pp", "cp", "ep")
TIED_OBJECTIVES = ("throughput", "cost", "time-to-train")
"""Objectives ranked by the step time (cost and time to train scale with it on one cluster); the
memory objective ranks by peak memory, which has its own, smaller error."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ErrorBand:
    framework: str
    scale: str
    """The scale band of the plan's GPU count."""
    mape: float
    rows: int
    """Published runs behind the figure."""
    measured_at_scale: bool
    """False: the stack has fewer than MIN_BAND_ROWS published runs in this band; `mape` is its
    error over all scales."""
    source: str = (
        "leave-one-source-out error on published runs (benchmarks/accuracy_frameworks.py --loo)"
    )


@lru_cache(maxsize=1)
def _shipped() -> dict:
    return json.loads(ERRORS.read_text())


def _errors() -> dict:
    return _shipped()["frameworks"]


def scale_band(gpus: int) -> str:
    return next(name for name, top in SCALE_BANDS if gpus <= top)


def error_band(framework: str, gpus: int, *, moe: bool = False) -> ErrorBand | None:
    """The stack's measured error at `gpus` GPUs; with `moe`, the MoE runs' error at that scale
    where it is larger (moe_band); None for a stack with no published runs."""
    stack = _errors().get(framework)
    if stack is None:
        return None
    dense = _band(framework, scale_band(gpus), stack)
    wider = moe_band(framework, gpus) if moe else None
    return wider if wider is not None and wider.mape > dense.mape else dense


def moe_band(framework: str, gpus: int) -> ErrorBand | None:
    """The error on the published mixture-of-experts runs at `gpus` GPUs (over all of them where
    none ran at that scale); None when the shipped file has none."""
    runs = _shipped().get("moe")
    if runs is None:
        return None
    band = _band(framework, scale_band(gpus), runs)
    source = "leave-one-source-out error on published MoE runs (benchmarks/accuracy_moe.py)"
    return replace(band, source=source)


MIN_BAND_ROWS = 10
"""Published runs a scale band needs to stand for that scale; a thinner band (DeepSpeed's 6 runs at
513-4,096 GPUs, the MoE runs' 3) takes the error over all scales, and says it was not measured
there."""


def _band(framework: str, scale: str, errors: Mapping[str, Any]) -> ErrorBand:
    band = errors["bands"].get(scale)
    band = band if band and band["rows"] >= MIN_BAND_ROWS else None
    return ErrorBand(
        framework=framework,
        scale=scale,
        mape=float(band["mape"] if band else errors["all"]),
        rows=int(band["rows"] if band else errors["rows"]),
        measured_at_scale=band is not None,
    )


def axes(plan: Mapping[str, Any]) -> int:
    """Parallel axes a plan uses (degrees above 1)."""
    return sum(int(plan.get(k, 1) or 1) > 1 for k in AXES)


def with_bands(documents: Sequence[dict]) -> list[dict]:
    """The plan documents, each with `prediction.uncertainty`: the error band of its step (copies;
    unchanged for a stack with no published runs)."""
    bands = [_band_of(d) for d in documents]
    return [dict(d) if b is None else _with_band(d, b) for d, b in zip(documents, bands)]


def ties_of(documents: Sequence[Mapping[str, Any]], objective: str) -> dict | None:
    """near_ties of the ranked documents (fastest first), None when the objective does not rank by
    the step or the stack's error is unknown."""
    band = _band_of(documents[0]) if documents else None
    if band is None or objective not in TIED_OBJECTIVES:
        return None
    return near_ties(documents, band)


def _band_of(document: Mapping[str, Any]) -> ErrorBand | None:
    framework = document["plan"].get("framework", "megatron")
    moe = bool(((document.get("model") or {}).get("arch") or {}).get("moe"))
    return error_band(framework, int(document["hardware"]["gpus"]), moe=moe)


def _with_band(document: dict, band: ErrorBand) -> dict:
    step = float(document["prediction"]["step_time_s"])
    prediction = dict(document["prediction"])
    prediction["uncertainty"] = {
        "mape": band.mape,
        "scale": band.scale,
        "rows": band.rows,
        "measured_at_scale": band.measured_at_scale,
        "step_time_s": [step * (1.0 - band.mape), step * (1.0 + band.mape)],
        "source": band.source,
    }
    return {**document, "prediction": prediction}


def near_ties(documents: Sequence[Mapping[str, Any]], band: ErrorBand) -> dict:
    """Which plans are within `band.mape` of the fastest's step, and which of them to prefer:
    fewest axes, then lowest peak memory, then the faster."""
    fastest = float(documents[0]["prediction"]["step_time_s"])
    tied = [
        i
        for i, d in enumerate(documents)
        if d["prediction"]["memory"]["fits"]
        and float(d["prediction"]["step_time_s"]) < fastest * (1.0 + band.mape)
    ]
    preferred = min(
        tied,
        key=lambda i: (
            axes(documents[i]["plan"]),
            int(documents[i]["prediction"]["memory"]["peak_bytes_per_gpu"]),
            float(documents[i]["prediction"]["step_time_s"]),
        ),
        default=0,
    )
    return {"mape": band.mape, "scale": band.scale, "plans": tied, "preferred": preferred}


def ranked_by_preference(
    documents: Sequence[dict], ties: dict | None, prefer: str
) -> tuple[list[dict], dict | None]:
    """The ranked documents (fastest first) and their near_ties with the tie to prefer moved first
    (`prefer` 'headroom'), the others keeping their order; `fastest` is where the fastest plan went
    (0 under 'fastest' or when it is the one to prefer). Indices in the ties follow the new order."""
    documents = list(documents)
    if ties is None:
        return documents, None
    first = ties["preferred"] if prefer == "headroom" else 0
    order = [first, *(i for i in range(len(documents)) if i != first)]
    position = {old: new for new, old in enumerate(order)}
    moved = {
        **ties,
        "plans": sorted(position[i] for i in ties["plans"]),
        "preferred": position[ties["preferred"]],
        "fastest": position[0],
    }
    return [documents[i] for i in order], moved
