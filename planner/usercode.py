"""Running the user's code (a `package.module:factory` MODEL) so that it can neither crash nor hang
the planner (docs/cli-contract.md, "Errors and exit codes").

`user_code(arg, stage, roots)` wraps importing the module, calling the factory and running the
module's forward/backward on the meta device:

- Any exception the user's code raises (SystemExit included) becomes one `UserCodeError` line:
  what failed, the exception, and where: the last frame of the traceback inside the user's module
  (`roots`: its file, or its package's folder), else the last frame outside the planner, torch and
  the standard library. The full trace is kept on the error (`trace`); `planner --traceback` prints it.
- A time limit (`timeout_s()`: `--profile-timeout-s`, else the PLANNER_PROFILE_TIMEOUT_S environment
  variable, else DEFAULT_TIMEOUT_S) interrupts code that does not return: a SIGALRM watchdog
  raises inside whatever Python code is running, so the stack unwinds and the error says where it
  was stuck. Nested guards share the outermost limit. The watchdog needs the main thread of a
  POSIX process (elsewhere there is no limit), and cannot stop a C extension that never returns to
  Python; meta-device tracing runs no such kernels.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import signal
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import Iterator

from planner.errors import ConfigError, PlannerError

DEFAULT_TIMEOUT_S = 300.0
"""Profiling time limit: building and tracing the largest catalog models on meta takes seconds."""
TIMEOUT_ENV = "PLANNER_PROFILE_TIMEOUT_S"
MAX_TIMEOUT_S = 7 * 86400.0
"""A week: longer limits are refused as typos (and setitimer's range is bounded)."""

_override_s: float | None = None
_armed = False


def check_timeout(value: object, field: str) -> float:
    """A positive, finite number of seconds up to MAX_TIMEOUT_S; ConfigError naming `field` otherwise."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (0 < seconds <= MAX_TIMEOUT_S):
        raise ConfigError(
            field,
            value,
            f"a positive number of seconds up to {MAX_TIMEOUT_S:g}, e.g. {DEFAULT_TIMEOUT_S:g}",
        )
    return seconds


def set_timeout_s(seconds: float | None) -> None:
    """The limit for this process (`--profile-timeout-s`); None returns to the environment/default."""
    global _override_s
    _override_s = None if seconds is None else check_timeout(seconds, "--profile-timeout-s")


def timeout_s() -> float:
    """`set_timeout_s`'s value, else PLANNER_PROFILE_TIMEOUT_S (validated), else DEFAULT_TIMEOUT_S."""
    if _override_s is not None:
        return _override_s
    env = os.environ.get(TIMEOUT_ENV)
    if env is not None:
        return check_timeout(env.strip(), TIMEOUT_ENV)
    return DEFAULT_TIMEOUT_S


class UserCodeError(ConfigError):
    """The user's module, factory or forward failed or did not return; `trace` is the full traceback."""

    def __init__(self, arg: str, message: str, trace: str):
        super().__init__(
            "MODEL",
            arg,
            "a factory whose module imports, which returns an nn.Module, and whose "
            "forward/backward run on the meta device",
            message=message,
        )
        self.trace = trace


class _Deadline(BaseException):
    """Raised by the watchdog inside the user's code (BaseException: `except Exception` in it cannot
    swallow it)."""


def _on_alarm(signum, frame):
    if _armed:
        raise _Deadline()


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Arm SIGALRM for `seconds` (restoring any timer and handler already there, e.g. pytest-timeout's);
    a no-op when a limit is already armed, off the main thread, or without setitimer."""
    global _armed
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if _armed or not usable:
        yield
        return
    previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    _armed = True
    try:
        yield
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            left = max(previous_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)


def user_roots(module_name: str) -> tuple[str, ...]:
    """Where the user's code lives, found without running it: the folder of `module_name`'s top-level
    package, or the module's own file (on sys.path, else in the current directory, where
    planner.module_profiler.load_factory also looks); empty when it cannot be found."""
    top = module_name.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return tuple(str(Path(p).resolve()) for p in spec.submodule_search_locations)
    if spec is not None and spec.origin and os.path.isfile(spec.origin):
        return (str(Path(spec.origin).resolve()),)
    here = Path(os.getcwd())
    if (here / top / "__init__.py").is_file() or (here / top).is_dir():
        return (str((here / top).resolve()),)
    if (here / f"{top}.py").is_file():
        return (str((here / f"{top}.py").resolve()),)
    return ()


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {str(Path(__file__).resolve().parent)}
    dirs |= {str(Path(paths[k]).resolve()) for k in ("stdlib", "platstdlib") if k in paths}
    try:
        import torch

        dirs.add(str(Path(torch.__file__).resolve().parent))
    except ImportError:
        pass
    return tuple(dirs)


def _inside(filename: str, roots: tuple[str, ...]) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def where(exc: BaseException, roots: tuple[str, ...]) -> str:
    """'FILE:LINE in FUNCTION' of the last traceback frame inside `roots`, else of the last frame
    outside the planner, torch and the standard library, else of the last frame; a SyntaxError's own
    location first."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")
    ]
    if not frames:
        return "unknown location"
    library = _library_dirs()
    chosen = (
        (next((f for f in reversed(frames) if _inside(f.filename, roots)), None) if roots else None)
        or next((f for f in reversed(frames) if not _inside(f.filename, library)), None)
        or frames[-1]
    )
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def _summary(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit: it called sys.exit({exc.code!r})"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@contextlib.contextmanager
def user_code(arg: str, doing: str, roots: tuple[str, ...] = ()) -> Iterator[None]:
    """Run the block as the user's code (module docstring). `doing` completes 'MODEL=...: {doing}
    failed', e.g. 'importing mymodels', 'the factory', 'its forward/backward on the meta device'."""
    with _time_limit(timeout_s()):
        try:
            yield
        except PlannerError:
            raise
        except _Deadline as exc:
            limit = timeout_s()
            raise UserCodeError(
                arg,
                f"MODEL={arg!r}: {doing} did not return within {limit:g} s (stopped at "
                f"{where(exc, roots)}); if it is only slow, raise the limit with "
                f"--profile-timeout-s or {TIMEOUT_ENV}",
                "".join(traceback.format_exception(exc)),
            ) from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: any failure is bad input
            raise UserCodeError(
                arg,
                f"MODEL={arg!r}: {doing} failed ({_summary(exc)}) at {where(exc, roots)}; "
                f"--traceback shows the full trace",
                "".join(traceback.format_exception(exc)),
            ) from None
