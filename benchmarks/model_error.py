"""The model's measured error by stack and scale, as recommend ships it (planner/data/model_error.json).

Reads the leave-one-source-out MAPE that benchmarks/accuracy_frameworks.py --loo recorded in
benchmarks/results/accuracy_frameworks.json (per stack, and per scale band: <= 512, 513-4,096,
> 4,096 GPUs), and that benchmarks/accuracy_moe.py recorded for the mixture-of-experts runs in
benchmarks/results/accuracy_moe.json (over all of them and per scale band), and writes the table
recommend reads to say how far a plan's step can be trusted and which plans it cannot tell apart
(planner.uncertainty). Re-run after every accuracy run; tests/test_uncertainty.py checks the shipped
file equals what this derives from the recorded results.

Run: .venv/bin/python benchmarks/model_error.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.uncertainty import scale_band  # noqa: E402

ACCURACY = ROOT / "benchmarks" / "results" / "accuracy_frameworks.json"
MOE_ACCURACY = ROOT / "benchmarks" / "results" / "accuracy_moe.json"
SHIPPED = ROOT / "planner" / "data" / "model_error.json"


def derive(accuracy: dict, moe_accuracy: dict) -> dict:
    """{"frameworks": {framework: {"all", "rows", "bands": {band: {"mape", "rows"}}}}, "moe": the
    same over the mixture-of-experts runs} from the recorded accuracy results."""
    out: dict = {}
    for name, stats in accuracy["leave_one_source_out"]["framework"].items():
        out[name] = {"all": round(stats["mape"], 4), "rows": stats["predicted"], "bands": {}}
    for key, stats in accuracy["scale_bands"].items():
        name, band = key.split(" ", 1)
        out[name]["bands"][band] = {"mape": round(stats["loo_mape"], 4), "rows": stats["rows"]}
    return {
        "about": "Leave-one-source-out MAPE of the step time on published runs, by stack and "
        "scale band (benchmarks/accuracy_frameworks.py --loo), and over the mixture-of-experts "
        "runs (benchmarks/accuracy_moe.py); written by benchmarks/model_error.py.",
        "frameworks": out,
        "moe": moe_errors(moe_accuracy),
    }


def moe_errors(moe_accuracy: dict) -> dict:
    """The leave-one-source-out MAPE of the MoE runs, over all and per scale band."""
    rows = [r for r in moe_accuracy["rows"] if r.get("loo_error") is not None]
    by_band: dict[str, list[float]] = {}
    for r in rows:
        by_band.setdefault(scale_band(r["gpus"]), []).append(abs(r["loo_error"]))
    return {
        "all": round(moe_accuracy["loo_mape"], 4),
        "rows": len(rows),
        "bands": {
            band: {"mape": round(statistics.fmean(errors), 4), "rows": len(errors)}
            for band, errors in by_band.items()
        },
    }


def main() -> None:
    document = derive(json.loads(ACCURACY.read_text()), json.loads(MOE_ACCURACY.read_text()))
    SHIPPED.write_text(json.dumps(document, indent=1) + "\n")
    named = [*document["frameworks"].items(), ("MoE runs", document["moe"])]
    for name, stats in named:
        bands = ", ".join(f"{b} {s['mape']:.1%}" for b, s in stats["bands"].items())
        print(f"{name:11} all {stats['all']:.1%}  {bands}")
    print(f"wrote {SHIPPED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
