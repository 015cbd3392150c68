"""Install each framework's validator into its own folder (pip --no-deps --target) and run it.

Every target gets a separate site folder (tests/validators/site/<target>, or $PLANNER_VALIDATORS_SITE)
because SageMaker SDK v2 and v3 both are the `sagemaker` package and megatron-core 0.19.2 is a
Python 3.12 wheel. `--no-deps --target` never touches the virtual environment, so torch 2.13.0 stays;
the frameworks import the environment's torch, numpy, pydantic, typing_extensions, rich, yaml.
Each validator runs in a subprocess (tests/validators/check_<target>.py) with only its folder on
PYTHONPATH, so no shim leaks into the test process; that process serves every call of the session
for its target (_serve.py), so the framework is imported once.

The framework releases are pinned here and in pyproject.toml's `validate` extra (a test checks they agree).
If pip cannot install a set (no network, a pin gone), the test that needs it fails with pip's message:
nothing is skipped.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SITE_ROOT = Path(os.environ.get("PLANNER_VALIDATORS_SITE", HERE / "site"))

FRAMEWORKS = {
    "torchtitan": "torchtitan==0.3.0",
    "megatron": "megatron-core==0.19.2",
    "fsdp": "accelerate==1.15.0",
    "fsdp-transformers": "transformers==5.23.0",
    "deepspeed": "deepspeed==0.19.8",
    "sagemaker": "sagemaker-train==1.27.0",
    "sagemaker-v1": "sagemaker==2.257.7",
}
"""The release each exporter targets (docs/exports.md)."""

_SDK_DEPS = [
    "boto3==1.44.5",
    "botocore==1.44.5",
    "s3transfer==0.19.3",
    "urllib3==2.8.0",
    "jmespath==1.1.0",
    "importlib_metadata==10.2.0",
    "lazy_importer==0.1.0",
    "platformdirs==4.14.7",
    "six==1.17.0",
]
INSTALL = {
    # target: (requirements, extra pip options); dependencies are the ones each import really needs
    "torchtitan": (
        [
            FRAMEWORKS["torchtitan"],
            "tyro==1.0.17",
            "docstring_parser==0.18.0",
            "shtab==1.13.0",
            "typeguard==4.6.0",
            "spmd_types==0.2.3",
            "tensorboard==2.21.0",
            "protobuf==7.36.2",
            "torchdata==0.11.0",
            "tokenizers==0.23.3",
            "torchao==0.18.0",
        ],
        [],
    ),
    # megatron-core 0.19.2 (the first wheels with megatron/training) requires Python >= 3.12; its
    # training/arguments.py and what it imports compile under 3.11, so the 3.12 wheel is unpacked here
    "megatron": (
        [FRAMEWORKS["megatron"]],
        ["--python-version", "3.12", "--only-binary=:all:", "--ignore-requires-python"],
    ),
    # an sdist whose setup.py imports torch: build against the environment's torch, no isolation
    "deepspeed": (
        [
            FRAMEWORKS["deepspeed"],
            "hjson==3.1.0",
            "py-cpuinfo==9.0.0",
            "msgpack==1.2.4",
            "psutil==7.2.2",
            "ninja==1.13.2",
            "einops==0.8.2",
        ],
        ["--no-build-isolation"],
    ),
    # Accelerate's launcher and FSDP plugin, transformers' TrainingArguments and model classes; the rest is
    # what importing them needs (huggingface-hub 2.x brings its httpx2 client)
    "fsdp": (
        [
            FRAMEWORKS["fsdp"],
            FRAMEWORKS["fsdp-transformers"],
            "huggingface-hub==2.4.0",
            "safetensors==0.8.0",
            "psutil==7.2.2",
            "regex==2026.11.15",
            "httpx2==2.16.2",
            "httpcore2==2.16.2",
            "h11==0.16.0",
            "idna==3.20",
            "truststore==0.10.5",
        ],
        [],
    ),
    "sagemaker": (
        [
            FRAMEWORKS["sagemaker"],
            "sagemaker-core==2.27.0",
            "requests==2.34.2",
            "idna==3.20",
            "certifi==2026.10.18",
            *_SDK_DEPS,
        ],
        [],
    ),
    "sagemaker-v1": ([FRAMEWORKS["sagemaker-v1"]], []),
}


def site(target: str) -> Path:
    """The folder with the target's validator packages, installed on first use."""
    requirements, options = INSTALL[target]
    folder = SITE_ROOT / target
    stamp = folder / ".planner-installed"
    wanted = json.dumps([requirements, options])
    if stamp.exists() and stamp.read_text().splitlines()[0] == wanted:
        return folder
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--upgrade",
        "--target",
        str(folder),
        *options,
        *requirements,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(
            f"cannot install the {target} validator ({' '.join(requirements[:1])}): "
            f"{(done.stderr or done.stdout).strip()[-1500:]}",
            pytrace=False,
        )
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    stamp.write_text(
        f"{wanted}\ninstalled in {time.perf_counter() - t0:.1f} s, {size / 2**20:.0f} MiB\n"
    )
    return folder


class _Validator:
    """One target's check script as a long-lived process (_serve.py): a request is one JSON line on
    its stdin, the answer the next PLANNER-RESULT line on its stdout; its stderr goes to a file."""

    def __init__(self, target: str):
        folder = site(target)
        script = HERE / f"check_{target.replace('-', '_')}.py"
        env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONWARNINGS": "ignore"}
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ask(self, items: list[dict], timeout: float) -> list[dict] | None:
        """The results, or None when the process ended or did not answer within `timeout`."""
        try:
            self.proc.stdin.write(json.dumps(items) + "\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith("PLANNER-RESULT "):
                return json.loads(line.removeprefix("PLANNER-RESULT "))

    def failure(self) -> str:
        """Why it gave no answer: its exit code and the end of its stderr (it is stopped first)."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        self.stderr.seek(0)
        return f"exit {code}): {self.stderr.read().strip()[-2000:]}"

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


_RUNNING: dict[str, _Validator] = {}


@atexit.register
def _close_all() -> None:
    while _RUNNING:
        _RUNNING.popitem()[1].close()


def validate(target: str, items: list[dict]) -> list[dict]:
    """Run tests/validators/check_<target>.py on `items`; one result per item ({"ok": ..., ...}).
    The target's process is started on first use and serves every later call of the session."""
    validator = _RUNNING.get(target)
    if validator is None or validator.proc.poll() is not None:
        validator = _RUNNING[target] = _Validator(target)
    results = validator.ask(items, timeout=900)
    if results is None:
        del _RUNNING[target]
        pytest.fail(
            f"the {target} validator did not run ({validator.failure()}",
            pytrace=False,
        )
    assert len(results) == len(items)
    return results
