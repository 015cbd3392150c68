"""Predicted vs measured iteration time of published Megatron-LM runs (validation/published_runs.json).

Every row is a GPT run on NVIDIA Selene (DGX A100 80GB, profile `dgx-a100-80g`) with the exact
configuration of its paper; the planner predicts it with `estimate()` on the `megatron` framework profile. These runs
predate flash attention in Megatron (fused scale-mask-softmax, dropout 0.1 on attention and
residuals), and Megatron-LM's local DDP reduced gradients after the backward, so `attention='unfused',
dropout=True, overlap_grad_reduce=False`: properties of the software the rows ran, the same for every
row. Prints a table and the summary errors; `--loo` also prints the leave-one-out check of the
fitted parameters (A100_KEYS, which benchmarks/calibrate.py stores); writes benchmarks/results/accuracy_published.json.

Run: .venv/bin/python benchmarks/accuracy_published.py [ROWS.json] [--loo]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.efficiency_fit import fit_keys, with_eff  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.parallel import ParallelConfig  # noqa: E402
from planner.spec import TransformerSpec  # noqa: E402
from planner.run_options import RunOptions  # noqa: E402

VALIDATION = ROOT / "validation"
"""Vendored validation data (validation/README.md gives its provenance)."""
RESULTS = ROOT / "benchmarks" / "results" / "accuracy_published.json"


def load_rows(path: Path = VALIDATION / "published_runs.json") -> list[dict]:
    data = json.loads(path.read_text())
    return data.get("runs") or data.get("rows")


ARCH_KEYS = (
    "model_type",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "seq",
    "position",
    "gated_mlp",
    "activation",
    "norm",
    "tied_embeddings",
    "qkv_bias",
    "out_bias",
    "mlp_bias",
)


def spec_of(row: dict) -> TransformerSpec:
    """The row's architecture (GPT defaults: learned positions, tied embeddings, GeLU MLP)."""
    a = {k: v for k, v in row["arch"].items() if k in ARCH_KEYS}
    a.setdefault("model_type", "gpt2")
    a.setdefault("position", "learned")
    a.setdefault("tied_embeddings", True)
    return TransformerSpec(name=row["id"], **a)


def config_of(row: dict) -> ParallelConfig:
    v = row.get("virtual_stages", 1)
    return ParallelConfig(
        dp=row["dp"],
        tp=row["tp"],
        pp=row["pp"],
        micro_batch=row["micro_batch"],
        global_batch=row["global_batch"],
        virtual_stages=v,
        schedule=row.get("schedule") or ("interleaved-1f1b" if v > 1 else "1f1b"),
        zero=row.get("zero", 0),
        recompute=row.get("recompute", "none"),
        sequence_parallel=row.get("sequence_parallel", False),
        precision=row.get("precision", "amp-fp16"),
        seq=row["arch"]["seq"],
        framework=row.get("framework", "megatron"),
    )


def predict(row: dict, hw):
    """Megatron-LM of 2021-22 unless the row says otherwise (keys flash_attention, dropout,
    overlap_grad_reduce)."""
    return estimate(
        spec_of(row),
        hw,
        config_of(row),
        gpus=row["gpus"],
        options=RunOptions(
            attention="flash" if row.get("flash_attention", False) else "unfused",
            dropout=row.get("dropout", True),
            overlap_grad_reduce=row.get("overlap_grad_reduce", False),
        ),
    )


A100_KEYS = {"gemm_efficiency_max": (0.4, 1.0)}
"""The efficiency keys fitted to the published runs (benchmarks/calibrate.py stores the fit)."""


def predict_s(row: dict, hw) -> float:
    """The row's predicted step time in seconds."""
    return predict(row, hw).step_time_s


def fit_a100(hw, rows=None, predict_s=predict_s) -> dict:
    """A100_KEYS fitted to `rows` (default: all published runs)."""
    return fit_keys(A100_KEYS, hw, rows or load_rows(), predict_s, lambda r: r["iteration_time_s"])


def leave_one_out_published(rows, hw) -> dict:
    """Refit without each row, predict it. The folds share one memo of (row, efficiency block) ->
    predicted step time: every fold starts from the same point and takes the same finite-difference
    step there, so a fifth of the timeline simulations repeat (the numbers are the same)."""
    memo: dict = {}

    def memo_predict_s(r, h) -> float:
        key = (id(r), json.dumps(h.efficiency, sort_keys=True))
        if key not in memo:
            memo[key] = predict_s(r, h)
        return memo[key]

    errs = []
    for i, r in enumerate(rows):
        fitted = fit_a100(hw, rows[:i] + rows[i + 1 :], memo_predict_s)
        pred = memo_predict_s(r, with_eff(hw, fitted))
        errs.append({"id": r["id"], "fitted": fitted, "error": pred / r["iteration_time_s"] - 1})
    a = [abs(e["error"]) for e in errs]
    return {"rows": errs, "mape": statistics.fmean(a), "max_abs_error": max(a)}


def evaluate(rows: list[dict], hw) -> dict:
    """Each row on its own `hardware` profile when it names one (else `hw`)."""
    out = []
    for r in rows:
        est = predict(r, load_profile(r["hardware"]) if r.get("hardware") else hw)
        out.append(
            {
                "id": r["id"],
                "gpus": r["gpus"],
                "tp": r["tp"],
                "pp": r["pp"],
                "dp": r["dp"],
                "virtual_stages": r.get("virtual_stages", 1),
                "recompute": r["recompute"],
                "sequence_parallel": r["sequence_parallel"],
                "measured_s": r["iteration_time_s"],
                "predicted_s": est.step_time_s,
                "error": est.step_time_s / r["iteration_time_s"] - 1,
                "predicted_tflops_per_gpu": est.tflops_per_gpu,
                "measured_tflops_per_gpu": r.get("tflops_per_gpu"),
                "predicted_peak_bytes_per_gpu": est.peak_bytes_per_gpu,
                "fits": est.fits,
                "breakdown_s": est.time_breakdown_s(),
            }
        )
    errs = [abs(x["error"]) for x in out]
    return {
        "rows": out,
        "summary": {"rows": len(out), "mape": statistics.fmean(errs), "max_abs_error": max(errs)},
    }


def print_table(result: dict) -> None:
    print(
        f"{'run':36} {'GPUs':>5} {'measured s':>10} {'predicted':>10} {'error':>7}  {'TFLOP/s':>7} {'fits':>5}"
    )
    for x in result["rows"]:
        print(
            f"{x['id']:36} {x['gpus']:5} {x['measured_s']:10.2f} {x['predicted_s']:10.2f} {x['error'] * 100:+6.1f}%"
            f"  {x['predicted_tflops_per_gpu']:7.1f} {str(x['fits']):>5}"
        )
    s = result["summary"]
    print(
        f"\nMAPE {s['mape'] * 100:.1f}% over {s['rows']} runs; max |error| {s['max_abs_error'] * 100:.1f}%"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    files = [a for a in argv if not a.startswith("--")]
    rows = load_rows(Path(files[0])) if files else load_rows()
    hw = load_profile(rows[0].get("hardware", "dgx-a100-80g"))
    result = evaluate(rows, hw)
    print_table(result)
    if "--loo" in argv:
        result["leave_one_out"] = leave_one_out_published(rows, hw)
        loo = result["leave_one_out"]
        print(
            f"leave-one-out (refit without each row, predict it): MAPE {loo['mape'] * 100:.1f}%, "
            f"max |error| {loo['max_abs_error'] * 100:.1f}%"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
