"""Reproducer of the intermittent native crash of `planner run` (issue 31, item 6): the 8-rank gpt2
verification dp2 x tp2 x pp2, ZeRO-3, interleaved 1F1B (v=2), torchtitan, 3 AdamW steps with
--verify, run N times in a row with every core kept busy by CPU burners, stopping at the first
failure.

    python tests/adversarial/reproduce_native_crash.py --runs 20 --burners 2 --out /tmp/crash

Each run's stdout, stderr and work folder (rank logs) go under --out. A rank that dies of
SIGSEGV/SIGABRT is named in the one-line error with the innermost Python call of its crashing thread
(planner.executor.faults.native_crash_site); its rank-N.log holds faulthandler's full stack of
every thread. Prints one line per run and exits 0 only when every run passed. Not a pytest test (a
run takes 1-6 minutes on 2 loaded cores)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from executor_plans import write_plan  # noqa: E402
from planner.parallel import ParallelConfig  # noqa: E402

LAYOUT = dict(
    seq=32,
    precision="fp32",
    dp=2,
    tp=2,
    pp=2,
    zero=3,
    schedule="interleaved-1f1b",
    virtual_stages=2,
    global_batch=4,
    micro_batch=1,
    placement="DPT",
    framework="torchtitan",
)


def _burn() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--burners", type=int, default=2, help="busy-loop processes beside the runs"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plan = write_plan(args.out / "plan.json", ParallelConfig(**LAYOUT), "gpt2")
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    try:
        return _runs(plan, args)
    finally:
        for burner in burners:
            burner.terminate()


def _runs(plan: Path, args) -> int:
    for run in range(1, args.runs + 1):
        t0 = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "planner",
                "run",
                str(plan),
                "--steps",
                str(args.steps),
                "--verify",
                "--json",
                "--workdir",
                str(args.out / f"work-{run}"),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        (args.out / f"run-{run}.json").write_text(done.stdout)
        (args.out / f"run-{run}.err").write_text(done.stderr)
        verdict = (
            "passed"
            if done.returncode == 0 and json.loads(done.stdout)["verify"]["passed"]
            else "FAILED"
        )
        last = done.stderr.strip().splitlines()[-1:] or [""]
        print(
            f"run {run}: {verdict} exit {done.returncode} in {time.monotonic() - t0:.0f} s "
            f"{last[0]}",
            flush=True,
        )
        if verdict != "passed":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
