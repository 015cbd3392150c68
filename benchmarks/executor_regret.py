"""Regret of the planner's top pick, measured: run every feasible plan of a small model on 4 local
ranks and compare the planner's ranking with the measured step times.

    .venv/bin/python -m benchmarks.executor_regret [--hardware cpu-local] [--steps 4] [--out FILE]

The candidate set is the planner's own search (planner.search.recommend) over a space narrowed to
what a 2-core CPU box can time in minutes: dp/tp/pp over 4 ranks, micro-batch 1-2, schedules 1F1B
and interleaved 1F1B (v=2), no ZeRO/recompute/offload/SP, placement DPT; every feasible candidate
is returned (top = all), each is run with `planner.executor` and its step time measured as the
slowest rank's mean over the steps after the first. Reported:
  - the measured rank of the planner's top pick (1 = fastest measured),
  - its regret: measured(top pick) / min(measured) - 1 (target <= 10 %),
  - Spearman's rank correlation of predicted and measured step times (scipy.stats.spearmanr).
Results go to benchmarks/results/executor_regret.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from planner.candidates import SearchSpace
from planner.executor import ExecutorError
from planner.executor.runspec import build_run_spec
from planner.search import recommend

MODEL = "planner.executor.tiny:gpt_small"
RESULTS = Path(__file__).parent / "results" / "executor_regret.json"


def candidate_documents(hardware: str, *, gpus: int, global_batch: int, seq: int) -> list[dict]:
    """Every feasible plan of the narrowed space, best predicted first (plan documents)."""
    # optional heavy dependency: planner.executor.tiny imports torch at its top
    from planner.executor.tiny import gpt_small

    spec = gpt_small().spec
    space = SearchSpace(
        schedules=("1f1b", "interleaved-1f1b"),
        max_virtual_stages=2,
        zero=(0,),
        recompute=("none",),
        offload=("none",),
        sequence_parallel=(False,),
        placements=("DPT",),
        max_micro_batch=2,
    )
    found = recommend(
        spec,
        hardware,
        gpus=gpus,
        global_batch=global_batch,
        seq=seq,
        precision="fp32",
        optimizer="adamw",
        top=10_000,
        space=space,
    )
    docs = [dict(found.best), *map(dict, found.alternatives)]
    for doc in docs:
        doc["model"] = dict(doc["model"], name=MODEL)
    return docs


def measure(doc: dict, *, steps: int, workdir: Path) -> dict:
    """Run one plan document; the slowest rank's mean step time after the first step."""
    # optional heavy dependency: planner.executor.launch imports torch at its top
    from planner.executor.launch import launch_local

    plan_path = workdir / "plan.json"
    plan_path.write_text(json.dumps(doc))
    spec = build_run_spec(plan_path, steps=steps)
    t0 = time.perf_counter()
    try:
        result = launch_local(spec, workdir=workdir / "run")
    except ExecutorError as err:
        return {"measured_step_time_s": None, "error": str(err), "wall_s": time.perf_counter() - t0}
    per_rank = [
        sum(r["step_times_s"][1:]) / max(1, len(r["step_times_s"]) - 1) for r in result.ranks
    ]
    return {
        "measured_step_time_s": max(per_rank),
        "per_rank_step_time_s": per_rank,
        "wall_s": result.wall_s,
        "losses": result.ranks[0]["losses"],
    }


def summarize(rows: list[dict]) -> dict:
    """Rank of the top pick (row 0: best predicted), its regret, Spearman over the measured rows."""
    from scipy.stats import spearmanr

    ok = [r for r in rows if r["measured_step_time_s"] is not None]
    if not ok or rows[0]["measured_step_time_s"] is None:
        return {"error": "the top pick or every plan failed to run", "measured": len(ok)}
    fastest = min(r["measured_step_time_s"] for r in ok)
    pick = rows[0]["measured_step_time_s"]
    measured_rank = 1 + sum(r["measured_step_time_s"] < pick for r in ok)
    rho = spearmanr(
        [r["predicted_step_time_s"] for r in ok], [r["measured_step_time_s"] for r in ok]
    )
    return {
        "plans_measured": len(ok),
        "plans_failed": len(rows) - len(ok),
        "top_pick_measured_rank": measured_rank,
        "top_pick_regret": pick / fastest - 1.0,
        "regret_target": 0.10,
        "spearman_rho": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
        "fastest_measured": next(r["plan"] for r in ok if r["measured_step_time_s"] == fastest),
        "top_pick": rows[0]["plan"],
    }


def short(plan: dict) -> str:
    return (
        f"dp{plan['dp']} tp{plan['tp']} pp{plan['pp']} mb{plan['micro_batch']} {plan['schedule']}"
        f"{'/v' + str(plan['virtual_stages']) if plan['virtual_stages'] > 1 else ''}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--hardware", default="cpu-local", help="profile name or path (calibrated on this machine)"
    )
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-plans", type=int, default=0, help="run only the first N plans (0: all)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    docs = candidate_documents(
        args.hardware, gpus=args.gpus, global_batch=args.global_batch, seq=args.seq
    )
    if args.max_plans:
        docs = docs[: args.max_plans]
    rows = []
    with tempfile.TemporaryDirectory(prefix="planner-regret-") as tmp:
        for i, doc in enumerate(docs):
            work = Path(tmp) / f"plan-{i}"
            work.mkdir()
            row = {
                "plan": doc["plan"],
                "predicted_step_time_s": doc["prediction"]["step_time_s"],
                **measure(doc, steps=args.steps, workdir=work),
            }
            rows.append(row)
            got = row["measured_step_time_s"]
            print(
                f"[{i + 1}/{len(docs)}] {short(doc['plan']):40s} predicted {row['predicted_step_time_s']:.4f} s  "
                f"measured {got if got is None else round(got, 4)} s",
                file=sys.stderr,
                flush=True,
            )
    summary = summarize(rows)
    result = {
        "benchmark": "executor_regret",
        "model": MODEL,
        "hardware": args.hardware,
        "gpus": args.gpus,
        "global_batch": args.global_batch,
        "seq": args.seq,
        "steps": args.steps,
        "load_average_1m_before_after": [load_before[0], os.getloadavg()[0]],
        "cpu_count": os.cpu_count(),
        "summary": summary,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
