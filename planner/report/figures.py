"""The report's figures, drawn with matplotlib (Agg backend, no display) from plain data.

Each function takes numbers already computed by estimate/recommend and returns PNG bytes; none
computes a cost.
"""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402

from planner.report.timeline import Timeline  # noqa: E402

GB = 1e9
GiB = 2**30
_TERM_COLORS = {
    "compute": "#4c72b0",
    "tp_comm": "#dd8452",
    "dp_comm": "#c44e52",
    "pp_p2p": "#8172b3",
    "bubble": "#bbbbbb",
    "optimizer": "#55a868",
    "offload": "#937860",
    "recompute": "#da8bc3",
    "host_wait": "#ccb974",
}
_MEM_COLORS = {
    "params_bytes": "#4c72b0",
    "grads_bytes": "#dd8452",
    "optimizer_bytes": "#55a868",
    "activations_bytes": "#c44e52",
    "other_bytes": "#8c8c8c",
}
_OP_COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}
MAX_SCATTER_POINTS = 40_000
"""Candidates drawn in the Pareto cloud at most (a fixed random sample beyond that)."""


def _png(fig, *, tight: bool = True) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buf.getvalue()


def _svg(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _node_axis(ax, nodes: Sequence[int]) -> None:
    """Log2 x axis labelled with the node counts themselves."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(nodes), [str(n) for n in nodes])
    ax.minorticks_off()
    ax.set_xlabel("nodes")


def time_breakdown(breakdown_s: Mapping[str, float], step_time_s: float, title: str) -> bytes:
    """One horizontal stacked bar: seconds per step by term, with each term's share."""
    fig, ax = plt.subplots(figsize=(9, 2.4))
    left = 0.0
    for term, seconds in breakdown_s.items():
        if seconds <= 0:
            continue
        ax.barh(
            [0],
            [seconds],
            left=left,
            color=_TERM_COLORS.get(term, None),
            edgecolor="white",
            label=f"{term} {seconds:.3g} s ({seconds / step_time_s:.0%})",
        )
        left += seconds
    ax.axvline(
        step_time_s,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"step time {step_time_s:.3g} s",
    )
    ax.set_yticks([])
    ax.set_xlabel("seconds per optimizer step")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=8, frameon=False)
    return _png(fig)


def stage_memory(stages: Sequence[Mapping[str, Any]], capacity_bytes: int, title: str) -> bytes:
    """Stacked bars of memory terms (one bar per stage or per plan, `label`) against the capacity."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    for key, color in _MEM_COLORS.items():
        values = np.array([s.get(key, 0) for s in stages], dtype=float) / GiB
        ax.bar(x, values, bottom=bottom, color=color, label=key.removesuffix("_bytes"), width=0.7)
        bottom += values
    ax.axhline(
        capacity_bytes / GiB,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"capacity {capacity_bytes / GiB:.1f} GiB",
    )
    ax.set_xticks(
        x,
        [s.get("label", f"stage {i}") for i, s in enumerate(stages)],
        rotation=30 if len(stages) > 4 else 0,
        fontsize=8,
    )
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def pipeline_gantt(timeline: Timeline, title: str) -> bytes:
    """A Gantt chart: one row per pipeline rank, one box per op, micro-batch number inside."""
    fig, ax = plt.subplots(figsize=(11, 0.45 * timeline.ranks + 1.6))
    span = timeline.makespan_s or 1.0
    label_ops = len(timeline.ops) <= 400
    for op in timeline.ops:
        width = op.end_s - op.start_s
        shade = (
            1.0 - 0.35 * (op.chunk / max(timeline.chunks - 1, 1)) if timeline.chunks > 1 else 1.0
        )
        ax.barh(
            op.rank,
            width,
            left=op.start_s,
            height=0.8,
            color=_OP_COLORS[op.kind],
            alpha=shade,
            edgecolor="white",
            linewidth=0.4,
        )
        if label_ops and width / span > 0.012:
            ax.text(
                op.start_s + width / 2,
                op.rank,
                str(op.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(timeline.ranks), [f"stage {r}" for r in range(timeline.ranks)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds into the step (compute only; gaps are the bubble)")
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=c)
        for k, c in _OP_COLORS.items()
        if any(op.kind == k for op in timeline.ops)
    ]
    names = {
        "F": "forward",
        "B": "backward" if timeline.schedule != "zero-bubble" else "backward (input grad)",
        "W": "weight grad",
    }
    ax.legend(
        handles,
        [names[k] for k in _OP_COLORS if any(op.kind == k for op in timeline.ops)],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    ax.set_title(title)
    return _png(fig)


_LANE = 1.0
"""Height of one pipeline rank's pair of lanes (compute above, data-parallel stream below)."""


