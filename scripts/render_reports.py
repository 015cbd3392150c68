#!/usr/bin/env python3
"""Generate the committed example reports and screenshot each one in headless Chromium.

    .venv/bin/python scripts/render_reports.py              # generate + screenshot all examples
    .venv/bin/python scripts/render_reports.py --only llama3-8b-p5 --no-generate

Each example is written to reports/<name>/ (report.html, report.md, figures/) by the `planner
report` command, then Chromium renders report.html offline to reports/<name>/screenshot.png.
Chromium: `apt-get update && apt-get install -y chromium` if it is missing.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES: dict[str, list[str]] = {
    # The SageMaker scenario: GPT-3 175B on 120 p4d.24xlarge (960 A100-40GB), global batch 1536,
    # 300B tokens as GPT-3 (Brown et al. 2020).
    "gpt3-175b-120xp4d": ["gpt3-175b", "--hardware", "p4d.24xlarge", "--gpus", "960", "--global-batch", "1536",
                          "--train-tokens", "300e9", "--scaling-nodes", "30,60,120,240"],
    # The Latent Space scenario: 16 nodes of 8 GPUs, a model of a few billion parameters (GPT-3 6.7B,
    # its batch of 2M tokens = 1024 sequences of 2048, Brown et al. 2020 Table 2.1).
    "gpt3-6.7b-16xp4d": ["gpt3-6.7b", "--hardware", "p4d.24xlarge", "--nodes", "16", "--global-batch", "1024",
                         "--train-tokens", "300e9", "--scaling-nodes", "2,4,8,16,32"],
    # Llama-3-8B on one p5.48xlarge (8 H100-80GB), 4M-token batches of 8192-token sequences, a
    # compute-optimal 160B tokens (20 tokens per parameter, Hoffmann et al. 2022).
    "llama3-8b-1xp5": ["llama3-8b", "--hardware", "p5.48xlarge", "--gpus", "8", "--global-batch", "512",
                       "--seq", "8192", "--train-tokens", "160e9", "--scaling-nodes", "1,2,4,8"],
}

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--window-size=1280,4000"]


def generate(name: str, args: list[str]) -> None:
    out = ROOT / "reports" / name
    cmd = [sys.executable, "-m", "planner", "report", *args, "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"{name}: generated in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def screenshot(name: str) -> Path:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("chromium not found: apt-get update && apt-get install -y chromium")
    out = ROOT / "reports" / name
    png = out / "screenshot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                        (out / "report.html").as_uri()], check=True, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not png.is_file() or png.stat().st_size == 0:
        raise SystemExit(f"{name}: chromium wrote no screenshot")
    print(f"{name}: screenshot {png} ({png.stat().st_size:,} bytes)", file=sys.stderr)
    return png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(EXAMPLES), help="example(s) to process")
    parser.add_argument("--no-generate", action="store_true", help="only screenshot existing reports")
    args = parser.parse_args()
    for name in args.only or EXAMPLES:
        if not args.no_generate:
            generate(name, EXAMPLES[name])
        screenshot(name)


if __name__ == "__main__":
    main()
