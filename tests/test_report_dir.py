"""`planner report --out DIR` never deletes or overwrites a file it did not write (its manifest,
planner.report.render.MANIFEST), refuses unusable directories in one line, and writes strict JSON."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.report.render import MANIFEST, Figure, ReportContent, Section, write_report

runner = CliRunner()
SMALL = [
    "gpt2",
    "--hardware",
    "p4d.24xlarge",
    "--gpus",
    "16",
    "--global-batch",
    "64",
    "--scaling-nodes",
    "1,2",
]
PNG = b"\x89PNG\r\n\x1a\n"


def _content(*figures: str, data=None) -> ReportContent:
    figs = tuple(
        Figure(name=name, title=name, caption="c", png=PNG + name.encode()) for name in figures
    )
    return ReportContent(
        title="t",
        sections=(Section(title="s", figures=figs),),
        checklist=(),
        data=data if data is not None else {"x": 1},
    )


def _manifest(out) -> list[str]:
    return json.loads((out / MANIFEST).read_text())["files"]


def test_figures_an_earlier_report_wrote_are_replaced_or_removed_and_user_files_kept(tmp_path):
    out = tmp_path / "r"
    write_report(_content("a", "b"), out)
    assert _manifest(out) == [
        "figures/a.png",
        "figures/b.png",
        "report.html",
        "report.json",
        "report.md",
    ]
    (out / "figures" / "mine.png").write_bytes(b"user's own figure")
    (out / "notes.md").write_text("user's notes")
    write_report(_content("a", "c"), out)
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "a.png",
        "c.png",
        "mine.png",
    ]  # b removed
    assert (out / "figures" / "mine.png").read_bytes() == b"user's own figure"
    assert (out / "notes.md").read_text() == "user's notes"
    assert (out / "figures" / "c.png").read_bytes() == PNG + b"c"
    assert "figures/b.png" not in _manifest(out) and "figures/c.png" in _manifest(out)


@pytest.mark.parametrize("name", ["report.md", "report.html", "report.json", "figures/a.png"])
def test_a_file_the_report_did_not_write_is_not_overwritten_without_force(tmp_path, name):
    out = tmp_path / "r"
    (out / "figures").mkdir(parents=True)
    (out / name).write_bytes(b"the user's")
    with pytest.raises(
        ConfigError, match=rf"{name} exists and was not written by planner report; .*--force"
    ):
        write_report(_content("a"), out)
    assert (out / name).read_bytes() == b"the user's" and not (out / MANIFEST).exists()
    write_report(_content("a"), out, force=True)
    assert (out / name).read_bytes() != b"the user's" and name in _manifest(out)


def test_a_manifest_cannot_make_the_report_delete_other_files(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    (out / "keep.txt").write_text("keep")
    (out / MANIFEST).write_text(
        json.dumps({"files": ["../precious.txt", "keep.txt", "/etc/hostname"]})
    )
    write_report(_content("a"), out)
    assert precious.read_text() == "keep" and (out / "keep.txt").read_text() == "keep"


def test_a_corrupt_manifest_owns_nothing(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.md").write_text("mine")
    (out / MANIFEST).write_text("{not json")
    with pytest.raises(ConfigError, match="report.md exists and was not written"):
        write_report(_content("a"), out)


def test_a_non_finite_number_writes_nothing(tmp_path):
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match=r"report.json: rows\[0\].step_time_s is inf"):
        write_report(_content("a", data={"rows": [{"step_time_s": float("inf")}]}), out)
    assert not out.exists()


def test_report_json_is_strict_json(tmp_path):
    out = tmp_path / "r"
    write_report(_content("a", data={"a": [1.5, 2], "b": {"c": None}}), out)
    json.loads((out / "report.json").read_text(), parse_constant=lambda name: pytest.fail(name))


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: d / "missing" / "r", "cannot create it: directory"),
        (lambda d: d / "file.txt", "is a file, not a directory"),
    ],
)
def test_unusable_out_directories_are_one_line_before_any_work(tmp_path, make, needle):
    (tmp_path / "file.txt").write_text("")
    out = make(tmp_path)
    result = runner.invoke(app, ["report", *SMALL, "--out", str(out)])
    lines = result.stderr.strip().splitlines()
    assert (
        result.exit_code == 2 and len(lines) == 1 and needle in lines[0] and str(out) in lines[0]
    ), result.output


def test_a_read_only_out_directory_is_one_line(tmp_path):
    if os.geteuid() == 0:
        out = "/sys/planner-report"  # root may write anywhere but sysfs
    else:
        (tmp_path / "ro").mkdir()
        os.chmod(tmp_path / "ro", 0o555)
        out = str(tmp_path / "ro" / "r")
    result = runner.invoke(app, ["report", *SMALL, "--out", out])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: --out {out}")
    assert "not writable" in lines[0] or "cannot create" in lines[0]


def test_cli_refuses_a_foreign_report_then_force_overwrites_only_the_report(tmp_path):
    out = tmp_path / "r"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text("my own report")
    (out / "figures" / "mine.png").write_bytes(b"mine")
    result = runner.invoke(app, ["report", *SMALL, "--out", str(out)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "--force" in lines[0]
    assert (out / "report.md").read_text() == "my own report" and not (out / "report.html").exists()
    result = runner.invoke(app, ["report", *SMALL, "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert (out / "report.md").read_text().startswith("# ") and (
        out / "figures" / "mine.png"
    ).read_bytes() == b"mine"
    result = runner.invoke(app, ["report", *SMALL, "--out", str(out)])  # now it is the report's own
    assert result.exit_code == 0, result.output
