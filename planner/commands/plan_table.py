"""The `recommend` table as plain text: the columns a user decides on by default (`--wide`: all of
them), one
row per plan with placement-only twins merged, aligned with spaces and never cut (off a terminal
every row is
written whole; on a terminal narrower than the table the optional columns go first, and a line says
so), and
one legend line for the headers shown."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from planner.partition import even_split
from planner.score import Scores

GiB = 2**30
TWIN_TOLERANCE = 1e-3
"""Placement-only twins: the same plan but its rank order, predictions within 0.1% (step time and
peak)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    """One column of the table."""

    header: str
    cell: Callable[[dict, tuple[str, ...]], str]
    """(plan document, placements of the merged row) -> the cell's text."""
    legend: str
    """What the header means, for the legend line."""
    wide_only: bool = False
    """Shown only with --wide."""
    optional: bool = False
    """Left out first when the terminal is narrower than the table."""
    left: bool = False


def _schedule(p: dict) -> str:
    short = {"interleaved-1f1b": "1f1b", "zero-bubble": "zb"}.get(p["schedule"], p["schedule"])
    return short + (f" v{p['virtual_stages']}" if p.get("virtual_stages", 1) > 1 else "")


def _cp(p: dict) -> str:
    cp = p.get("cp", 1)
    comm = {"all_gather": "ag"}.get(p.get("cp_comm", "p2p"), p.get("cp_comm", "p2p"))
    return f"{cp} {comm}" if cp > 1 else "1"


def _recompute(p: dict) -> str:
    text = {"none": "-", "selective": "sel", "full": "full"}.get(p["recompute"], p["recompute"])
    return text + (f":{p['recompute_layers']}" if p.get("recompute_layers") is not None else "")


def _uneven(p: dict) -> str:
    stages = p.get("stages") or []
    return "uneven" if stages and tuple(stages) != even_split(sum(stages), len(stages)) else "even"


def _pred(doc: dict) -> dict:
    return doc["prediction"]


def exposed_comm_s(doc: dict) -> float:
    """Seconds of the step spent waiting on communication (Scores.COMM_TERMS of its breakdown)."""
    terms = _pred(doc)["time_breakdown_s"]
    return sum(float(terms.get(name, 0.0)) for name in Scores.COMM_TERMS)


def _some_plan(key: str, default) -> Callable[[list[dict]], bool]:
    """When a column is shown: some plan sets `key` to other than `default`."""
    return lambda docs: any(d["plan"].get(key, default) not in (default, None) for d in docs)


def _every_prediction(key: str) -> Callable[[list[dict]], bool]:
    """When a column is shown: every plan's prediction has `key` (cost, goodput)."""
    return lambda docs: all(key in _pred(d) for d in docs)


def _always(docs: list[dict]) -> bool:
    return True


COLUMNS: tuple[tuple[Column, Callable[[list[dict]], bool]], ...] = (
    (Column(header="#", cell=lambda d, pl: d["_rank"], legend=""), _always),
    (
        Column(
            header="dp.tp.pp",
            cell=lambda d, pl: f"{d['plan']['dp']}.{d['plan']['tp']}.{d['plan']['pp']}",
            legend="data.tensor.pipeline degrees",
        ),
        _always,
    ),
    (
        Column(
            header="cp",
            cell=lambda d, pl: _cp(d["plan"]),
            left=True,
            legend="context parallel, K/V exchange (ag: all-gather, a2a: Ulysses)",
        ),
        _some_plan("cp", 1),
    ),
    (
        Column(
            header="ep", cell=lambda d, pl: str(d["plan"].get("ep", 1)), legend="expert parallel"
        ),
        _some_plan("ep", 1),
    ),
    (
        Column(
            header="mb x m",
            cell=lambda d, pl: f"{d['plan']['micro_batch']} x {d['plan']['num_microbatches']}",
            legend="micro-batch x count per step",
        ),
        _always,
    ),
    (
        Column(
            header="sched",
            cell=lambda d, pl: _schedule(d["plan"]),
            left=True,
            legend="schedule (vN: interleaved)",
        ),
        _always,
    ),
    (Column(header="ZeRO", cell=lambda d, pl: str(d["plan"]["zero"]), legend="stage"), _always),
    (
        Column(
            header="shard",
            cell=lambda d, pl: str(d["plan"].get("dp_shard", 0) or "all"),
            legend="shard group",
            optional=True,
        ),
        _some_plan("dp_shard", 0),
    ),
    (
        Column(
            header="recomp",
            cell=lambda d, pl: _recompute(d["plan"]),
            left=True,
            legend="recompute (sel: selective)",
        ),
        _always,
    ),
    (
        # shown without --wide where some plan offloads (columns)
        Column(
            header="offload",
            cell=lambda d, pl: d["plan"]["offload"],
            left=True,
            legend="to CPU",
            wide_only=True,
            optional=True,
        ),
        _always,
    ),
    (
        Column(
            header="SP",
            cell=lambda d, pl: "y" if d["plan"]["sequence_parallel"] else "-",
            legend="sequence parallel",
            wide_only=True,
        ),
        _always,
    ),
    (
        Column(
            header="place",
            cell=lambda d, pl: "|".join(pl),
            left=True,
            optional=True,
            legend="rank order (A|B: either)",
        ),
        _always,
    ),
    (
        Column(
            header="stages",
            cell=lambda d, pl: _uneven(d["plan"]),
            left=True,
            wide_only=True,
            legend="blocks per stage",
        ),
        _always,
    ),
    (
        Column(
            header="step s",
            cell=lambda d, pl: f"{_pred(d)['step_time_s']:.3f}",
            legend="seconds per step",
        ),
        _always,
    ),
    (
        Column(
            header="comm s",
            cell=lambda d, pl: f"{exposed_comm_s(d):.3f}",
            wide_only=True,
            legend="communication exposed in the step (tp, cp, ep, dp, pipeline sends)",
        ),
        _always,
    ),
    (
        Column(
            header="tokens/s",
            cell=lambda d, pl: f"{_pred(d)['tokens_per_s']:,.0f}",
            legend="throughput",
            wide_only=True,
        ),
        _always,
    ),
    (
        Column(
            header="MFU",
            cell=lambda d, pl: f"{_pred(d)['mfu']:.1%}",
            optional=True,
            legend="model FLOPs utilization",
        ),
        _always,
    ),
    (
        Column(
            header="GiB",
            cell=lambda d, pl: f"{_pred(d)['memory']['peak_bytes_per_gpu'] / GiB:.1f}",
            legend="peak per GPU",
        ),
        _always,
    ),
    (
        Column(
            header="$/1B",
            cell=lambda d, pl: f"{_pred(d)['cost']['usd_per_1b_tokens']:,.0f}",
            legend="USD per 1B tokens",
        ),
        _every_prediction("cost"),
    ),
    (
        Column(
            header="goodput",
            cell=lambda d, pl: f"{_pred(d)['goodput']:.1%}",
            wide_only=True,
            legend="time training under failures",
        ),
        _every_prediction("goodput"),
    ),
    (
        Column(
            header="days",
            cell=lambda d, pl: f"{_pred(d)['reliability']['time_to_train_s'] / 86400:.1f}",
            legend="to train, with failures",
        ),
        _every_prediction("goodput"),
    ),
)
"""Every column of the plan table in order, with when it is shown (cp, ep, shard, cost and goodput
only where some plan has them)."""


