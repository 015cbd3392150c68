"""Every file the planner reads or writes passes through here (docs/cli-contract.md, "Errors").

Reading: `read_json(path, what)` returns the JSON object in a file, or raises one `ConfigError`
line naming the file for everything that can be wrong with it: unreadable (missing, a directory,
no permission), larger than `MAX_JSON_BYTES`, not UTF-8, empty, malformed, NaN/Infinity or a number
beyond a double (strict JSON, RFC 8259 Sec. 6, has neither; the error names the key), nested deeper
than `MAX_JSON_DEPTH`, or not an object.

Writing: `write_text` / `write_bytes` / `write_json` replace a file atomically (a temporary file in
the same directory, then `os.replace`, so a reader never sees half a file and a failed write leaves
the old one), refusing in one line a missing parent directory, a read-only directory or a path that
is a directory. `dumps_strict` is the one JSON encoder of outputs: numpy scalars and arrays become
plain numbers, and a NaN or an infinity is an error naming where it is, never written
(`allow_nan=False`; Python's default would write the invalid tokens NaN and Infinity).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from planner.errors import ConfigError

MAX_JSON_BYTES = 64 * 2**20
"""Largest input file read: plans, hardware profiles and Hugging Face configs are kilobytes."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays/objects accepted in an input file. Plans, hardware profiles and Hugging
Face configs nest at most about 5 levels; the limit keeps every later recursive walk (schema
validation, copies) far from Python's recursion limit."""


# ------------------------------------------------------------------------------------------ reading


