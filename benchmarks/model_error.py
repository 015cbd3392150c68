"""The model's measured error by stack and scale, as recommend ships it (planner/data/model_error.json).

Reads the leave-one-source-out MAPE that benchmarks/accuracy_frameworks.py --loo recorded in
benchmarks/results/accuracy_frameworks.json (per stack, and per scale band: <= 512, 513-4,096,
> 4,096 GPUs) and writes the table recommend reads to say which plans it cannot tell apart
(planner.uncertainty). Re-run after every accuracy run; tests/test_uncertainty.py checks the shipped
file equals what this derives from the recorded results.

Run: .venv/bin/python benchmarks/model_error.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCURACY = ROOT / "benchmarks" / "results" / "accuracy_frameworks.json"
SHIPPED = ROOT / "planner" / "data" / "model_error.json"


def derive(accuracy: dict) -> dict:
    """{framework: {"all": mape, "bands": {band: {"mape", "rows"}}}} from the accuracy results."""
    out: dict = {}
    for name, stats in accuracy["leave_one_source_out"]["framework"].items():
        out[name] = {"all": round(stats["mape"], 4), "rows": stats["predicted"], "bands": {}}
    for key, stats in accuracy["scale_bands"].items():
        name, band = key.split(" ", 1)
        out[name]["bands"][band] = {"mape": round(stats["loo_mape"], 4), "rows": stats["rows"]}
    return {
        "about": "Leave-one-source-out MAPE of the step time on published runs, by stack and "
        "scale band (benchmarks/accuracy_frameworks.py --loo); written by "
        "benchmarks/model_error.py.",
        "frameworks": out,
    }


def main() -> None:
    document = derive(json.loads(ACCURACY.read_text()))
    SHIPPED.write_text(json.dumps(document, indent=1) + "\n")
    for name, stats in document["frameworks"].items():
        bands = ", ".join(f"{b} {s['mape']:.1%}" for b, s in stats["bands"].items())
        print(f"{name:11} all {stats['all']:.1%}  {bands}")
    print(f"wrote {SHIPPED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