def columns(docs: list[dict]) -> list[Column]:
    """The columns these plans need (COLUMNS); offload is shown without --wide where a plan
    offloads."""
    offloads = _some_plan("offload", "none")(docs)
    return [
        replace(col, wide_only=False) if col.header == "offload" and offloads else col
        for col, shown in COLUMNS
        if shown(docs)
    ]


def _twins(a: dict, b: dict) -> bool:
    """Whether b is a's plan with another placement only, predicted the same within
    TWIN_TOLERANCE."""
    pa, pb = dict(a["plan"], placement=None), dict(b["plan"], placement=None)
    if pa != pb:
        return False
    close = lambda x, y: abs(x - y) <= TWIN_TOLERANCE * max(abs(x), abs(y), 1e-12)  # noqa: E731
    return close(_pred(a)["step_time_s"], _pred(b)["step_time_s"]) and close(
        _pred(a)["memory"]["peak_bytes_per_gpu"], _pred(b)["memory"]["peak_bytes_per_gpu"]
    )


def merged_rows(docs: list[dict]) -> list[tuple[dict, tuple[str, ...]]]:
    """(document, its placements) per row: a placement-only twin joins the first row of its plan;
    the rank shown
    is the plan's place in the search's order ("2" for the plans ranked 2 and 3 when they are
    twins)."""
    rows: list[tuple[dict, list[str]]] = []
    for rank, doc in enumerate(docs, start=1):
        twin = next((r for r in rows if _twins(r[0], doc)), None)
        if twin is not None:
            twin[1].append(doc["plan"]["placement"])
            continue
        rows.append((dict(doc, _rank=str(rank)), [doc["plan"]["placement"]]))
    return [(doc, tuple(placements)) for doc, placements in rows]


def render(cols: list[Column], rows: list[tuple[dict, tuple[str, ...]]]) -> list[str]:
    """Header, rule and rows, aligned with two spaces between columns (text left, numbers right)."""
    cells = [[c.cell(doc, pl) for c in cols] for doc, pl in rows]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = lambda values: "  ".join(
        v.ljust(w) if c.left else v.rjust(w)  # noqa: E731
        for v, w, c in zip(values, widths, cols)
    ).rstrip()
    return [line([c.header for c in cols]), "  ".join("-" * w for w in widths)] + [
        line(r) for r in cells
    ]


def legend(cols: list[Column]) -> str:
    return "legend: " + "; ".join(f"{c.header}: {c.legend}" for c in cols if c.legend)


def table_lines(docs: list[dict], *, wide: bool = False, width: int | None = None) -> list[str]:
    """The table, its legend line and (when `width` left columns out) a line naming them. `width`:
    the terminal's
    columns (None off a terminal: nothing is left out)."""
    rows = merged_rows(docs)
    cols = [c for c in columns(docs) if wide or not c.wide_only]
    dropped: list[str] = []
    while width is not None and max(len(x) for x in render(cols, rows)) > width:
        optional = [c for c in cols if c.wide_only] or [c for c in cols if c.optional]
        if not optional:
            break
        cols.remove(optional[-1])
        dropped.insert(0, optional[-1].header)
    out = render(cols, rows) + [legend(cols)]
    if dropped:
        out.append(
            f"({', '.join(dropped)} left out at {width} columns; "
            "a wider terminal, --wide or a pipe shows them)"
        )
    merged = len(docs) - len(rows)
    if merged:
        out.append(
            f"{merged} placement-only twin{'s' if merged > 1 else ''} merged into one row "
            "(place A|B)"
        )
    return out
