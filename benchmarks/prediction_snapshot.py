"""The prediction snapshot: what `estimate` and `recommend` predict for a fixed set of configurations,
kept as a golden file (tests/golden/predictions.json) that a refactor must leave identical.

The configurations are every published row the benchmarks predict (benchmarks/published_rows.py: six
collections, four stacks, A100 to GB200, BF16 / FP8, cp and ep, 8 to 16,384 GPUs, every run option a
row sets) and a dozen searches (RECOMMENDS: each stack, dense and MoE, every objective). A change that
moves a prediction on purpose (a new cost term, a refit) rewrites the file with `--write` in the same
commit and says why.

    .venv/bin/python benchmarks/prediction_snapshot.py           # compare, print what moved
    .venv/bin/python benchmarks/prediction_snapshot.py --write   # rewrite the golden file
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.published_rows import load  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.run_options import RunOptions  # noqa: E402
from planner.search import recommend  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "predictions.json"
PUBLISHED_FILES = ("megatron", "torchtitan", "fsdp", "deepspeed", "features", "moe")
RELATIVE_TOLERANCE = 1e-9
"""Two floats are the same prediction when they agree to 1e-9 relative (summation order only)."""
ABSOLUTE_TOLERANCE = 1e-12
"""... or to 1e-12 absolute: a term that is exactly zero in one summation order is a residue of
1e-14 s in another (the timeline's idle time of a one-stage step); every quantity of a prediction
(seconds, bytes, fractions) is many orders of magnitude above it."""

RUN_OPTION_NAMES = frozenset(f.name for f in fields(RunOptions))

RECOMMENDS: tuple[dict[str, Any], ...] = (
    dict(model="gpt3-175b", hardware="p4d.24xlarge", gpus=960, global_batch=1536),
    dict(
        model="gpt3-175b",
        hardware="p4d.24xlarge",
        gpus=960,
        global_batch=1536,
        objective="time-to-train",
        tokens=300e9,
    ),
    dict(model="gpt3-13b", hardware="p4d.24xlarge", gpus=64, objective="cost"),
    dict(model="llama3-8b", hardware="p5.48xlarge", gpus=32, framework="torchtitan"),
    dict(model="llama3-8b", hardware="p5.48xlarge", gpus=64, framework="fsdp", precision="bf16"),
    dict(model="llama3-70b", hardware="dgx-h100", gpus=64, framework="deepspeed"),
    dict(model="llama3-70b", hardware="dgx-h100", gpus=128, objective="memory"),
    dict(
        model="llama3-405b",
        hardware="p5.48xlarge",
        gpus=16384,
        seq=131072,
        global_batch=128,
        precision="fp8",
    ),
    dict(
        model="llama2-13b",
        hardware="dgx-a100-80g",
        gpus=8,
        framework="megatron",
        recompute_modules=("core_attn",),
        loss="fused",
    ),
    dict(model="mixtral-8x7b", hardware="p5.48xlarge", gpus=64, framework="megatron"),
    dict(model="qwen3-30b-a3b", hardware="dgx-h100", gpus=32, moe_dispatcher="deepep"),
    dict(model="qwen3-235b-a22b", hardware="p5.48xlarge", gpus=256, framework="torchtitan"),
    dict(model="gpt2", hardware="p3.16xlarge", gpus=8, framework="deepspeed", precision="amp-fp16"),
    dict(
        model="megatron-18b",
        hardware="gb200-nvl72",
        gpus=144,
        precision="fp8",
        fp8_scaling="delayed",
    ),
)
"""Searches across stacks, precisions, objectives, dense and MoE, 8 to 16,384 GPUs."""


def _compact(prediction: dict) -> dict:
    """The parts of a plan's prediction a refactor must keep: step time and its terms, memory (and per
    rank), the expert-parallel account."""
    kept = {k: prediction[k] for k in ("step_time_s", "time_breakdown_s", "memory")}
    kept["peak_bytes_per_rank"] = [r["peak_bytes_per_gpu"] for r in prediction["memory_per_rank"]]
    if "expert_parallel" in prediction:
        kept["expert_parallel"] = prediction["expert_parallel"]
    return kept


def estimates() -> Iterator[tuple[str, Any]]:
    """(row id, compact prediction or the refusal's message) of every published row."""
    for case in load(PUBLISHED_FILES):
        if case.error:
            yield case.id, {"unusable": case.error}
            continue
        try:
            est = estimate(
                case.spec, case.hardware, case.config, gpus=case.row["gpus"], options=case.options
            )
        except PlannerError as e:
            yield case.id, {"refused": str(e)}
            continue
        yield case.id, _compact(est.to_document()["prediction"])


def _search_key(kwargs: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in kwargs.items())


def searches() -> Iterator[tuple[str, Any]]:
    """(search key, the top three plans with their predictions and the search's counters)."""
    for kwargs in RECOMMENDS:
        kw = dict(kwargs)
        options = RunOptions(**{k: kw.pop(k) for k in list(kw) if k in RUN_OPTION_NAMES})
        rec = recommend(kw.pop("model"), kw.pop("hardware"), top=3, options=options, **kw)
        plans = [rec.best, *rec.alternatives]
        search = {k: v for k, v in rec.best["search"].items() if k != "seconds"}
        yield (
            _search_key(kwargs),
            {
                "plans": [
                    {
                        "plan": d["plan"],
                        "software": d["software"],
                        "prediction": _compact(d["prediction"]),
                    }
                    for d in plans
                ],
                "search": search,
            },
        )


def snapshot() -> dict:
    return {"estimate": dict(estimates()), "recommend": dict(searches())}


def differences(golden: Any, now: Any, path: str = "") -> Iterator[str]:
    """Every path where `now` differs from `golden` (floats within RELATIVE_TOLERANCE are equal)."""
    if isinstance(golden, dict) and isinstance(now, dict):
        for key in sorted(set(golden) | set(now)):
            where = f"{path}/{key}"
            if key not in now:
                yield f"{where}: gone"
            elif key not in golden:
                yield f"{where}: new"
            else:
                yield from differences(golden[key], now[key], where)
    elif isinstance(golden, list) and isinstance(now, list) and len(golden) == len(now):
        for i, (g, n) in enumerate(zip(golden, now)):
            yield from differences(g, n, f"{path}[{i}]")
    elif _numbers(golden, now):
        if not math.isclose(golden, now, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE):
            yield f"{path}: {golden!r} -> {now!r}"
    elif golden != now:
        yield f"{path}: {golden!r} -> {now!r}"


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _normalized(document: dict) -> dict:
    """The snapshot as the golden file holds it (JSON round trip: tuples become lists)."""
    return json.loads(json.dumps(document))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help="rewrite tests/golden/predictions.json"
    )
    args = parser.parse_args(argv)
    now = _normalized(snapshot())
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(
            f"wrote {GOLDEN.relative_to(ROOT)}: {len(now['estimate'])} estimates, "
            f"{len(now['recommend'])} searches"
        )
        return 0
    moved = list(differences(json.loads(GOLDEN.read_text()), now))
    for line in moved[:50]:
        print(line)
    print(f"{len(moved)} differences from {GOLDEN.relative_to(ROOT)}")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