def read_json(path: str | Path, what: str) -> dict:
    """The JSON object in `path`; `what` ('plan', 'hardware profile', ...) names the file in errors.

    >>> read_json("/nonexistent/plan.json", "plan")
    Traceback (most recent call last):
    ...
    planner.errors.ConfigError: plan /nonexistent/plan.json: not a readable file (No such file or directory)
    """

    def fail(problem: str) -> ConfigError:
        return ConfigError(what, str(path), "a JSON object", message=f"{what} {path}: {problem}")

    kind = special_kind(path)
    if kind:  # a FIFO would block open(); a device never ends
        raise fail(f"is {kind}, not a regular file; expected a JSON file")
    try:
        with open(path, "rb") as handle:  # bounded: /dev/zero or a stray dump cannot exhaust memory
            raw = handle.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise fail(f"larger than {MAX_JSON_BYTES // 2**20} MiB; not a {what}")
        text = raw.decode("utf-8")
    except OSError as err:
        raise fail(f"not a readable file ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise fail(f"not UTF-8 text (byte {err.start}); expected a JSON document") from None
    if not text.strip():
        raise fail("file is empty; expected a JSON object")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise fail(
            f"not valid JSON (line {err.lineno} column {err.colno}: {err.msg}); "
            f"expected a JSON document"
        ) from None
    except RecursionError:
        raise fail(f"nested deeper than {MAX_JSON_DEPTH} levels; expected a JSON object") from None
    if depth_exceeds(data, MAX_JSON_DEPTH):
        raise fail(f"nested deeper than {MAX_JSON_DEPTH} levels; expected a JSON object")
    if not isinstance(data, dict):
        raise fail(f"expected a JSON object, found {_json_type(data)}")
    bad = next(non_finite(data), None)  # NaN, Infinity, or 1e400 (read as infinity)
    if bad is not None:
        raise fail(
            f"{bad[0]}={bad[1]!r} is invalid: allowed a finite number (strict JSON has no NaN or Infinity)"
        )
    return data


def special_kind(path: str | Path) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a directory ('a FIFO', 'a
    character device', ...); None otherwise. Every reader refuses such a path before opening it."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "a special file")


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_json_if_exists(path: str | Path, what: str) -> dict | None:
    """`read_json(path, what)`, or None when nothing is at `path` (an output a command may merge
    into: a malformed or special file there is the same one-line error, before any work starts)."""
    if not os.path.lexists(path):
        return None
    return read_json(path, what)


def _json_type(value: Any) -> str:
    return {
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays/objects in `value` nest more than `limit` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return False


def numbers(value: Any, where: str = "") -> Iterator[tuple[str, float | int]]:
    """(dotted path, number) of every number (bools excluded; numpy scalars as Python numbers) in
    nested dicts/lists/tuples, in document order, without recursion."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend(
                (v, f"{at}.{k}" if at else str(k)) for k, v in reversed(list(item.items()))
            )
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, (str, bytes, bool)) or item is None:
            continue
        elif isinstance(item, (int, float)):
            yield at or "value", item
        elif hasattr(item, "tolist"):  # numpy scalars and arrays, as json writes them
            stack.append((item.tolist(), at))


def non_finite(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every NaN or infinity in `value` (see `numbers`)."""
    return (
        (at, x) for at, x in numbers(value, where) if isinstance(x, float) and not math.isfinite(x)
    )


# ------------------------------------------------------------------------------------------ writing


def _plain(value):
    """numpy scalars and arrays as plain Python numbers and lists (json's `default`)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dumps_strict(document: Any, what: str, *, indent: int | None = 2) -> str:
    """`document` as strict JSON text; a NaN or infinity anywhere is a ConfigError naming its path.

    >>> dumps_strict({"a": [1, 2.5]}, "plan", indent=None)
    '{"a": [1, 2.5]}'
    >>> dumps_strict({"prediction": {"step_time_s": float("inf")}}, "plan")
    Traceback (most recent call last):
    ...
    planner.errors.ConfigError: plan: prediction.step_time_s is inf, not a finite number; strict JSON has no NaN or Infinity, so nothing was written (check the hardware profile's efficiencies and bandwidths)
    """
    try:
        return json.dumps(document, indent=indent, default=_plain, allow_nan=False)
    except ValueError:
        bad = next(non_finite(document), None)
        if bad is None:
            raise
        at, value = bad
        raise ConfigError(
            what,
            value,
            "finite numbers",
            message=f"{what}: {at} is {value}, not a finite number; strict JSON has no NaN or "
            f"Infinity, so nothing was written (check the hardware profile's efficiencies "
            f"and bandwidths)",
        ) from None


def check_finite(document: Any, what: str) -> None:
    """Raise the `dumps_strict` error if `document` holds a NaN or an infinity."""
    bad = next(non_finite(document), None)
    if bad is not None:
        at, value = bad
        raise ConfigError(
            what,
            value,
            "finite numbers",
            message=f"{what}: {at} is {value}, not a finite number (check the hardware profile's "
            f"efficiencies and bandwidths)",
        )


def _unwritable(path: Path, what: str, problem: str) -> ConfigError:
    return ConfigError(what, str(path), "a writable file path", message=f"{what} {path}: {problem}")


def _target(path: str | Path, what: str) -> Path:
    """The file a write to `path` replaces (a symbolic link's target), after the checks a user can fix."""
    path = Path(path)
    if str(path) in ("", "."):
        raise _unwritable(path, what, "is a directory; give a file name")
    if _is_special(path):
        return path  # /dev/stdout, a FIFO: written in place
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise _unwritable(path, what, "is a directory; give a file name")
    parent = path.parent
    if not parent.exists():
        raise _unwritable(path, what, f"cannot write: directory {parent} does not exist")
    if not parent.is_dir():
        raise _unwritable(path, what, f"cannot write: {parent} is not a directory")
    return path


def check_writable(
    path: str | Path, what: str, *, inputs: tuple[tuple[str | Path, str], ...] = ()
) -> Path:
    """Fail early (before a long computation) when `path` clearly cannot be written, or is one of the
    `inputs` ((path, what it is) pairs: the command would overwrite what it reads); returns the
    target. The write itself still reports what this cannot foresee (e.g. a full disk)."""
    target = _target(path, what)
    for source, role in inputs:
        if _same_file(target, source):
            raise _unwritable(
                Path(path), what, f"is the {role} this command reads; write to another file"
            )
    if not _is_special(target):
        _probe_directory(target, what)
    return target


def _probe_directory(target: Path, what: str) -> None:
    """Create and remove a temporary file beside `target`: the one test that also holds for root and
    for read-only file systems (os.access answers yes to root everywhere)."""
    try:
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".probe")
    except OSError as err:
        raise _unwritable(
            target,
            what,
            f"cannot write: directory {target.parent} is not writable ({err.strerror or err})",
        ) from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _is_special(path: Path) -> bool:
    """A device, FIFO or socket (e.g. /dev/stdout): written in place, never replaced."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _open_special(path: Path, what: str):
    """`path` (a device or FIFO) opened for writing in place; a FIFO nobody reads is refused at once
    (ENXIO) instead of blocking forever."""
    flags = os.O_WRONLY | (os.O_NONBLOCK if stat.S_ISFIFO(path.stat().st_mode) else 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise _unwritable(
                path, what, "is a FIFO that no process reads; give a file name"
            ) from None
        raise
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | Path, data: bytes, what: str) -> Path:
    """Replace `path` with `data` atomically; returns the path written. ConfigError (one line) when
    the directory is missing or read-only or the path is a directory."""
    target = _target(path, what)
    if _is_special(target):
        try:
            with _open_special(target, what) as handle:
                handle.write(data)
        except OSError as err:
            raise _unwritable(target, what, f"cannot write ({err.strerror or err})") from None
        return Path(path)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)  # keep the permissions of the file replaced
    except OSError:
        mode = 0o666 & ~_umask()  # what open() would have given a new file
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
    except PermissionError as err:
        raise _unwritable(
            target,
            what,
            f"cannot write: directory {target.parent} is not writable ({err.strerror or err})",
        ) from None
    except OSError as err:
        raise _unwritable(target, what, f"cannot write ({err.strerror or err})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return Path(path)


def write_text(path: str | Path, text: str, what: str) -> Path:
    """`write_bytes` of UTF-8 text."""
    return write_bytes(path, text.encode("utf-8"), what)


def write_json(path: str | Path, document: Any, what: str, *, indent: int | None = 2) -> Path:
    """Strict JSON (`dumps_strict`) written atomically; nothing is written if a number is not finite."""
    return write_text(path, dumps_strict(document, what, indent=indent) + "\n", what)


# -------------------------------------------------------------------------------------- directories


def check_directory(path: str | Path, what: str) -> Path:
    """Fail early, in one line, when `path` cannot be a directory this command writes in: it is a
    file or a special file, or it (or, when it does not exist yet, its nearest existing ancestor) is
    not a writable directory. Creates nothing; returns the path. The one check of --workdir,
    --checkpoint-dir and any other output folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise _not_a_folder(path, what, "is a file, not a directory")
    existing = next(p for p in (path, *path.parents) if p.exists())  # "." or "/" at the latest
    if not existing.is_dir():
        raise _not_a_folder(path, what, f"cannot create it: {existing} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".planner-", suffix=".probe")
    except OSError as err:
        where = (
            "directory is not writable"
            if existing == path
            else f"cannot create it: {existing} is not writable"
        )
        raise _not_a_folder(path, what, f"{where} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)
    return path


def _not_a_folder(path: Path, what: str, problem: str) -> ConfigError:
    return ConfigError(what, str(path), "a writable directory", message=f"{what} {path}: {problem}")


def fresh_subfolder(parent: str | Path, what: str, prefix: str = "run-") -> Path:
    """A new, empty folder inside `parent` (created with its missing parents after
    `check_directory`), named PREFIX + UTC time + a random suffix: a command writing there never
    replaces or removes a file it did not create."""
    parent = check_directory(parent, what)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return Path(tempfile.mkdtemp(prefix=f"{prefix}{stamp}-", dir=parent))
    except OSError as err:
        problem = f"cannot create a folder in it ({err.strerror or err})"
        raise _not_a_folder(parent, what, problem) from None
