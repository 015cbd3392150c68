"""Calibration of the physical parameters the published training runs decide, with leave-one-source-out.

Most of the cost model's numbers come from kernel measurements and datasheets (benchmarks/calibrate.py
for the GEMM and memory rates of H100 and A100, validation/kernels/ for attention and collectives). A
few cannot be measured here (no device is lent to this project) and nothing published measures them
in isolation; they are fitted, one number per device generation or per software stack (never per
row), to the published runs of validation/published/ (every stack's file and features.json):
- per device generation (hardware profiles' `efficiency` blocks):
  * H100/H200 `sustained_clock_fraction`: the Hopper rates were measured in seconds-long single-GPU runs at
    boost clock; a training run holds a lower clock (every Hopper row decides it);
  * H100/H200 `gemm_efficiency_max_fp8`: FP8 GEMMs (no FP8 GEMM table is published in text);
  * B200/GB200 `gemm_efficiency_max`, `gemm_efficiency_max_fp8`, `fused_attention_efficiency`:
    no Blackwell kernel measurement is vendored;
- per attention kernel, on every device: `triton_attention_relative`, the rate of llm-foundry's fork of
  the Triton FlashAttention over FlashAttention-2's (the only published kernel figure, 0.43 in
  FlashAttention-2's README, need not be that fork; it is the typed table's default);
- per cluster, only where the cluster's parts differ physically from their generation's reference:
  * Meta's Grand Teton H100 96GB `power_limit_clock_fraction`: these parts run at a 500 W power limit
    (torchtitan's benchmark pages), not the 700 W of the H100 SXM the Hopper rates were measured on;
- per software stack (frameworks/*.json): `compute_efficiency` of torchtitan and deepspeed, the
  share of the kernel rates their blocks reach; Megatron (whose runs calibrated the kernel rates) is
  the reference, 1, and so is fsdp (eager PyTorch, whose wrapper's cost is its per-block
  collectives' latency, cost_models.comm.shard_unit_latency_seconds).

The fit minimises a robust (soft-L1) sum of squared log errors log(predicted / measured) over every
row with a published step time, each run once (benchmarks/stack_predictions.unique). Leave one
source out: each source's rows are predicted with the parameters refitted without that source, the
figure benchmarks/accuracy_frameworks.py --loo prints. The refit is linearized by default: one
Jacobian of the log errors in the log parameters at the full fit, then per source the same robust
least squares on that linear model without the source's rows (a Gauss-Newton solution; minutes);
`--loo-exact` refits the cost model itself per source (hours on two cores). The held-out rows are
always predicted by the full cost model.

Run: .venv/bin/python benchmarks/calibrate_frameworks.py [--write] [--loo | --loo-exact]
(--write stores the full fit in the profiles and framework files; results in
benchmarks/results/calibration_frameworks.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import stack_predictions as A  # noqa: E402
from benchmarks import published_rows as R  # noqa: E402
from frameworks import load_framework  # noqa: E402

from hardware_profiles import load_profile  # noqa: E402
from hardware_profiles.efficiency import efficiency  # noqa: E402
from hardware_profiles.loader import PROFILE_DIR  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "calibration_frameworks.json"
FILES = (*R.STACK_FILES, "features")
"""Collections the fit reads (moe.json waits for expert-parallel costing)."""

HOPPER = ("H100", "H200")
BLACKWELL = ("B200", "GB200")
HOPPER_PROFILES = ("dgx-h100", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge")
BLACKWELL_PROFILES = (
    "dgx-b200",
    "p6-b200.48xlarge",
    "gb200-nvl72",
    "p6e-gb200.36xlarge",
    "dgx-b300",
    "gb300-nvl72",
)
"""Blackwell profiles the Blackwell fits are written into: Blackwell Ultra (B300, GB300) runs BF16
and FP8 at B200 and GB200 rates, and no published run of it is in the set."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Param:
    """One fitted number: a hardware efficiency key for a device generation, or a framework key."""

    name: str
    key: str
    low: float
    high: float
    gpus: tuple[str, ...] = ()
    """Device generation (the row's `gpu` starts with one of these); empty for a framework key."""
    framework: str | None = None
    kernel: str | None = None
    """An attention kernel whose own rate this is (every device; the rows that run the kernel)."""
    cluster: str | None = None
    """A validation cluster (validation/hardware/clusters) whose own key this is (a power-capped part)."""

    def applies(self, case) -> bool:
        if self.framework is not None:
            return case.framework == self.framework
        if self.cluster is not None:
            return case.hardware.name == self.cluster
        if self.kernel is not None:
            return case.options.attention == self.kernel
        return case.row["gpu"].split()[0] in self.gpus

    def start(self, case_hw=None) -> float:
        if self.framework is not None:
            return float(getattr(load_framework(self.framework), self.key))

        if self.cluster is not None:
            return float(efficiency(R.hardware(self.cluster), self.key))

        if self.kernel is not None:
            return float(efficiency(load_profile(HOPPER_PROFILES[0]), self.key))
        profile = HOPPER_PROFILES[0] if self.gpus == HOPPER else BLACKWELL_PROFILES[0]
        return float(efficiency(load_profile(profile), self.key))


