"""Write a report as DIR/report.html (self-contained: figures embedded as base64 PNG) and
DIR/report.md (figures referenced relatively from DIR/figures/)."""

from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from planner.errors import ConfigError
from planner.io import dumps_strict, read_json, write_bytes, write_json
from planner.report.checklist import RuleResult


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    name: str
    """File stem under figures/, e.g. 'time_breakdown'."""
    title: str
    caption: str
    png: bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Section:
    """A heading with paragraphs, tables and figures, in that order."""

    title: str
    paragraphs: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    figures: tuple[Figure, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportContent:
    title: str
    sections: tuple[Section, ...]
    checklist: tuple[RuleResult, ...]
    notes: tuple[str, ...] = field(default=())
    checklist_after: int = 2
    """The checklist is placed after this many sections (early, so a screenshot shows it)."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """The numbers behind the report (plan documents, scaling and seed rows, checklist), written
    as report.json beside it."""

    @property
    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures]


MANIFEST = ".planner-report.json"
"""The files an earlier `planner report` wrote into this directory (relative paths): only those are
ever replaced or removed; anything else in the directory belongs to the user."""
REPORT_FILES = ("report.html", "report.md", "report.json")
_OWNABLE = re.compile(r"report\.(html|md|json)|figures/[A-Za-z0-9_.-]+\.png")


def _refuse(out_dir: Path, problem: str) -> ConfigError:
    return ConfigError(
        "--out", str(out_dir), "a directory for the report", message=f"--out {out_dir}: {problem}"
    )


def written_before(out_dir: Path) -> set[str]:
    """The files the manifest says an earlier report wrote (names outside the report's own layout, or a
    manifest that cannot be read, are trusted with nothing)."""
    path = out_dir / MANIFEST
    if not path.exists():
        return set()
    try:
        files = read_json(path, "report manifest").get("files")
    except ConfigError:
        return set()
    if not isinstance(files, list):
        return set()
    return {f for f in files if isinstance(f, str) and _OWNABLE.fullmatch(f)}


def prepare_report_dir(
    out_dir: Path, *, force: bool = False, names: tuple[str, ...] = REPORT_FILES
) -> set[str]:
    """Check that the report can go to `out_dir` without touching a file it did not write: the directory
    exists or its parent does, it is writable, and none of `names` exists there unless an earlier
    report wrote it (or `force`). Returns the files earlier reports wrote. Creates nothing."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise _refuse(out_dir, "is a file, not a directory")
    if not out_dir.exists():
        if not out_dir.parent.is_dir():
            raise _refuse(out_dir, f"cannot create it: directory {out_dir.parent} does not exist")
        if not os.access(out_dir.parent, os.W_OK | os.X_OK):
            raise _refuse(out_dir, f"cannot create it: directory {out_dir.parent} is not writable")
        return set()
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise _refuse(out_dir, "directory is not writable")
    owned = written_before(out_dir)
    foreign = [name for name in names if (out_dir / name).exists() and name not in owned]
    if foreign and not force:
        raise _refuse(
            out_dir,
            f"{out_dir / foreign[0]} exists and was not written by planner report; choose "
            f"another --out directory, or pass --force to overwrite "
            f"{'it' if len(foreign) == 1 else 'the ' + str(len(foreign)) + ' such files'}",
        )
    return owned


def write_report(
    content: ReportContent, out_dir: Path, *, force: bool = False
) -> tuple[Path, Path]:
    """Write report.html, report.md, report.json and figures/*.png under out_dir; return the two report paths.

    Every file is written atomically (planner.io). A file already there is replaced only if the
    manifest (MANIFEST) says an earlier report wrote it, or with `force`; figures an earlier report
    wrote and this one does not show are removed; nothing else in the directory is touched."""
    out_dir = Path(out_dir)
    files = {"report.json": (dumps_strict(content.data, "report.json", indent=1) + "\n").encode()}
    files |= {f"figures/{fig.name}.png": fig.png for fig in content.figures}
    files |= {"report.md": to_markdown(content).encode(), "report.html": to_html(content).encode()}
    owned = prepare_report_dir(out_dir, force=force, names=tuple(files))
    fig_dir = out_dir / "figures"
    if fig_dir.exists() and not fig_dir.is_dir():
        raise _refuse(out_dir, f"{fig_dir} is a file, not a directory")
    try:
        out_dir.mkdir(exist_ok=True)
        fig_dir.mkdir(exist_ok=True)
    except OSError as err:
        raise _refuse(out_dir, f"cannot create {fig_dir} ({err.strerror or err})") from None
    manifest = out_dir / MANIFEST
    # first the union: an interrupted write still knows every file it may have written
    write_json(
        manifest, {"written_by": "planner report", "files": sorted(owned | set(files))}, "--out"
    )
    for name, data in files.items():
        write_bytes(out_dir / name, data, "--out")
    for stale in sorted(owned - set(files)):  # e.g. a figure an earlier report had
        path = out_dir / stale
        if path.is_file() and not path.is_symlink():
            path.unlink()
    write_json(manifest, {"written_by": "planner report", "files": sorted(files)}, "--out")
    return out_dir / "report.html", out_dir / "report.md"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 1e4 else str(value)
    return "n/a" if value is None else str(value)


# --- Markdown ------------------------------------------------------------------------------------


def _md_table(table: Table) -> str:
    esc = lambda s: _cell(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in table.rows]
    return "\n".join(lines)


def to_markdown(content: ReportContent) -> str:
    out = [f"# {content.title}", ""]
    for note in content.notes:
        out += [f"> {note}", ""]
    for i, section in enumerate(content.sections):
        if i == content.checklist_after:
            out += _md_checklist(content.checklist)
        out += [f"## {section.title}", ""]
        for p in section.paragraphs:
            out += [p, ""]
        for t in section.tables:
            out += [_md_table(t), ""]
        for f in section.figures:
            out += [f"![{f.title}](figures/{f.name}.png)", "", f"*{f.caption}*", ""]
    if content.checklist_after >= len(content.sections):
        out += _md_checklist(content.checklist)
    return "\n".join(out)


def _advice(r: RuleResult) -> str:
    """What to do, then where the practice comes from."""
    return r.detail + (f" Source: {r.source}." if r.source else "")


def _md_checklist(rules) -> list[str]:
    out = [
        "## Best-practice checklist",
        "",
        "| status | rule | number | what to do |",
        "|---|---|---|---|",
    ]
    for r in rules:
        out.append(
            f"| {r.status.upper()} | {r.title} | "
            f"{r.number.replace('|', '/')} | {_advice(r).replace('|', '/')} |"
        )
    return out + [""]


# --- HTML ----------------------------------------------------------------------------------------

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1150px;margin:24px auto;
padding:0 16px;color:#222;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #4c72b0;padding-bottom:6px}
h2{font-size:1.25em;margin-top:2em;color:#2c4a7c}
table{border-collapse:collapse;margin:10px 0;font-size:0.86em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#eef2f8}
td:first-child,th:first-child{text-align:left}
figure{margin:14px 0}
figure img{max-width:100%}
figcaption{font-size:0.85em;color:#555}
.note{background:#fff6d6;border-left:4px solid #e0b000;padding:6px 10px}
tr.rule td,table.checklist th{text-align:left}
table.kv td{text-align:left}
.pass{color:#1a7f37;font-weight:bold}
.warn{color:#b35900;font-weight:bold}
.advice{color:#2c4a7c;font-weight:bold}
"""


def _html_table(table: Table) -> str:
    if not any(table.columns):  # a key/value table without headings
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
            for row in table.rows
        )
        return f'<table class="kv"><tbody>{body}</tbody></table>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
        for row in table.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html_figure(fig: Figure) -> str:
    data = base64.b64encode(fig.png).decode("ascii")
    return (
        f'<figure class="report-figure" id="fig-{fig.name}"><img alt="{html.escape(fig.title)}" '
        f'src="data:image/png;base64,{data}"><figcaption><b>{html.escape(fig.title)}.</b> '
        f"{html.escape(fig.caption)}</figcaption></figure>"
    )


def to_html(content: ReportContent) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(content.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(content.title)}</h1>",
    ]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in content.notes]
    for i, section in enumerate(content.sections):
        if i == content.checklist_after:
            parts += _html_checklist(content.checklist)
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        parts += [_html_table(t) for t in section.tables]
        parts += [_html_figure(f) for f in section.figures]
    if content.checklist_after >= len(content.sections):
        parts += _html_checklist(content.checklist)
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_checklist(rules) -> list[str]:
    parts = [
        "<h2>Best-practice checklist</h2>",
        '<table class="checklist"><thead><tr><th>status</th><th>rule</th><th>number</th>'
        "<th>what to do</th></tr></thead><tbody>",
    ]
    for r in rules:
        parts.append(
            f'<tr class="rule" data-rule="{html.escape(r.rule)}" data-status="{r.status}">'
            f'<td class="{r.status}">{r.status.upper()}</td><td>{html.escape(r.title)}</td>'
            f"<td>{html.escape(r.number)}</td><td>{html.escape(_advice(r))}</td></tr>"
        )
    return parts + ["</tbody></table>"]


def table_from_records(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Table:
    return Table(
        columns=tuple(columns), rows=tuple(tuple(r.get(c) for c in columns) for r in records)
    )
