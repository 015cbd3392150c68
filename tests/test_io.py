"""planner.io: one reader for every JSON input, one atomic writer for every output, strict JSON."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import ConfigError
from planner.io import (
    MAX_JSON_DEPTH,
    check_writable,
    dumps_strict,
    non_finite,
    read_json,
    write_bytes,
    write_json,
    write_text,
)


def _file(tmp_path, content, name="in.json"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.mark.parametrize(
    "content,needle",
    [
        ("", "file is empty"),
        (" \n\t", "file is empty"),
        (b"\xff\xfe{}", "not UTF-8 text (byte 0)"),
        ('{"a": 1,, }', "not valid JSON (line 1 column 9"),
        ("[1, 2]", "expected a JSON object, found an array"),
        ('"text"', "expected a JSON object, found a string"),
        ("null", "expected a JSON object, found null"),
        ('{"a": {"b": NaN}}', "a.b=nan is invalid: allowed a finite number"),
        ('{"a": [1, Infinity]}', "a[1]=inf is invalid"),
        ('{"a": -Infinity}', "a=-inf is invalid"),
        ('{"a": 1e400}', "a=inf is invalid"),  # beyond a double: read as infinity
        (
            "[" * 100_000 + "]" * 100_000,
            f"nested deeper than {MAX_JSON_DEPTH} levels",
        ),  # RecursionError in json
        ('{"a":' * 100_000 + "1" + "}" * 100_000, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        (
            '{"a":' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1),
            "nested deeper",
        ),  # parses, still refused
    ],
)
def test_every_bad_json_file_is_one_config_error_naming_the_file(tmp_path, content, needle):
    path = _file(tmp_path, content)
    with pytest.raises(ConfigError) as err:
        read_json(path, "plan")
    message = str(err.value)
    assert message.startswith(f"plan {path}: ") and needle in message and "\n" not in message


def test_nesting_up_to_the_limit_is_read(tmp_path):
    depth = MAX_JSON_DEPTH
    path = _file(tmp_path, '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1))
    data = read_json(path, "plan")
    for _ in range(depth - 1):
        data = data["a"]
    assert data == {}


def test_unreadable_paths_name_the_reason(tmp_path):
    with pytest.raises(ConfigError, match=r"not a readable file \(No such file or directory\)"):
        read_json(tmp_path / "missing.json", "hardware profile")
    with pytest.raises(ConfigError, match=r"not a readable file \(Is a directory\)"):
        read_json(tmp_path, "config.json")


def test_dumps_strict_refuses_non_finite_numbers_and_names_where():
    for bad in (float("nan"), float("inf"), -float("inf"), np.float32("nan"), np.float64("inf")):
        doc = {"prediction": {"time_breakdown_s": {"compute": 1.0, "bubble": bad}}, "rows": [1, 2]}
        with pytest.raises(
            ConfigError,
            match=r"prediction\.time_breakdown_s\.bubble is (nan|inf|-inf), not a finite",
        ):
            dumps_strict(doc, "--json output")
    with pytest.raises(ConfigError, match=r"rows\[1\]\[0\] is nan"):
        dumps_strict({"rows": [[1.0], [np.nan]]}, "report.json")
    with pytest.raises(ConfigError, match=r"a\[1\] is nan"):
        dumps_strict({"a": np.array([1.0, np.nan])}, "report.json")


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=5),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=4), children, max_size=4)
        ),
        max_leaves=30,
    )
)
def test_dumps_strict_round_trips_every_finite_document(document):
    assert json.loads(dumps_strict(document, "x")) == document
    assert next(non_finite(document), None) is None


def test_numpy_values_become_plain_numbers():
    text = dumps_strict(
        {"a": np.int64(3), "b": np.float32(0.5), "c": np.arange(3), "d": np.bool_(True)},
        "x",
        indent=None,
    )
    assert json.loads(text) == {"a": 3, "b": 0.5, "c": [0, 1, 2], "d": True}


def test_write_replaces_atomically_and_keeps_the_permissions(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    write_json(target, {"a": 1}, "--out")
    assert json.loads(target.read_text()) == {"a": 1}
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary file left
    fresh = write_text(tmp_path / "new.txt", "x", "--out")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_non_finite_document_writes_nothing_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text('{"old": true}')
    with pytest.raises(ConfigError, match="step_time_s is inf"):
        write_json(target, {"step_time_s": float("inf")}, "--out")
    assert target.read_text() == '{"old": true}' and len(list(tmp_path.iterdir())) == 1


def test_a_symbolic_link_is_followed_not_replaced(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_json(link, {"a": 1}, "--out")
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: d / "missing" / "x.json", "does not exist"),
        (lambda d: d, "is a directory; give a file name"),
        (lambda d: d / "file.txt" / "x.json", "is not a directory"),
    ],
)
def test_unwritable_paths_are_one_line(tmp_path, make, needle):
    (tmp_path / "file.txt").write_text("")
    path = make(tmp_path)
    for call in (lambda: check_writable(path, "--out"), lambda: write_bytes(path, b"x", "--out")):
        with pytest.raises(ConfigError) as err:
            call()
        assert (
            needle in str(err.value)
            and str(err.value).startswith("--out ")
            and "\n" not in str(err.value)
        )


def test_a_read_only_directory_is_refused(tmp_path):
    if os.geteuid() == 0:
        path = "/sys/planner-test.json"  # root writes anywhere but here (sysfs refuses new files)
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        os.chmod(ro, 0o555)
        path = ro / "x.json"
    with pytest.raises(ConfigError, match="not writable"):
        write_bytes(path, b"x", "--out")


def test_special_files_are_written_in_place():
    write_bytes("/dev/null", b"discarded", "--out")
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_an_endless_or_huge_input_is_refused_without_reading_it_all(tmp_path):
    from planner.io import MAX_JSON_BYTES

    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.write(b'{"a": "' + b"x" * MAX_JSON_BYTES + b'"}')
    with pytest.raises(ConfigError, match="larger than"):
        read_json(big, "plan")


@pytest.mark.parametrize(
    "path,kind",
    [("/dev/zero", "a character device"), ("/dev/full", "a character device"), ("fifo", "a FIFO")],
)
def test_a_device_or_fifo_is_refused_before_it_is_opened(tmp_path, path, kind):
    """A FIFO would block open() forever and a device never ends (--out /dev/full grew to 16 GB once)."""
    if path == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    with pytest.raises(ConfigError) as err:
        read_json(path, "plan")
    assert str(err.value) == f"plan {path}: is {kind}, not a regular file; expected a JSON file"


def test_an_output_that_may_exist_is_read_only_when_there(tmp_path):
    from planner.io import read_json_if_exists

    assert read_json_if_exists(tmp_path / "none.json", "--out") is None
    assert read_json_if_exists(_file(tmp_path, '{"a": 1}'), "--out") == {"a": 1}
    with pytest.raises(ConfigError, match="expected a JSON object, found an array"):
        read_json_if_exists(_file(tmp_path, "[1, 2]"), "--out")


def test_a_fifo_nobody_reads_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO that no process reads"):
        write_bytes(fifo, b"x", "--out")


def test_a_fifo_with_a_reader_is_written_in_place(tmp_path):
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = os.open(
        fifo, os.O_RDONLY | os.O_NONBLOCK
    )  # a reader holds it open, as `cat fifo` would
    thread = threading.Thread(target=lambda: got.append(write_bytes(fifo, b"hello", "--out")))
    thread.start()
    thread.join(10)
    assert os.read(reader, 100) == b"hello" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    os.close(reader)


def test_check_writable_probes_the_directory_and_leaves_nothing(tmp_path):
    target = check_writable(tmp_path / "out.json", "--out")
    assert target == tmp_path / "out.json" and list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="not writable"):  # root too: sysfs refuses new files
        check_writable("/sys/planner-test.json", "--out")