PARAMS = (
    # Hopper's attention rates are not fitted: they are measured kernel rates (validation/kernels/attention.json:
    # FlashAttention-2 0.29-0.34 and FlashAttention-3 / cuDNN forward 0.62-0.66 of the H100 peak at 16k tokens). NeMo's
    # long-sequence H100 runs alone want the fused rate at 0.35 (2024 containers), but the 2025 Megatron-Core MoE
    # long-context runs are then up to 67% slow (cuDNN's attention grew faster between those releases, which no key
    # separates): the measured rate is kept. Blackwell has no vendored kernel measurement: fitted.
    Param(
        name="triton_attention_relative",
        key="triton_attention_relative",
        low=0.2,
        high=1.5,
        kernel="triton",
    ),
    # Hopper's BF16 GEMM and attention rates were measured in seconds-long single-H100 runs at boost clock
    # (benchmarks/calibrate.py); a training run sustains a lower clock. Every Hopper run (BF16 and FP8, every stack)
    # decides it; the FP8 GEMM rate is then the kernel's own share of that sustained rate.
    Param(
        name="hopper.sustained_clock_fraction",
        key="sustained_clock_fraction",
        low=0.6,
        high=1.0,
        gpus=HOPPER,
    ),
    Param(
        name="hopper.gemm_efficiency_max_fp8",
        key="gemm_efficiency_max_fp8",
        low=0.3,
        high=0.95,
        gpus=HOPPER,
    ),
    Param(
        name="blackwell.gemm_efficiency_max",
        key="gemm_efficiency_max",
        low=0.3,
        high=0.95,
        gpus=BLACKWELL,
    ),
    Param(
        name="blackwell.gemm_efficiency_max_fp8",
        key="gemm_efficiency_max_fp8",
        low=0.3,
        high=0.95,
        gpus=BLACKWELL,
    ),
    Param(
        name="blackwell.fused_attention_efficiency",
        key="fused_attention_efficiency",
        low=0.2,
        high=0.75,
        gpus=BLACKWELL,
    ),
    # Meta's Grand Teton H100 96GB (torchtitan's and torchao's H100 benchmarks) runs at its default 500 W power limit,
    # not the 700 W of the H100 SXM whose GEMM and attention rates the Hopper block holds; no published measurement
    # of its sustained clock: fitted (torchtitan's compute_efficiency is then decided by its A100 and H200 runs too).
    Param(
        name="grand-teton-h100-96gb.power_limit_clock_fraction",
        key="power_limit_clock_fraction",
        low=0.5,
        high=1.0,
        cluster="meta-grand-teton-h100-96gb",
    ),
    # fsdp's compute_efficiency is 1, not fitted: eager PyTorch reaches the kernel rates on our
    # own single-H100 steps (benchmarks/accuracy_h100.py, the same stack without a wrapper); what
    # the multi-GPU FSDP runs lose is the per-block collectives' ring latency (frameworks'
    # shard_per_block, cost_models.comm.shard_unit_latency_seconds). Held at a fit of 0.962 before.
    Param(
        name="torchtitan.compute_efficiency",
        key="compute_efficiency",
        low=0.4,
        high=1.0,
        framework="torchtitan",
    ),
    Param(
        name="deepspeed.compute_efficiency",
        key="compute_efficiency",
        low=0.4,
        high=1.0,
        framework="deepspeed",
    ),
)


