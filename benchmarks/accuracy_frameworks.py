"""Predicted vs published step time of training runs on every software stack, by framework, source and
feature (validation/published/*.json; format in validation/published/FORMAT.md).

Each row is predicted with `planner.estimate` on the framework it ran (`megatron`, `torchtitan`,
`fsdp`, `deepspeed`) with only what the row states: its model, hardware, degrees, batch, schedule,
ZeRO stage and shard group, recompute, precision, attention kernel and the software facts in its
`extras` (benchmarks/published_rows.py turns a row into estimate's inputs). Printed per framework and
per source: rows, MAPE, mean signed error, worst row; rows refused (a plan the framework cannot run or
the cost model does not cost) and rows that trained but are predicted not to fit, both of which must
be zero. Per feature (context parallelism, FP8, hybrid sharding, mixture of experts, sequences of 32K
tokens or more) the same over the rows that use it.

`--loo` re-predicts every row with the physical parameters of benchmarks/calibrate_frameworks.py (linearized refit)
fitted without the row's whole source (leave-one-source-out), the figure to quote for accuracy on
runs the fit has not seen.

Run: .venv/bin/python benchmarks/accuracy_frameworks.py [--files megatron,fsdp,...] [--rows] [--loo]
Writes benchmarks/results/accuracy_frameworks.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import planner.estimate  # noqa: E402
from benchmarks import published_rows as R  # noqa: E402
from benchmarks.calibrate_frameworks import leave_one_source_out  # noqa: E402
from benchmarks.stack_predictions import Result, groups, predict, table, unique  # noqa: E402
from planner.uncertainty import SCALE_BANDS, scale_band  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "accuracy_frameworks.json"
DEFAULT_FILES = (*R.STACK_FILES, "features")


def memory_summary(results: list[Result]) -> dict:
    """Per framework and memory kind: the runs whose publication measured memory, MAPE, mean and worst."""
    by = {}
    for r in results:
        if r.memory_error is not None:
            by.setdefault(f"{r.framework} ({r.memory_kind})", []).append(r)
    out = {}
    for key, rs in sorted(by.items()):
        worst = max(rs, key=lambda r: abs(r.memory_error))
        out[key] = {
            "rows": len(rs),
            "mape": statistics.fmean(abs(r.memory_error) for r in rs),
            "mean": statistics.fmean(r.memory_error for r in rs),
            "worst": worst.memory_error,
            "worst_id": worst.id,
        }
    return out


def scale_bands(results: list[Result], loo_results: list[Result] | None = None) -> dict:
    """Per stack and GPU-count band: rows, MAPE and mean in sample and, with `loo_results`, leaving each source out."""
    held = {r.id: r for r in loo_results or ()}
    out = {}
    for fw in sorted({r.framework for r in results}):
        for name, _ in SCALE_BANDS:  # planner.uncertainty owns the bands recommend reports
            mine = [
                r
                for r in results
                if r.framework == fw
                and r.gpus > 0
                and scale_band(r.gpus) == name
                and r.error is not None
            ]
            if not mine:
                continue
            row = {
                "rows": len(mine),
                "mape": statistics.fmean(abs(r.error) for r in mine),
                "mean": statistics.fmean(r.error for r in mine),
            }
            out_errs = [
                held[r.id].error for r in mine if r.id in held and held[r.id].error is not None
            ]
            if out_errs:
                row.update(
                    loo_mape=statistics.fmean(abs(e) for e in out_errs),
                    loo_mean=statistics.fmean(out_errs),
                )
            out[f"{fw} {name}"] = row
    return out


def band_table(bands: dict) -> str:
    lines = [
        "By stack and scale (GPUs): step-time MAPE in sample and leaving each source out",
        f"{'':28} {'rows':>4} {'MAPE':>7} {'mean':>8} {'LOO MAPE':>9} {'LOO mean':>9}",
    ]
    for key, b in bands.items():
        loo = f"{100 * b['loo_mape']:8.1f}% {100 * b['loo_mean']:+8.1f}%" if "loo_mape" in b else ""
        lines.append(
            f"{key:28} {b['rows']:4} {100 * b['mape']:6.1f}% {100 * b['mean']:+7.1f}% {loo}"
        )
    return "\n".join(lines)


def run(files=DEFAULT_FILES, *, loo: bool = False, rows: bool = False, write: bool = True) -> dict:
    loaded = R.load(files)
    cases = unique(loaded)
    results = [predict(c) for c in cases]
    print(
        f"{len(loaded)} rows in {', '.join(files)}; {len(loaded) - len(cases)} repeat a run listed earlier "
        f"and are counted once"
    )
    report = {
        "files": list(files),
        "in_sample": groups(results),
        "rows": [
            {
                "id": r.id,
                "source": r.source,
                "framework": r.framework,
                "gpus": r.gpus,
                "measured_s": r.measured_s,
                "predicted_s": r.predicted_s,
                "error": r.error,
                "fits": r.fits,
                "refused": r.refused,
            }
            for r in results
        ],
    }
    print(table("Published runs: predicted vs measured step time (all rows)", report["in_sample"]))
    oom = [r for r in results if not r.trained]
    missed = [r.id for r in oom if r.fits]
    report["ran_out_of_memory"] = {"rows": len(oom), "predicted_to_fit": missed}
    print(
        f"runs that ran out of memory: {len(oom)}; predicted to fit anyway: {len(missed)}"
        + (f" ({', '.join(missed)})" if missed else "")
    )
    report["memory"] = memory_summary(results)
    for key, s in report["memory"].items():
        print(
            f"memory, {key}: {s['rows']} runs, MAPE {100 * s['mape']:.1f}%, mean {100 * s['mean']:+.1f}%, "
            f"worst {100 * s['worst']:+.1f}% ({s['worst_id']})"
        )
    if loo:
        loo_results = leave_one_source_out(cases)
        report["leave_one_source_out"] = groups(loo_results)
        print()
        print(
            table(
                "Leave one source out (parameters fitted without the row's source)",
                report["leave_one_source_out"],
            )
        )
    report["scale_bands"] = scale_bands(results, loo_results if loo else None)
    print()
    print(band_table(report["scale_bands"]))
    if rows:
        print()
        for r in sorted(results, key=lambda r: (r.framework, r.source, r.id)):
            err = (
                "refused: " + r.refused
                if r.refused
                else f"{100 * r.error:+6.1f}%"
                if r.error is not None
                else "-"
            )
            print(
                f"{r.framework:10} {r.id:60} {err}{'' if r.fits in (None, True) else '  (predicted not to fit)'}"
            )
    if write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--files", default=",".join(DEFAULT_FILES), help="collections under validation/published/"
    )
    ap.add_argument(
        "--loo", action="store_true", help="also leave one source out (refit without it)"
    )
    ap.add_argument("--rows", action="store_true", help="print every row's error")
    ap.add_argument(
        "--step-model",
        choices=("timeline", "closed"),
        default=None,
        help="what estimate() reads the step off (planner.estimate.STEP_MODEL; default: as shipped)",
    )
    args = ap.parse_args(argv)
    if args.step_model:
        planner.estimate.STEP_MODEL = args.step_model
    run(tuple(f for f in args.files.split(",") if f), loo=args.loo, rows=args.rows)


if __name__ == "__main__":
    main()
