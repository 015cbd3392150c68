"""Predicted vs measured single-H100 training steps (validation/h100_train_steps.jsonl).

Each row is a Hugging Face causal LM (configs in validation/hf_configs/, read by
planner.hf_config) trained on one H100 80GB in eager PyTorch: SDPA attention, HF's fp32 loss
upcast, fused AdamW, dropout active where the config has it, optional per-layer gradient
checkpointing (-> recompute 'full'). The planner predicts it with `estimate()` on the `fsdp` framework profile (Hugging Face modules) and the
`dgx-h100` profile, world size 1. Compared: peak memory against torch.cuda.max_memory_allocated,
fit/OOM, and step time for steps of >= 8192 tokens (smaller ones are launch-bound; reported, not
judged).

Run: .venv/bin/python benchmarks/accuracy_h100.py [STEPS.jsonl]   (writes benchmarks/results/accuracy_h100.json;
HF configs are looked up as hf_configs/<model>.json beside the validation file)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from cost_models.compute import short_benchmark
from hardware_profiles import load_profile
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.sources import resolve_model

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "validation"
"""Vendored validation data (validation/README.md gives its provenance)."""
RESULTS = ROOT / "benchmarks" / "results" / "accuracy_h100.json"
TIMED_MIN_TOKENS = 8192


def load_rows(path: Path = VALIDATION / "h100_train_steps.jsonl") -> list[dict]:
    return [
        r
        for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
        if r.get("kind") == "train_step"
    ]


def predict(row: dict, hw) -> dict:
    config = VALIDATION / "hf_configs" / f"{row['model']}.json"
    spec = resolve_model(str(config), seq=row["seq"])
    cfg = ParallelConfig(
        micro_batch=row["micro_batch"],
        global_batch=row["micro_batch"],
        seq=row["seq"],
        precision=row["precision"],
        recompute="full" if row["checkpointing"] else "none",
        schedule="1f1b",
        framework="fsdp",
    )
    # Each step was timed over a few iterations on one idle H100: boost clock, not a training run's sustained one.
    est = estimate(
        spec, short_benchmark(hw), cfg, gpus=1
    )  # dropout and attention: the config's (estimate's defaults)
    return {
        "step_time_s": est.step_time_s,
        "peak_bytes": est.peak_bytes_per_gpu,
        "fits": est.fits,
        "params": est.params,
    }


def evaluate(rows: list[dict], hw) -> dict:
    out = []
    for r in rows:
        p = predict(r, hw)
        measured_ok = r["status"] == "ok"
        rec = {
            "model": r["model"],
            "precision": r["precision"],
            "seq": r["seq"],
            "micro_batch": r["micro_batch"],
            "checkpointing": r["checkpointing"],
            "tokens": r["seq"] * r["micro_batch"],
            "measured_ok": measured_ok,
            "predicted_fits": bool(p["fits"]),
            "fit_right": bool(p["fits"]) == measured_ok,
            "params_measured": r["params"],
            "params_predicted": p["params"],
            "predicted_step_s": p["step_time_s"],
            "predicted_peak_bytes": p["peak_bytes"],
        }
        if measured_ok:
            rec["measured_step_s"] = r["step_ms_median"] / 1e3
            rec["measured_peak_bytes"] = r["peak_allocated_bytes"]
            rec["memory_error"] = p["peak_bytes"] / r["peak_allocated_bytes"] - 1
            rec["time_error"] = p["step_time_s"] / rec["measured_step_s"] - 1
            rec["time_judged"] = rec["tokens"] >= TIMED_MIN_TOKENS
        out.append(rec)
    ok = [x for x in out if x["measured_ok"]]
    timed = [x for x in ok if x["time_judged"]]
    summary = {
        "rows": len(out),
        "fit_right": sum(x["fit_right"] for x in out),
        "median_abs_memory_error": statistics.median(abs(x["memory_error"]) for x in ok),
        "max_abs_memory_error": max(abs(x["memory_error"]) for x in ok),
        "timed_rows": len(timed),
        "median_abs_time_error": statistics.median(abs(x["time_error"]) for x in timed),
        "max_abs_time_error": max(abs(x["time_error"]) for x in timed),
        "median_abs_time_error_all_rows": statistics.median(abs(x["time_error"]) for x in ok),
    }
    return {"rows": out, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    files = [a for a in argv if not a.startswith("--")]
    hw = load_profile("dgx-h100")
    result = evaluate(load_rows(Path(files[0])) if files else load_rows(), hw)
    print(
        f"{'model':12} {'prec':8} {'seq':>5} {'mb':>3} {'ckpt':>4} {'mem GB':>7} {'pred':>7} {'err':>6} "
        f"{'step ms':>8} {'pred':>8} {'err':>6}"
    )
    for x in result["rows"]:
        if not x["measured_ok"]:
            print(
                f"{x['model']:12} {x['precision']:8} {x['seq']:5} {x['micro_batch']:3} OOM measured, predicted fits={x['predicted_fits']}"
            )
            continue
        mark = "" if x["time_judged"] else " (untimed)"
        print(
            f"{x['model']:12} {x['precision']:8} {x['seq']:5} {x['micro_batch']:3} {str(x['checkpointing'])[0]:>4} "
            f"{x['measured_peak_bytes'] / 1e9:7.2f} {x['predicted_peak_bytes'] / 1e9:7.2f} {x['memory_error'] * 100:+5.1f}% "
            f"{x['measured_step_s'] * 1e3:8.1f} {x['predicted_step_s'] * 1e3:8.1f} {x['time_error'] * 100:+5.1f}%{mark}"
        )
    s = result["summary"]
    print(
        f"\nfit/OOM right: {s['fit_right']}/{s['rows']}; median |memory error| {s['median_abs_memory_error'] * 100:.1f}% "
        f"(max {s['max_abs_memory_error'] * 100:.1f}%); median |step time error| over {s['timed_rows']} steps of "
        f">= {TIMED_MIN_TOKENS} tokens {s['median_abs_time_error'] * 100:.1f}% (max {s['max_abs_time_error'] * 100:.1f}%)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