def overrides_for(values: dict[str, float]):
    """`overrides(case) -> (hardware, framework profile)` with the parameters set to `values`."""
    fw_cache: dict[str, object] = {}

    def framework(name: str):
        if name not in fw_cache:
            changes = {
                p.key: values[p.name] for p in PARAMS if p.framework == name and p.name in values
            }
            fw = load_framework(name)
            fw_cache[name] = dataclasses.replace(fw, **changes) if changes else None
        return fw_cache[name]

    hw_cache: dict[tuple, object] = {}

    def overrides(case):
        changes = {
            p.key: values[p.name]
            for p in PARAMS
            if not p.framework and p.name in values and p.applies(case)
        }
        key = (case.hardware.name, tuple(sorted(changes.items())))
        if key not in hw_cache:
            hw_cache[key] = (
                dataclasses.replace(
                    case.hardware, efficiency={**case.hardware.efficiency, **changes}
                )
                if changes
                else case.hardware
            )
        return hw_cache[key], framework(case.framework)

    return overrides


def usable(cases):
    """Rows the fit can use: a published step time, a model and configuration the planner represents,
    no mixture of experts (expert parallelism is costed separately)."""
    return [
        c
        for c in cases
        if c.error is None
        and c.measured_s
        and c.config is not None
        and getattr(c.spec, "moe", None) is None
    ]


def log_errors(cases, values) -> np.ndarray:
    over = overrides_for(values)
    out = []
    for c in cases:
        r = A.predict(c, overrides=over)
        out.append(math.log(r.predicted_s / r.measured_s) if r.error is not None else 0.0)
    return np.array(out)


def fit(cases, params=PARAMS, start: dict | None = None, *, max_nfev: int = 60) -> dict[str, float]:
    """Least squares (soft L1) on log(predicted / measured); a parameter no case applies to keeps its
    start value."""
    live = [p for p in params if any(p.applies(c) for c in cases)]
    x0 = np.array([np.clip((start or {}).get(p.name, p.start()), p.low, p.high) for p in live])
    fixed = {k: v for k, v in (start or {}).items() if k not in {p.name for p in live}}
    cases = [c for c in cases if any(p.applies(c) for p in live)]  # the others do not move

    def resid(x):
        return log_errors(cases, {**fixed, **{p.name: float(v) for p, v in zip(live, x)}})

    sol = least_squares(
        resid,
        x0,
        bounds=([p.low for p in live], [p.high for p in live]),
        loss="soft_l1",
        f_scale=0.1,
        diff_step=1e-3,
        max_nfev=max_nfev,
    )
    out = {p.name: (start or {}).get(p.name, p.start()) for p in params}
    out.update({p.name: float(v) for p, v in zip(live, sol.x)})
    return out


def shipped() -> dict[str, float]:
    """The parameters the profiles and framework files hold now (the last `--write`)."""
    return {p.name: p.start() for p in PARAMS}


LOG_STEP = 0.02
"""Step of the finite differences in log-parameter space (2%)."""


