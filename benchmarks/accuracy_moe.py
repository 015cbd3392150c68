"""Predicted vs published step time of the mixture-of-experts runs (validation/published/moe.json).

Every row is loaded as a case by benchmarks/published_rows.py (model, hardware profile, parallel
configuration with ep / expert_tp, and the software choices the row states: framework, attention, MoE
dispatcher, exchange overlap, FP8 dispatch, kernels) and predicted with `planner.estimate.estimate`. The
published step time is the iteration time, or global tokens over the token rate; rows that print only
TFLOP/s per GPU (the Model Zoo long-context table) are converted with the source's FLOP convention
(Megatron-LM's num_floating_point_operations: 3 x forward GEMMs of the active path, causal attention
halved, logits, MTP), which the script checks on the source's rows that print both (`conventions`).

One physical parameter is fitted here: the Megatron stack's `moe_host_ops_per_layer` (host operators
of a dropless MoE layer's forward, cost_models.moe.host_sync_seconds). It is fitted to the rows that
run on the megatron profile and checked leave-one-out by whole source: for each source its rows are
predicted with the value fitted on the other sources alone. The fitted value is what
frameworks/megatron.json ships. The routed-token imbalance is not fitted into any row (the benchmark
rows force balanced routing); `imbalance_check` reports the imbalance that each Model Zoo dropless /
forced-balance pair implies, a consistency check of cost_models.moe's imbalance term.

Run: .venv/bin/python benchmarks/accuracy_moe.py   (writes benchmarks/results/accuracy_moe.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.published_rows import Case, load  # noqa: E402
from cost_models.flops import model_flops_per_step  # noqa: E402
from frameworks import load_framework  # noqa: E402
from planner.estimate import estimate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "accuracy_moe.json"
FITTED = ("megatron", "moe_host_ops_per_layer")
"""The one fitted parameter: (framework, FrameworkProfile field)."""
GRID = tuple(float(v) for v in range(0, 401, 10))
"""Values tried for it (host operators per MoE layer forward)."""


def measured_s(case: Case) -> float:
    """Published seconds per step; TFLOP/s-only rows through the source's FLOP convention."""
    if case.measured_s is not None:
        return case.measured_s
    row = case.row
    flops = model_flops_per_step(
        case.spec, row["global_batch"] * row["seq"], seq=row["seq"], causal_half=True
    )
    return flops / (row["measured"]["tflops_per_gpu"] * 1e12 * row["gpus"])


def conventions(cases: list[Case]) -> dict:
    """Per source: published TFLOP/s over what the causal-halved convention gives at the published step
    time, on rows that print both (1.0 = the convention the TFLOP/s-only rows are converted with)."""
    out: dict[str, list[float]] = {}
    for c in cases:
        tf = c.row["measured"].get("tflops_per_gpu")
        if tf and c.measured_s:
            tokens = c.row["global_batch"] * c.row["seq"]
            flops = model_flops_per_step(c.spec, tokens, seq=c.row["seq"], causal_half=True)
            out.setdefault(c.source, []).append(tf * 1e12 * c.row["gpus"] * c.measured_s / flops)
    return {s: {"rows": len(v), "min": min(v), "max": max(v)} for s, v in out.items()}


def predict(case: Case, value: float | None = None):
    """The estimate of a case; with `value`, the megatron profile's fitted parameter set to it
    (the same estimate, the simulated step, on that trial profile: estimate's framework_profile)."""
    trial = None
    if value is not None and case.framework == FITTED[0]:
        trial = replace(load_framework(FITTED[0]), **{FITTED[1]: value})
    est = estimate(
        case.spec,
        case.hardware,
        case.config,
        gpus=case.row["gpus"],
        check_framework=case.check_framework,
        options=case.options,
        framework_profile=trial,
    )
    return est.step_time_s, est


def mape(errors) -> float:
    return statistics.fmean(abs(e) for e in errors) if errors else float("nan")


def fit(cases: list[Case]) -> float:
    """The grid value with the lowest MAPE over the cases that run on the fitted framework."""
    mine = [c for c in cases if c.framework == FITTED[0]]
    return min(GRID, key=lambda v: (mape([predict(c, v)[0] / measured_s(c) - 1 for c in mine]), v))


def imbalance_check(cases: list[Case]) -> list[dict]:
    """For each forced-balance row that also prints its dropless TFLOP/s: the routed-token imbalance at
    which the model's step time grows by the published ratio (forced / dropless TFLOP/s), by bisection."""
    out = []
    for c in cases:
        dropless = (c.row.get("extras") or {}).get("dropless_tflops_per_gpu")
        if not dropless:
            continue
        target = c.row["measured"]["tflops_per_gpu"] / dropless
        base = predict(c)[0]
        run = lambda imb: (
            estimate(
                c.spec,
                c.hardware,
                c.config,
                gpus=c.row["gpus"],  # noqa: E731
                options=c.options.with_(moe_imbalance=imb),
                check_framework=c.check_framework,
            ).step_time_s
            / base
        )
        lo, hi = 1.0, 8.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if run(mid) < target else (lo, mid)
        out.append(
            {
                "id": c.id,
                "seq": c.row["seq"],
                "published_ratio": target,
                "implied_imbalance": (lo + hi) / 2,
            }
        )
    return out