def step_timeline(step, title: str, fmt: str = "png") -> bytes:
    """The simulated step (cost_models.timeline.StepTimeline): per pipeline rank a compute lane (its
    forwards, backwards and weight gradients, blocking sends inside them, idle gaps the bubble) and
    a data-parallel lane: the reductions' exposed part after the compute (red, from the rank's
    compute end) and the hidden part (light, its amount drawn just before the compute end: the
    timeline reads amounts off the bucket streams, not their exact times). PNG or SVG bytes."""
    table, ranks = step.table, step.ranks
    p = len(ranks)
    fig, ax = plt.subplots(figsize=(11, 0.9 * p + 1.6))
    for r, span in enumerate(ranks):
        y = r * _LANE
        for code, kind in enumerate("FBW"):
            mask = table.kind[r] == code
            if mask.any():
                starts = table.start_s[r][mask]
                widths = table.end_s[r][mask] - starts
                ax.broken_barh(
                    list(zip(starts, widths)), (y, 0.45), facecolors=_OP_COLORS[kind], lw=0
                )
        end = span.compute_end_s
        hidden = max(0.0, span.dp_total_s - span.dp_exposed_s)
        if hidden > 0:
            ax.broken_barh(
                [(end - min(hidden, end), min(hidden, end))],
                (y + 0.5, 0.3),
                facecolors="#f2b8b8",
                lw=0,
            )
        if span.dp_exposed_s > 0:
            ax.broken_barh([(end, span.dp_exposed_s)], (y + 0.5, 0.3), facecolors="#c44e52", lw=0)
    ax.set_yticks([r * _LANE + 0.4 for r in range(p)], [f"stage {r}" for r in range(p)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds into the step")
    colors = {**{k: _OP_COLORS[k] for k in "FBW"}, "dp hidden": "#f2b8b8", "dp exposed": "#c44e52"}
    names = {"F": "forward", "B": "backward", "W": "weight grad"}
    shown = [k for k in colors if k not in "FBW" or (table.kind == "FBW".index(k)).any()]
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in shown],
        [names.get(k, k) for k in shown],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    ax.set_title(title)
    return _svg(fig) if fmt == "svg" else _png(fig)


def pareto_front(
    tokens_per_s: np.ndarray,
    peak_bytes: np.ndarray,
    fits: np.ndarray,
    front: np.ndarray,
    chosen: tuple[float, float],
    capacity_bytes: int,
    title: str,
) -> bytes:
    """Throughput against peak memory of every searched candidate, the Pareto front joined."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    mem_gb = peak_bytes / GiB
    if (
        len(mem_gb) > MAX_SCATTER_POINTS
    ):  # draw a fixed random sample of the cloud; the front is exact
        keep = np.zeros(len(mem_gb), dtype=bool)
        keep[np.random.default_rng(0).choice(len(mem_gb), MAX_SCATTER_POINTS, replace=False)] = True
        cloud_fit, cloud_nofit = keep & fits, keep & ~fits
    else:
        cloud_fit, cloud_nofit = fits, ~fits
    # plot() with markers draws tens of thousands of points much faster than scatter()
    ax.plot(
        mem_gb[cloud_nofit],
        tokens_per_s[cloud_nofit],
        ".",
        markersize=2,
        color="#cccccc",
        label="does not fit",
        rasterized=True,
    )
    ax.plot(
        mem_gb[cloud_fit],
        tokens_per_s[cloud_fit],
        ".",
        markersize=3,
        color="#8da0cb",
        label="fits",
        rasterized=True,
    )
    order = np.argsort(mem_gb[front])
    ax.plot(
        mem_gb[front][order],
        tokens_per_s[front][order],
        "-o",
        color="#e41a1c",
        markersize=4,
        label="Pareto front (max throughput, min memory)",
    )
    ax.scatter(
        [chosen[1] / GiB],
        [chosen[0]],
        marker="*",
        s=220,
        color="gold",
        edgecolor="black",
        zorder=5,
        label="recommended",
    )
    ax.axvline(capacity_bytes / GiB, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens / s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)


def scaling(rows: Sequence[Mapping[str, float]], title: str) -> bytes:
    """Throughput, cost of the run and days to train against the node count (three panels)."""
    nodes = [r["nodes"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    panels = [
        ("tokens_per_s", "tokens / s"),
        ("cost_usd", "cost of the run (USD, on-demand)"),
        ("days_to_train", "days to train"),
    ]
    for ax, (key, label) in zip(axes, panels):
        pts = [(n, r[key]) for n, r in zip(nodes, rows) if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), "-o", color="#4c72b0")
        if key == "cost_usd":
            spot = [
                (n, r["cost_spot_usd"])
                for n, r in zip(nodes, rows)
                if r.get("cost_spot_usd") is not None
            ]
            if spot:
                ax.plot(*zip(*spot), "-s", color="#55a868", label="spot")
                ax.legend(fontsize=8)
        _node_axis(ax, nodes)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return _png(fig, tight=False)


def seed_argument(rows: Sequence[Mapping[str, float]], title: str) -> bytes:
    """Relative cost of pipelining vs pure data parallel: the seed's log-n model beside calibrated ones."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    nodes = [r["nodes"] for r in rows]
    series = [
        ("seed_relative", "seed: 1/2 + 1/2 * 1/log2(n) (vs a one-step all-reduce)", "#e41a1c", "o"),
        (
            "calibrated_hierarchical",
            "calibrated: hierarchical / flat all-reduce (alpha-beta)",
            "#4c72b0",
            "s",
        ),
        (
            "calibrated_step",
            "calibrated: best pipelined / best pure-DP step time (estimate)",
            "#000000",
            "^",
        ),
    ]
    for key, label, color, marker in series:
        pts = [(n, r[key]) for n, r in zip(nodes, rows) if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), marker=marker, color=color, label=label)
            for n, y in pts:
                ax.annotate(
                    f"{y:.3g}",
                    (n, y),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    fontsize=7,
                    color=color,
                )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    _node_axis(ax, nodes)
    ax.set_ylabel("relative cost (1 = reference)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def goodput_by_size(
    gpus: Sequence[int],
    goodput: Sequence[float],
    plan_gpus: int,
    plan_goodput: float,
    reference: float,
    title: str,
) -> bytes:
    """Expected goodput against the number of GPUs (log2 axis), the plan marked, a reference line."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(
        list(gpus), [100 * g for g in goodput], "-o", color="#4c72b0", markersize=4, label="goodput"
    )
    ax.scatter(
        [plan_gpus],
        [100 * plan_goodput],
        marker="*",
        s=220,
        color="gold",
        edgecolor="black",
        zorder=5,
        label=f"this plan: {plan_goodput:.1%} on {plan_gpus:,} GPUs",
    )
    ax.axhline(
        100 * reference,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"Llama 3 on 16K GPUs: > {reference:.0%} effective training time",
    )
    ax.set_xscale("log", base=2)
    ticks = [g for g in gpus if g != plan_gpus or g & (g - 1) == 0]  # the plan's own size: the star
    ax.set_xticks(ticks, [f"{g:,}" for g in ticks], fontsize=7, rotation=30)
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(max(0.0, 100 * min(min(goodput), plan_goodput) - 5), 100.5)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    return _png(fig)
