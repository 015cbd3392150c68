"""One published run's prediction on its own stack (`Result`, `predict`), each run once (`unique`),
and the errors summed up by framework, source and feature (`groups`, `table`): what
benchmarks/accuracy_frameworks.py reports and benchmarks/calibrate_frameworks.py fits."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from planner.errors import PlannerError
from planner.estimate import estimate
from cost_models.memory import cuda_context_bytes

FEATURES = {
    "cp": lambda c: c.config.cp > 1,
    "fp8": lambda c: c.config.precision == "fp8",
    "hsdp": lambda c: c.config.zero >= 1 and 0 < c.config.dp_shard < c.config.dp,
    "moe": lambda c: getattr(c.spec, "moe", None) is not None,
    "seq>=32k": lambda c: c.config.seq >= 32768,
}
"""Which rows count for each feature's line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Result:
    """One row's prediction."""

    id: str
    file: str
    source: str
    framework: str
    measured_s: float | None
    predicted_s: float | None
    fits: bool | None
    trained: bool
    refused: str | None
    features: tuple[str, ...]
    gpus: int = 0
    memory_kind: str | None = None
    """What the publication measured of the memory (validation/published/FORMAT.md memory_kind), if anything."""
    memory_error: float | None = None
    """Predicted / measured memory - 1 for that kind: allocated against the peak, reserved against the peak with
    the allocator's overhead, nvidia-smi against what the device must hold (cost_models.memory.needed_bytes)."""

    @property
    def error(self) -> float | None:
        """Signed relative error of the step time (predicted / measured - 1)."""
        if self.predicted_s is None or not self.measured_s:
            return None
        return self.predicted_s / self.measured_s - 1.0


def predict(case, *, overrides=None) -> Result:
    """The row's prediction; `overrides(case) -> (hardware, framework_profile)` substitutes calibrated
    parameters (benchmarks/calibrate_frameworks.py)."""
    feats = (
        () if case.config is None else tuple(name for name, test in FEATURES.items() if test(case))
    )
    common = dict(
        id=case.id,
        file=case.file,
        source=case.source,
        framework=case.framework,
        measured_s=case.measured_s,
        trained=bool(case.row.get("trained", True)),
        features=feats,
        gpus=int(case.row.get("gpus") or 0),
    )
    if case.error is not None:
        return Result(**common, predicted_s=None, fits=None, refused=case.error)
    hw, fw = (case.hardware, None) if overrides is None else overrides(case)
    try:
        est = estimate(
            case.spec,
            hw,
            case.config,
            gpus=case.row["gpus"],
            framework_profile=fw,
            check_framework=case.check_framework,
            options=case.options,
        )
    except PlannerError as err:
        return Result(**common, predicted_s=None, fits=None, refused=str(err))
    kind, measured = case.row.get("memory_kind"), case.row.get("measured_memory_gib")
    memory_error = None
    if kind and measured:
        predicted = {
            "allocated": est.peak_bytes_per_gpu,
            "reserved": est.needed_bytes - cuda_context_bytes(hw),
            "nvidia-smi": est.needed_bytes,
        }[kind]
        memory_error = predicted / (float(measured) * 2**30) - 1.0
    return Result(
        **common,
        predicted_s=float(est.step_time_s),
        fits=bool(est.fits),
        refused=None,
        memory_kind=kind if memory_error is not None else None,
        memory_error=memory_error,
    )


def summary(results: list[Result]) -> dict:
    """n, MAPE, mean signed error, worst row, refused and trained-but-not-fitting counts."""
    errs = [(r.error, r.id) for r in results if r.error is not None]
    out = {
        "rows": len(results),
        "predicted": len(errs),
        "refused": sum(r.refused is not None for r in results),
        "trained_predicted_not_to_fit": sum(r.trained and r.fits is False for r in results),
    }
    if errs:
        worst = max(errs, key=lambda e: abs(e[0]))
        out.update(
            mape=statistics.fmean(abs(e) for e, _ in errs),
            mean=statistics.fmean(e for e, _ in errs),
            median_abs=statistics.median(abs(e) for e, _ in errs),
            worst=worst[0],
            worst_id=worst[1],
        )
    return out


def groups(results: list[Result]) -> dict:
    by_fw, by_src, by_feat = {}, {}, {}
    for r in results:
        by_fw.setdefault(r.framework, []).append(r)
        by_src.setdefault((r.framework, r.source), []).append(r)
        for f in r.features:
            by_feat.setdefault(f, []).append(r)
    return {
        "framework": {k: summary(v) for k, v in sorted(by_fw.items())},
        "source": {f"{fw}/{src}": summary(v) for (fw, src), v in sorted(by_src.items())},
        "feature": {k: summary(v) for k, v in sorted(by_feat.items())},
    }


def _line(name: str, s: dict, width: int = 52) -> str:
    if "mape" not in s:
        return f"{name:{width}} {s['rows']:4}     (no step time predicted; refused {s['refused']})"
    return (
        f"{name:{width}} {s['predicted']:4} {100 * s['mape']:6.1f}% {100 * s['mean']:+7.1f}% "
        f"{100 * s['worst']:+7.1f}%  {s['refused']:3} {s['trained_predicted_not_to_fit']:3}   {s['worst_id']}"
    )


def table(title: str, g: dict) -> str:
    head = f"{'':52} {'rows':>4} {'MAPE':>7} {'mean':>8} {'worst':>8} ref nofit  worst row"
    lines = [title, head]
    for section in ("framework", "feature", "source"):
        lines.append(f"-- by {section}")
        lines += [_line(k, v) for k, v in g[section].items()]
    return "\n".join(lines)


def _identity(case):
    """What makes two rows the same run (features.json repeats runs of the per-stack files)."""
    r = case.row
    shape = (case.spec.layers, case.spec.hidden) if case.spec is not None else (r.get("model"),)
    return (
        r["framework"],
        r["gpus"],
        r["dp"],
        r["tp"],
        r["pp"],
        r.get("cp") or 1,
        r["micro_batch"],
        r["global_batch"],
        r["seq"],
        r["precision"],
        None if case.measured_s is None else round(case.measured_s, 2),
        *shape,
    )


def unique(cases):
    """The cases with each run once (the first file that lists it)."""
    seen, out = set(), []
    for c in cases:
        key = _identity(c)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
