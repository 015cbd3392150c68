"""Calibration of the few physical parameters in a profile's `efficiency` block, with leave-one-out.

Physical parameters, each one number per machine type (never per row):
- H100 (dgx-h100, p5.48xlarge): `gemm_efficiency_max` and `gemm_fixed_us` from the 5 GEMM
  measurements above the host-dispatch floor; `flash_attention_efficiency` from the literature
  (not fitted); `elementwise_bandwidth_fraction` (streaming kernels'
  share of the measured copy bandwidth), `gemm_efficiency_max_fp32`
  (SIMT fp32 GEMMs, TF32 off) and `dispatch_us_per_op` (host time per eager operator) from all 42
  training steps at once (least squares on log(predicted / measured)).
- A100 (dgx-a100-80g, p4d, p4de): `gemm_efficiency_max` from all 8 published runs.

Leave-one-out: refit without row i, predict row i; for H100 also leave one (model, precision)
group out. Run: .venv/bin/python benchmarks/calibrate.py [--write]  (--write stores the fitted
values in hardware_profiles/*.json; results in benchmarks/results/calibration.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import accuracy_h100 as H  # noqa: E402
from benchmarks import accuracy_published as PUB  # noqa: E402
from benchmarks.accuracy_published import fit_a100, leave_one_out_published  # noqa: E402
from benchmarks.efficiency_fit import fit_keys, with_eff  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from hardware_profiles.efficiency import EFFICIENCY_KEYS  # noqa: E402
from hardware_profiles.loader import PROFILE_DIR  # noqa: E402

H100_TRAIN_KEYS = {
    "elementwise_bandwidth_fraction": (0.3, 1.0),
    "gemm_efficiency_max_fp32": (0.3, 1.0),
    "dispatch_us_per_op": (0.0, 60.0),
    "mem_efficient_attention_efficiency": (0.1, 1.0),
}
A100_SMS = 108
"""Streaming multiprocessors of an A100 (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020): the waves its
GEMM tiles run in (cost_models.compute.wave_quantization), set before the A100 fit, which reads it."""


def fit_gemm(rows: list[dict], peak_tflops: float) -> dict:
    """t = F / (P e_max) + t0 over GEMMs above the dispatch floor (ms > 0.045), log least squares."""
    use = [r for r in rows if r["ms"] > 0.045]
    F = np.array([2.0 * r["m"] * r["n"] * r["k"] for r in use])
    t = np.array([r["ms"] * 1e-3 for r in use])

    def resid(x):
        return np.log((F / (peak_tflops * 1e12 * x[0]) + x[1] * 1e-6) / t)

    sol = least_squares(resid, [0.7, 10.0], bounds=([0.3, 0.0], [1.0, 100.0]))
    floor = [r["ms"] * 1e3 for r in rows if r["ms"] <= 0.045]
    return {
        "gemm_efficiency_max": float(sol.x[0]),
        "gemm_fixed_us": float(sol.x[1]),
        "gemm_rows_used": len(use),
        "gemm_rms_log_error": float(np.sqrt(np.mean(resid(sol.x) ** 2))),
        "host_floor_us_measured": floor,
    }


def _h100_rows():
    return [r for r in H.load_rows() if r["status"] == "ok"]


def _h100_pred(r, hw):
    return H.predict(r, hw)["step_time_s"]


def _h100_meas(r):
    return r["step_ms_median"] / 1e3


def fit_h100(hw, rows=None) -> dict:
    return fit_keys(H100_TRAIN_KEYS, hw, rows or _h100_rows(), _h100_pred, _h100_meas)


def leave_out_h100(hw, *, by_group: bool) -> dict:
    rows = _h100_rows()
    keyf = (lambda r: (r["model"], r["precision"])) if by_group else (lambda r: id(r))
    out = []
    for key in dict.fromkeys(keyf(r) for r in rows):
        train = [r for r in rows if keyf(r) != key]
        test = [r for r in rows if keyf(r) == key]
        h = with_eff(hw, fit_h100(hw, train))
        for r in test:
            tokens = r["seq"] * r["micro_batch"]
            out.append(
                {
                    "model": r["model"],
                    "precision": r["precision"],
                    "seq": r["seq"],
                    "micro_batch": r["micro_batch"],
                    "checkpointing": r["checkpointing"],
                    "timed": tokens >= H.TIMED_MIN_TOKENS,
                    "error": _h100_pred(r, h) / _h100_meas(r) - 1,
                }
            )
    timed = [abs(x["error"]) for x in out if x["timed"]]
    return {
        "rows": out,
        "median_abs_time_error_timed": statistics.median(timed),
        "max_abs_time_error_timed": max(timed),
    }


H100_PROFILES = ("dgx-h100", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge")
A100_PROFILES = ("dgx-a100-80g", "p4d.24xlarge", "p4de.24xlarge")


def efficiency_blocks(result: dict) -> dict[str, tuple[dict, str]]:
    """The `efficiency` block and its `sources` line for each calibrated profile."""
    common = {"allreduce_bus_efficiency": 0.8, "framework_workspace_bytes": 2 * 32 * 2**20}
    g, t, a = result["h100_gemm"], result["h100_train"], result["a100"]
    h100 = {
        **common,
        "gemm_efficiency_max": round(g["gemm_efficiency_max"], 4),
        "gemm_fixed_us": round(g["gemm_fixed_us"], 2),
        **{k: round(v, 4) for k, v in t.items()},
    }
    a100 = {
        **common,
        "gemm_efficiency_max": round(a["gemm_efficiency_max"], 4),
        "gemm_fixed_us": h100["gemm_fixed_us"],
        "elementwise_bandwidth_fraction": 1.0,
        "gemm_efficiency_max_fp32": h100["gemm_efficiency_max_fp32"],
        "dispatch_us_per_op": h100["dispatch_us_per_op"],
        "gemm_wave_sms": A100_SMS,
    }
    src_h = (
        "benchmarks/calibrate.py (docs/cost-model.md): gemm_efficiency_max, gemm_fixed_us fitted to the 5 H100 "
        "bf16 GEMMs above the host floor; elementwise_bandwidth_fraction, gemm_efficiency_max_fp32, "
        "dispatch_us_per_op, mem_efficient_attention_efficiency fitted jointly to all 42 H100 training steps of validation/h100_train_steps.jsonl (one value each, "
        "leave-one-out in benchmarks/results/calibration.json) with the profile's attention rates; allreduce_bus_efficiency: nccl-tests bus bandwidth "
        "~80% of link rate (not measured here); framework_workspace_bytes: two 32 MiB cuBLAS workspaces "
        "(forward stream and autograd thread) counted by the caching allocator"
    )
    src_a = (
        "benchmarks/calibrate.py (docs/cost-model.md): gemm_efficiency_max fitted to all 8 published Megatron-LM "
        "runs of validation/published_runs.json (one value; leave-one-out in "
        "benchmarks/results/calibration.json); gemm_fixed_us, gemm_efficiency_max_fp32 and dispatch_us_per_op "
        "carried over from the H100 fit; elementwise_bandwidth_fraction 1.0: fused Megatron kernels stream at the copy bandwidth of "
        "memory_bandwidth_GBps; allreduce_bus_efficiency: nccl-tests bus bandwidth ~80% of link rate; "
        "gemm_wave_sms: the A100's 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper), over which "
        "cuBLAS 11's 256 x 128 tiles run in whole waves (NVIDIA Matrix Multiplication Background User's Guide)"
    )
    carried = "carried over unchanged from p5.48xlarge (H100 80GB): no measurements exist on this device. "
    return {
        **{
            n: (h100, src_h if n in ("dgx-h100", "p5.48xlarge") else carried + src_h)
            for n in H100_PROFILES
        },
        **{n: (a100, src_a) for n in A100_PROFILES},
    }


def foreign_clauses(text: str, own_keys) -> list[str]:
    """The clauses of a profile's efficiency sources line that another script wrote: each starts with the
    efficiency key it sources (a '; ' inside a clause, as in a list of papers, does not end it), and its key is not
    one of `own_keys`. The clauses of this script's own keys and its preamble are left out (it writes them anew)."""

    def key(fragment: str) -> str:
        return fragment.split(" ", 1)[0].rstrip(",:")

    clauses: list[str] = []
    for fragment in text.split("; ") if text else []:
        if clauses and key(fragment) not in EFFICIENCY_KEYS:
            clauses[-1] += "; " + fragment
        else:
            clauses.append(fragment)
    return [c for c in clauses if key(c) in EFFICIENCY_KEYS and key(c) not in own_keys]


