"""Does `recommend` pick NVIDIA's own layout for NVIDIA's tuned jobs (issue 32)?

For each tuned job below (NVIDIA DGX Cloud benchmark recipes, rows of
validation/published/megatron.json), the search runs on the job's GPUs, global batch, sequence,
precision and stack with the recipe's run options (its overlaps: tp_comm_overlap,
overlap_grad_reduce, overlap_param_gather, ...; benchmarks.published_rows.options_of), and its pick
is compared with NVIDIA's layout predicted by the same model:

- "NVIDIA's layout": the pick has NVIDIA's dp, tp, pp, cp, virtual stages and micro-batch;
- "within error": the pick is predicted faster than NVIDIA's layout by less than the model's
  leave-one-source-out error for Megatron runs of that scale (planner.uncertainty, the band
  recommend reports), so the model cannot tell them apart;
- "beats by X": the model claims a gain larger than its error (a question for the model).

Prints a table and writes benchmarks/results/nvidia_layouts.json.

Run: .venv/bin/python benchmarks/nvidia_layouts.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import published_rows  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.search import recommend  # noqa: E402
from planner.uncertainty import error_band  # noqa: E402

JOBS = (
    "dgxc-v25.04-llama31-405b-2048gpu-bf16",
    "dgxc-v25.04-llama31-405b-2048gpu-fp8",
    "dgxc-v25.02-nemotron4-15b-64gpu-bf16",
    "dgxc-v25.02-nemotron4-15b-64gpu-fp8",
    "dgxc-v25.04-nemotron4-15b-64gpu-bf16",
    "dgxc-v25.04-nemotron4-15b-64gpu-fp8",
)
"""NVIDIA's tuned Llama 3.1 405B on 2,048 H100s and Nemotron-4 15B on 64 H100s (issue 32). The
Nemotron-4 job twice: as NeMo 24.12 ran it (v25.02: tp4, micro-batch 4) and as NVIDIA retuned it
for the next release (v25.04, NeMo 25.02.01: tp2, micro-batch 2, measured 3.3% faster in FP8)."""
LAYOUT = ("dp", "tp", "pp", "cp", "virtual_stages", "micro_batch")
RESULTS = Path(__file__).resolve().parent / "results" / "nvidia_layouts.json"


def model_error(gpus: int) -> float:
    """Leave-one-source-out MAPE of Megatron runs of this scale, as recommend reports it
    (planner.uncertainty, from benchmarks/accuracy_frameworks.py --loo)."""
    return error_band("megatron", gpus).mape


def check(case) -> dict:
    row = case.row
    nvidia = estimate(case.spec, case.hardware, case.config, gpus=row["gpus"], options=case.options)
    rec = recommend(
        case.spec,
        case.hardware,
        gpus=row["gpus"],
        global_batch=row["global_batch"],
        seq=row["seq"],
        precision=row["precision"],
        framework="megatron",
        options=case.options,
    )
    plan, pick_s = rec.best["plan"], float(rec.best["prediction"]["step_time_s"])
    nvidia_s = float(nvidia.step_time_s)
    gain = 1.0 - pick_s / nvidia_s
    error = model_error(row["gpus"])
    same = all(int(plan[k]) == int(row[k]) for k in LAYOUT)
    verdict = "NVIDIA's layout" if same else ("within error" if gain <= error else "beats")
    return {
        "id": case.id,
        "gpus": row["gpus"],
        "precision": row["precision"],
        "nvidia": {k: row[k] for k in LAYOUT},
        "pick": {k: plan[k] for k in (*LAYOUT, "schedule", "zero", "recompute")},
        "measured_s": case.measured_s,
        "nvidia_predicted_s": nvidia_s,
        "nvidia_error": nvidia_s / case.measured_s - 1.0,
        "pick_predicted_s": pick_s,
        "predicted_gain": gain,
        "model_error": error,
        "verdict": verdict,
    }


def layout(d: dict) -> str:
    return "dp{dp} tp{tp} pp{pp} cp{cp} v{virtual_stages} mb{micro_batch}".format(**d)


def main() -> None:
    cases = {c.id: c for c in published_rows.load(("megatron",))}
    rows = [check(cases[job]) for job in JOBS]
    print(
        f"{'job':40} {'NVIDIA layout':28} {'its error':>9} {'pick':28} {'gain':>6} {'error':>6}"
        "  verdict"
    )
    for r in rows:
        print(
            f"{r['id']:40} {layout(r['nvidia']):28} {r['nvidia_error']:+9.1%} "
            f"{layout(r['pick']):28} "
            f"{r['predicted_gain']:6.1%} {r['model_error']:6.1%}  {r['verdict']}"
        )
    RESULTS.write_text(json.dumps({"jobs": rows}, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
