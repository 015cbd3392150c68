"""Soak and reproducer of the intermittent native crash of `planner run` (issue 31): the 8-rank gpt2
verification dp2 x tp2 x pp2, ZeRO-3, interleaved 1F1B (v=2), torchtitan, 3 AdamW steps with
--verify, run N times in a row with every core kept busy by CPU burners (busy loops at normal
priority), stopping at the first failure unless --keep-going. No run is ever relaunched.

    python tests/adversarial/reproduce_native_crash.py --runs 20 --burners 2 --out /tmp/soak

Each run's stdout, stderr and work folder (rank logs) go under --out; OUT/soak.json (rewritten after
every run, so a stopped soak keeps what it measured) holds the command, the machine and one record
per run (verdict, exit code, seconds, load averages, the error line). A rank that dies of
SIGSEGV/SIGABRT is named in the one-line error with the innermost Python call of its crashing thread
(planner.executor.faults.native_crash_site); its rank-N.log holds faulthandler's full stack of
every thread. Prints one line per run and a table at the end; exits 0 only when every run passed.
Not a pytest test (a run takes 3-9 minutes on 2 loaded cores)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
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
    parser.add_argument(
        "--keep-going", action="store_true", help="run all --runs even after a failure"
    )
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


def _command(plan: Path, args, run: int) -> list[str]:
    return [
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
    ]


def _verdict(done: subprocess.CompletedProcess) -> bool:
    try:
        return done.returncode == 0 and json.loads(done.stdout)["verify"]["passed"]
    except (ValueError, KeyError, TypeError):
        return False


def _runs(plan: Path, args) -> int:
    import torch

    report = {
        "what": "8-rank gpt2 verification (dp2 x tp2 x pp2, ZeRO-3, interleaved 1F1B v=2, "
        "torchtitan), no relaunch",
        "command": " ".join(_command(plan, args, 0)).replace("work-0", "work-N"),
        "layout": LAYOUT,
        "steps": args.steps,
        "burners": args.burners,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "runs": [],
    }
    failed = 0
    for run in range(1, args.runs + 1):
        t0, load0 = time.monotonic(), os.getloadavg()[0]
        done = subprocess.run(_command(plan, args, run), capture_output=True, text=True, cwd=ROOT)
        seconds, load1 = time.monotonic() - t0, os.getloadavg()[0]
        (args.out / f"run-{run}.json").write_text(done.stdout)
        (args.out / f"run-{run}.err").write_text(done.stderr)
        passed = _verdict(done)
        failed += not passed
        last = (done.stderr.strip().splitlines() or [""])[-1]
        report["runs"].append(
            {
                "run": run,
                "passed": passed,
                "exit_code": done.returncode,
                "seconds": round(seconds, 1),
                "load1_start": round(load0, 2),
                "load1_end": round(load1, 2),
                "error": "" if passed else last,
            }
        )
        report["passed"] = sum(r["passed"] for r in report["runs"])
        report["in_a_row"] = failed == 0
        (args.out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
        print(
            f"run {run}: {'passed' if passed else 'FAILED'} exit {done.returncode} in "
            f"{seconds:.0f} s (load {load0:.1f} -> {load1:.1f}) {'' if passed else last}",
            flush=True,
        )
        if not passed and not args.keep_going:
            break
    _table(report)
    return 0 if failed == 0 and len(report["runs"]) == args.runs else 1


def _table(report: dict) -> None:
    print(f"{'run':>4} {'verdict':<7} {'exit':>4} {'seconds':>8} {'load':>11}  error")
    for r in report["runs"]:
        print(
            f"{r['run']:>4} {'passed' if r['passed'] else 'FAILED':<7} {r['exit_code']:>4} "
            f"{r['seconds']:>8.0f} {r['load1_start']:>5.1f}-{r['load1_end']:<5.1f}  {r['error']}"
        )
    print(f"{report['passed']}/{len(report['runs'])} passed, {report['burners']} burners")


if __name__ == "__main__":
    sys.exit(main())