def write_profiles(result: dict, names=None) -> None:
    """Update this script's keys of each calibrated profile's `efficiency` block, and its part of the sources line;
    the keys and source clauses it does not write (the attention rates', calibrate_frameworks.py's) stay as they are."""
    for name, (block, source) in efficiency_blocks(result).items():
        if names and name not in names:
            continue
        path = PROFILE_DIR / f"{name}.json"
        data = json.loads(path.read_text())
        data["efficiency"] = {**data["efficiency"], **block}
        clauses = foreign_clauses(data["sources"].get("efficiency", ""), block)
        data["sources"]["efficiency"] = "; ".join([source, *clauses])
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print("wrote efficiency of", path.name)


CLUSTER_KEYS = ("host_memory_bytes_per_node", "power_limit_clock_fraction")
"""Efficiency keys a validation cluster sets itself; it takes the others from the shipped profile it
`refines` (hardware_profiles.loader.refined_document; benchmarks/calibrate_frameworks.py fits the
power-capped clock)."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    gemm_rows = [
        json.loads(x)
        for x in (H.VALIDATION / "h100_train_steps.jsonl").read_text().splitlines()
        if x.strip()
    ]
    gemm_rows = [r for r in gemm_rows if r.get("kind") == "gemm_bf16"]
    h100 = load_profile("dgx-h100")
    gemm = fit_gemm(gemm_rows, h100.peak_tflops["bf16"])
    print(
        "H100 GEMM fit:", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in gemm.items()}
    )
    h100 = with_eff(
        h100,
        {
            "gemm_efficiency_max": gemm["gemm_efficiency_max"],
            "gemm_fixed_us": gemm["gemm_fixed_us"],
        },
    )
    h100_fit = fit_h100(h100)
    print("H100 training-step fit:", {k: round(v, 4) for k, v in h100_fit.items()})
    a100 = with_eff(
        load_profile("dgx-a100-80g"),
        {"gemm_fixed_us": gemm["gemm_fixed_us"], "gemm_wave_sms": A100_SMS},
    )
    a100_fit = fit_a100(a100)
    print("A100 published-run fit:", {k: round(v, 4) for k, v in a100_fit.items()})
    result = {"h100_gemm": gemm, "h100_train": h100_fit, "a100": a100_fit}
    if "--loo" in argv:
        a100c = with_eff(a100, a100_fit)
        result["published_leave_one_out"] = leave_one_out_published(PUB.load_rows(), a100c)
        print(
            f"published LOO: MAPE {result['published_leave_one_out']['mape'] * 100:.2f}% "
            f"max {result['published_leave_one_out']['max_abs_error'] * 100:.2f}%"
        )
        h = with_eff(h100, h100_fit)
        result["h100_leave_one_group_out"] = leave_out_h100(h, by_group=True)
        print(
            f"H100 leave-one-(model, precision)-out: median |time error| (>= 8192 tokens) "
            f"{result['h100_leave_one_group_out']['median_abs_time_error_timed'] * 100:.1f}% "
            f"max {result['h100_leave_one_group_out']['max_abs_time_error_timed'] * 100:.1f}%"
        )
        result["h100_leave_one_row_out"] = leave_out_h100(h, by_group=False)
        print(
            f"H100 leave-one-row-out: median |time error| (>= 8192 tokens) "
            f"{result['h100_leave_one_row_out']['median_abs_time_error_timed'] * 100:.1f}% "
            f"max {result['h100_leave_one_row_out']['max_abs_time_error_timed'] * 100:.1f}%"
        )
    if "--write" in argv:
        only = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]
        write_profiles(result, set(only[0].split(",")) if only else None)
    (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / "results" / "calibration.json").write_text(
        json.dumps(result, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