def main() -> dict:
    cases = load(["moe"])
    shipped = getattr(load_framework(FITTED[0]), FITTED[1])
    sources = sorted({c.source for c in cases})
    loo_value = {s: fit([c for c in cases if c.source != s]) for s in sources}
    rows = []
    for c in cases:
        pred, est = predict(c)
        loo, _ = predict(c, loo_value[c.source])
        m = measured_s(c)
        rows.append(
            {
                "id": c.id,
                "source": c.source,
                "framework": c.framework,
                "gpus": c.row["gpus"],
                "config": {
                    k: c.row[k]
                    for k in (
                        "dp",
                        "tp",
                        "pp",
                        "cp",
                        "ep",
                        "expert_tp",
                        "micro_batch",
                        "global_batch",
                        "seq",
                        "precision",
                        "recompute",
                    )
                },
                "options": c.options.chosen(),
                "measured_s": m,
                "measured_from": "step" if c.measured_s else "tflops",
                "predicted_s": pred,
                "error": pred / m - 1,
                "loo_predicted_s": loo,
                "loo_error": loo / m - 1,
                "breakdown_s": est.time_breakdown_s(),
                "fits": est.fits,
                "needed_over_capacity": est.needed_bytes / float(c.hardware.memory_bytes),
            }
        )
    by_source = {
        s: {
            "rows": sum(r["source"] == s for r in rows),
            "mape": mape([r["error"] for r in rows if r["source"] == s]),
            "loo_mape": mape([r["loo_error"] for r in rows if r["source"] == s]),
            "fitted_without_it": loo_value[s],
        }
        for s in sources
    }
    worst = max(rows, key=lambda r: abs(r["error"]))
    result = {
        "rows": rows,
        "by_source": by_source,
        "mape": mape([r["error"] for r in rows]),
        "loo_mape": mape([r["loo_error"] for r in rows]),
        "estimated": len(rows),
        "refused": 0,
        "worst": {"id": worst["id"], "error": worst["error"]},
        "trained_predicted_not_to_fit": [
            {"id": r["id"], "needed_over_capacity": r["needed_over_capacity"]}
            for r in rows
            if not r["fits"]
        ],
        "fitted": {
            "framework": FITTED[0],
            "parameter": FITTED[1],
            "shipped": shipped,
            "fitted_on_all": fit(cases),
            "grid": [GRID[0], GRID[-1], GRID[1] - GRID[0]],
        },
        "conventions": conventions(cases),
        "imbalance_check": imbalance_check(cases),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    return result


def show(result: dict) -> None:
    print(
        f"{'row':46s} {'source':24s} {'meas s':>8s} {'pred s':>8s} {'err':>7s} {'LOO err':>8s}  main terms"
    )
    for r in result["rows"]:
        b = r["breakdown_s"]
        terms = " ".join(
            f"{k} {b[k]:.1f}"
            for k in ("compute", "ep_comm", "dp_comm", "bubble", "host_wait")
            if b[k] > 0.05
        )
        flag = "*" if r["measured_from"] == "tflops" else " "
        print(
            f"{r['id'][:46]:46s} {r['source'][:24]:24s} {r['measured_s']:7.2f}{flag} {r['predicted_s']:8.2f} "
            f"{r['error'] * 100:+6.1f}% {r['loo_error'] * 100:+7.1f}%  {terms}"
        )
    print("* step time from the published TFLOP/s (causal-halved Megatron convention)")
    print(
        f"\n{'source':28s} {'rows':>4s} {'MAPE':>7s} {'LOO MAPE':>9s}  {FITTED[1]} fitted without it"
    )
    for s, v in result["by_source"].items():
        print(
            f"{s:28s} {v['rows']:4d} {v['mape'] * 100:6.1f}% {v['loo_mape'] * 100:8.1f}%  {v['fitted_without_it']:g}"
        )
    f = result["fitted"]
    print(
        f"\nall {result['estimated']} rows estimated, {result['refused']} refused: MAPE {result['mape'] * 100:.1f}%, "
        f"leave-one-source-out {result['loo_mape'] * 100:.1f}%; worst {result['worst']['id']} "
        f"{result['worst']['error'] * 100:+.1f}%"
    )
    nofit = result["trained_predicted_not_to_fit"]
    print(
        f"runs that trained but are predicted not to fit: {len(nofit)}"
        + "".join(
            f"\n  {r['id']} (needs {r['needed_over_capacity']:.2f} x the device)" for r in nofit
        )
    )
    print(
        f"{f['framework']}.{f['parameter']}: shipped {f['shipped']:g}, fitted on all rows {f['fitted_on_all']:g}"
    )
    print(
        "TFLOP/s convention check (published / causal-halved at the published step):",
        ", ".join(
            f"{s} {v['min']:.3f}-{v['max']:.3f} ({v['rows']} rows)"
            for s, v in result["conventions"].items()
        ),
    )
    print(
        "imbalance implied by dropless vs forced-balance pairs:",
        ", ".join(
            f"{r['seq'] // 1024}k {r['implied_imbalance']:.2f}" for r in result["imbalance_check"]
        ),
    )


if __name__ == "__main__":
    show(main())