def log_jacobian(rows, values: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Log errors r at `values` and J[i, j] = d r_i / d log(value_j), by forward differences; a row's
    prediction depends only on the parameters that apply to it (its device generation, its stack), so
    column j costs one prediction per row it applies to."""
    r0 = log_errors(rows, values)
    jac = np.zeros((len(rows), len(PARAMS)))
    for j, p in enumerate(PARAMS):
        idx = [i for i, c in enumerate(rows) if p.applies(c)]
        if not idx:
            continue
        bumped = {**values, p.name: values[p.name] * math.exp(LOG_STEP)}
        jac[idx, j] = (log_errors([rows[i] for i in idx], bumped) - r0[idx]) / LOG_STEP
    return r0, jac


def linearized_refit(r0, jac, keep, touched, full: dict[str, float]) -> dict[str, float]:
    """The fit without the rows not in `keep`, on the model linearized at the full fit: the same robust
    loss (soft L1, f_scale 0.1) and bounds as `fit`, over log(value / full) of the touched parameters (a
    Gauss-Newton solution from the full fit; the error log-model is close to linear in the log of
    these rates, since each divides a share of the step time)."""
    cols = [j for j, p in enumerate(PARAMS) if p in touched]
    if not cols or not keep.any():
        return dict(full)
    a, b = jac[keep][:, cols], r0[keep]
    lo = [math.log(PARAMS[j].low / full[PARAMS[j].name]) for j in cols]
    hi = [math.log(PARAMS[j].high / full[PARAMS[j].name]) for j in cols]
    x0 = np.clip(np.zeros(len(cols)), np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    sol = least_squares(lambda d: b + a @ d, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
    out = dict(full)
    out.update({PARAMS[j].name: full[PARAMS[j].name] * math.exp(d) for j, d in zip(cols, sol.x)})
    return out


def leave_one_source_out(cases, full: dict | None = None, *, exact: bool = False):
    """Every case predicted with parameters fitted without its source (A.Result list, all cases).

    `full` defaults to the shipped parameters (the fit `--write` stored). By default each source's refit
    is `linearized_refit` (one Jacobian for all sources: minutes); `exact` refits the model itself per
    source (scipy, 12 evaluations from the full fit: hours on two cores). Either way the held-out rows
    are predicted by the full cost model at the refitted values."""
    rows = usable(cases)
    full = full or shipped()
    r0, jac = log_jacobian(rows, full) if not exact else (None, None)
    by_source: dict[str, list] = {}
    for c in cases:
        by_source.setdefault(c.source, []).append(c)
    results = []
    for source, mine in sorted(by_source.items()):
        touched = [p for p in PARAMS if any(p.applies(c) for c in mine if c in rows)]
        if exact:
            rest = [c for c in rows if c.source != source]
            values = fit(rest, touched, start=full, max_nfev=12) if touched else full
            values = {**full, **{p.name: values[p.name] for p in touched}}
        else:
            keep = np.array([c.source != source for c in rows])
            values = linearized_refit(r0, jac, keep, touched, full)
        over = overrides_for(values)
        results += [A.predict(c, overrides=over) for c in mine]
    return results


def write(values: dict[str, float], note: str) -> None:
    """Store the fit: hardware efficiency keys in every profile of the generation (the validation clusters
    refine their generation's profile and take them from it: hardware_profiles.loader.refined_document), a
    cluster's own key in its validation cluster file, framework keys in frameworks/*.json, each with its
    source."""
    for p in PARAMS:
        v = round(values[p.name], 3)
        if p.framework:
            path = ROOT / "frameworks" / f"{p.framework}.json"
            doc = json.loads(path.read_text())
            doc[p.key] = v
            doc["sources"][p.key] = f"{v}: {note}"
            path.write_text(json.dumps(doc, indent=2) + "\n")
            continue
        if p.cluster:
            paths = [ROOT / "validation" / "hardware" / "clusters" / f"{p.cluster}.json"]
        elif p.kernel:
            paths = sorted(PROFILE_DIR.glob("*.json"))
        else:
            names = HOPPER_PROFILES if p.gpus == HOPPER else BLACKWELL_PROFILES
            paths = [ROOT / "hardware_profiles" / f"{n}.json" for n in names]
        for path in paths:
            doc = json.loads(path.read_text())
            doc["efficiency"][p.key] = v
            src = doc.setdefault("sources", {})
            text = src.get("efficiency", "")
            tag = f"{p.key} {v}: {note}"
            parts = [s for s in text.split("; ") if not s.startswith(p.key + " ")]
            src["efficiency"] = "; ".join([*parts, tag]) if parts else tag
            path.write_text(json.dumps(doc, indent=2, ensure_ascii=not p.cluster) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--write",
        action="store_true",
        help="store the full fit in the profiles and framework files",
    )
    ap.add_argument(
        "--loo", action="store_true", help="also leave one source out (linearized refits)"
    )
    ap.add_argument(
        "--loo-exact",
        action="store_true",
        help="leave one source out with a full refit per source (hours)",
    )
    args = ap.parse_args(argv)
    cases = A.unique(R.load(FILES))
    rows = usable(cases)
    before = log_errors(rows, {})
    values = fit(rows)
    after = log_errors(rows, values)
    mape = lambda e: 100 * statistics.fmean(abs(math.exp(v) - 1) for v in e)  # noqa: E731
    print(f"{len(rows)} rows with a published step time (of {len(cases)} runs)")
    for p in PARAMS:
        print(
            f"  {p.name:42} {p.start():.3f} -> {values[p.name]:.3f}   "
            f"({sum(p.applies(c) for c in rows)} rows)"
        )
    print(f"MAPE {mape(before):.1f}% -> {mape(after):.1f}%")
    result = {
        "rows": len(rows),
        "fit": values,
        "mape_before": mape(before),
        "mape_after": mape(after),
    }
    if args.loo or args.loo_exact:
        loo = leave_one_source_out(cases, values, exact=args.loo_exact)
        result["leave_one_source_out"] = A.groups(loo)
        print(A.table("Leave one source out", result["leave_one_source_out"]))
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    if args.write:
        write(
            values,
            f"fitted to {len(rows)} published runs (benchmarks/calibrate_frameworks.py, leave one source "
            "out in benchmarks/results/calibration_frameworks.json)",
        )
        print(
            "wrote the fit into hardware_profiles/, validation/hardware/clusters/ and frameworks/"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
