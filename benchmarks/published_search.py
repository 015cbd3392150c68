"""Search on the published runs: is the planner's best at least as fast as the published configuration,
and is the published configuration within 10 % of it (or does `explain` say what beats it)?

For each row of validation/published_runs.json (Megatron-LM on NVIDIA Selene, profile
`dgx-a100-80g`), the published configuration is predicted with estimate() and the search runs on the
same GPUs, global batch, sequence and precision, with the same software properties the accuracy
benchmark uses (benchmarks/accuracy_published.py: unfused attention with dropout, gradient reduction
after the backward). Both numbers come from the same cost model, so the check is about the search, not
the model's accuracy. Writes benchmarks/results/published_search.json.

Run: .venv/bin/python benchmarks/published_search.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.accuracy_published import config_of, load_rows, spec_of  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.explain import compare, describe_config  # noqa: E402
from planner.search import recommend  # noqa: E402
from planner.run_options import RunOptions

SOFTWARE = RunOptions(attention="unfused", dropout=True, overlap_grad_reduce=False)
"""What the published runs ran (see benchmarks/accuracy_published.py)."""
WITHIN = 0.10
RESULTS = Path(__file__).resolve().parent / "results" / "published_search.json"


def check(row: dict) -> dict:
    hw = load_profile(row["hardware"])
    spec, cfg = spec_of(row), config_of(row)
    published = estimate(spec, hw, cfg, gpus=row["gpus"], options=SOFTWARE).to_document()
    rec = recommend(
        spec,
        hw,
        gpus=row["gpus"],
        global_batch=row["global_batch"],
        seq=row["arch"]["seq"],
        precision=row["precision"],
        top=3,
        framework="megatron",
        options=SOFTWARE,
    )
    best = rec.best
    t_best, t_pub = best["prediction"]["step_time_s"], published["prediction"]["step_time_s"]
    gap = t_pub / t_best - 1
    out = {
        "id": row["id"],
        "gpus": row["gpus"],
        "global_batch": row["global_batch"],
        "measured_s": row["iteration_time_s"],
        "published_predicted_s": t_pub,
        "best_predicted_s": t_best,
        "published_slower_by": gap,
        "published_fits": published["prediction"]["memory"]["fits"],
        "best_at_least_as_fast": t_best <= t_pub * (1 + 1e-9),
        "within_10pct": gap <= WITHIN,
        "best_plan": describe_config(best["plan"]),
        "published_plan": describe_config(published["plan"]),
        "candidates_evaluated": rec.stats.candidates_evaluated,
        "search_s": rec.stats.seconds,
    }
    if gap > WITHIN:
        out["explain"] = compare(best, published, label="published")
    return out


def main() -> None:
    results = []
    print(
        f"{'run':<36} {'measured':>8} {'pub pred':>8} {'best':>8} {'pub slower':>10} {'fits':>5} {'scored':>8} "
        f"{'search s':>8}  best plan"
    )
    for row in load_rows():
        r = check(row)
        results.append(r)
        print(
            f"{r['id']:<36} {r['measured_s']:>8.2f} {r['published_predicted_s']:>8.2f} {r['best_predicted_s']:>8.2f} "
            f"{r['published_slower_by']:>10.1%} {str(r['published_fits']):>5} {r['candidates_evaluated']:>8,} "
            f"{r['search_s']:>8.2f}  {r['best_plan']}"
        )
        for line in r.get("explain", []):
            print("    " + line.strip())
    ok_fast = all(r["best_at_least_as_fast"] for r in results)
    ok_close = all(r["within_10pct"] or r.get("explain") for r in results)
    print(
        f"best at least as fast as published in every row: {ok_fast}; "
        f"published within 10% or explained: {ok_close} "
        f"({sum(r['within_10pct'] for r in results)}/{len(results)} within 10%)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "rows": results,
                "best_at_least_as_fast": ok_fast,
                "within_10pct_or_explained": ok_close,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
