"""`planner recommend MODEL --hardware HW --gpus N|--nodes K ...`: search, rank and write the best plan."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.commands.common import (
    run_options_of,
    AttentionOpt,
    DropoutOpt,
    FrameworkOpt,
    GradReduceOpt,
    GlobalBatchOpt,
    MasterWeightsOpt,
    KernelsOpt,
    GpusOpt,
    HardwareOpt,
    HwPrecisionOpt,
    JsonOpt,
    MAX_TOKENS,
    MAX_WORLD_SIZE,
    ModelArg,
    NodesOpt,
    OptimizerOpt,
    SeqOpt,
    objective_help,
    Bf16OptimizerOpt,
    ActivationFp8InputOpt,
    LossOpt,
    TrainMetricsOpt,
    RecomputeModulesOpt,
    Fp8ParamGatherOpt,
    Fp8ScalingOpt,
    MoeDispatcherOpt,
    MoeA2aOverlapOpt,
    MoeImbalanceOpt,
    TpCommOverlapOpt,
    OverlapGradReduceOpt,
    OverlapParamGatherOpt,
    OverlapP2pOpt,
    CudaGraphsOpt,
)
from hardware_profiles import load_profile
from planner.commands.plan_table import table_lines
from planner.errors import ConfigError
from planner.option_rules import check_options
from planner.uncertainty import axes
from hardware_profiles.loader import KEYS
from planner import io
from planner.candidates import SearchSpace
from planner.explain import describe_config
from planner.goodput import ReliabilityInputs
from planner.parallel import CP_COMMS
from planner.search import recommend as search
from planner.search.space import PREFERENCES
from planner.sources import default_framework

ObjectiveOpt = Annotated[str, typer.Option("--objective", help=objective_help("--tokens"))]
TopOpt = Annotated[int, typer.Option("--top", min=1, max=100, help="How many plans to list.")]
PreferOpt = Annotated[
    str,
    typer.Option(
        "--prefer",
        help="Among plans within the model's measured error of the fastest (near-ties): "
        "headroom ranks first the one with the fewest parallel axes, then the least memory; "
        "fastest keeps the predicted order. One of " + ", ".join(PREFERENCES) + ".",
    ),
]
WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide",
        help="Every column (SP, stages, tokens/s, goodput, offload); the default shows "
        "the ones a plan is chosen on.",
    ),
]
OutOpt = Annotated[
    Optional[Path], typer.Option("--out", help="Write the best plan document here (plan.json).")
]
CsvOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--csv",
        help="Write every scored candidate here as CSV: its knobs, "
        "step_time_s, peak_bytes_per_gpu and fits.",
    ),
]
SpotOpt = Annotated[
    bool,
    typer.Option("--spot", help="Price with the profile's spot price (or --price-per-hour's)."),
]
PriceOpt = Annotated[
    Optional[float],
    typer.Option(
        "--price-per-hour",
        help="US dollars per node-hour (your "
        "negotiated, reserved or spot price) instead of the profile's.",
    ),
]
TOKENS_HELP = (
    "Training tokens (e.g. 300e9 or 300B): adds time and cost to train, with the "
    "goodput under failures and the checkpoint interval (docs/goodput.md)."
)
TokensOpt = Annotated[Optional[str], typer.Option("--tokens", help=TOKENS_HELP)]
MtbfGpuOpt = Annotated[
    Optional[float],
    typer.Option(
        "--mtbf-gpu-hours",
        help="Your mean GPU-hours between job interruptions caused by one GPU (default: from "
        "Llama 3's 16K-GPU run, with a per-node rate; giving this or --mtbf-node-hours replaces "
        "both defaults).",
    ),
]
MtbfNodeOpt = Annotated[
    Optional[float],
    typer.Option(
        "--mtbf-node-hours",
        help="Your mean node-hours between job interruptions caused by one node's host, network "
        "or software.",
    ),
]
RestartOpt = Annotated[
    Optional[float],
    typer.Option(
        "--restart-s",
        help="Seconds from an interruption until training runs again, checkpoint read excluded "
        "(scheduler, process start, communicator setup; default 600).",
    ),
]
StorageOpt = Annotated[
    Optional[str],
    typer.Option(
        "--storage",
        help="Where checkpoints go: a profile in storage_profiles/ (fsx-lustre, fsx-lustre-1000, s3) or a "
        "path to a storage profile file (default fsx-lustre).",
    ),
]
CheckpointOpt = Annotated[
    Optional[str],
    typer.Option(
        "--checkpoint",
        help="blocking (training waits for the write; default) or async (waits only for the copy to "
        "host memory).",
    ),
]
CpOpt = Annotated[
    Optional[int],
    typer.Option(
        "--cp",
        min=1,
        max=MAX_WORLD_SIZE,
        help="Search only this context-parallel degree (default: every degree with "
        "seq % (2 cp) == 0).",
    ),
]
MaxCpOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-cp",
        min=1,
        max=MAX_WORLD_SIZE,
        help="Search context-parallel degrees up to this one.",
    ),
]
CpCommsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--cp-comm",
        help="Context-parallel key/value exchanges to search, comma-separated: p2p (ring), all_gather, "
        "a2a (Ulysses) (default: every one the framework runs).",
    ),
]
DpShardOpt = Annotated[
    Optional[int],
    typer.Option(
        "--dp-shard",
        min=0,
        max=MAX_WORLD_SIZE,
        help="ZeRO/FSDP shard group: 0 shards over all dp ranks only (no "
        "hybrid sharding), N only groups of N ranks (default: both all dp "
        "ranks and the largest group inside one NVLink domain).",
    ),
]
EpOpt = Annotated[
    Optional[int],
    typer.Option(
        "--ep",
        min=1,
        max=MAX_WORLD_SIZE,
        help="Search only this expert-parallel degree (mixture-of-experts models).",
    ),
]
MaxEpOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-ep", min=1, max=MAX_WORLD_SIZE, help="Search expert-parallel degrees up to this one."
    ),
]
SpotRateOpt = Annotated[
    Optional[float],
    typer.Option(
        "--spot-interruptions-per-node-hour",
        help="With --spot: how often one spot node is reclaimed, per node-hour "
        "(no default: required with --objective time-to-train).",
    ),
]

_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str | None) -> float | None:
    """'300B', '3e11', '1.5T' -> tokens, from 1 to MAX_TOKENS.

    >>> parse_tokens("1.5T"), parse_tokens(" 3e11 ")
    (1500000000000.0, 300000000000.0)
    """
    if text is None:
        return None
    allowed = f"a number of tokens from 1 to {MAX_TOKENS:g}, e.g. 300e9 or 300B"
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", text.upper())
    if not match:
        raise ConfigError("tokens", text, allowed)
    tokens = float(match.group(1)) * _SUFFIX[match.group(2)]  # 1e400 reads as inf: refused below
    if not 1 <= tokens <= MAX_TOKENS:
        raise ConfigError("tokens", text, allowed)
    return tokens


def check_price(price_per_hour: float | None) -> None:
    """--price-per-hour: positive and finite, at most what a hardware profile may state per node-hour."""
    if price_per_hour is None:
        return

    high = KEYS["price_usd_per_hour"].high
    if not (0 < price_per_hour <= high):  # NaN fails both comparisons
        raise ConfigError(
            "price-per-hour",
            price_per_hour,
            f"a positive number of US dollars per node-hour, "
            f"at most {high:g} (the bound of a hardware profile's price)",
        )


def _check_outputs(model, hardware, *, out, csv) -> None:
    """Refuse, before searching, an --out or --csv that cannot be written or that would overwrite
    an input or each other."""
    inputs = ((model, "MODEL file"), (hardware, "hardware profile"))
    for path, what in ((out, "--out"), (csv, "--csv")):
        if path is not None:
            io.check_writable(path, what, inputs=inputs)
    if out is not None and csv is not None and Path(out).resolve() == Path(csv).resolve():
        raise ConfigError("--csv", str(csv), "a file other than --out's")


def _print_notes(rec, *, spot: bool) -> None:
    """The notes on stderr about the winner: its batch against the GPUs, and spot reclaims the
    goodput leaves out."""
    hw_doc = rec.best["hardware"]
    note = batch_note(
        rec.best["plan"]["global_batch"], hw_doc["gpus"], hw_doc.get("devices_per_node", 8)
    )
    if note:
        typer.echo(note, err=True)
    reliability_doc = rec.best["prediction"].get("reliability")
    if spot and reliability_doc and reliability_doc.get("spot_interruptions_per_node_hour") is None:
        typer.echo(
            "note: the goodput leaves out spot reclaims; give --spot-interruptions-per-node-hour to count "
            "them",
            err=True,
        )


def recommend(
    model: ModelArg,
    hardware: HardwareOpt,
    gpus: GpusOpt = None,
    nodes: NodesOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq: SeqOpt = None,
    precision: HwPrecisionOpt = None,
    optimizer: OptimizerOpt = "adamw",
    objective: ObjectiveOpt = "throughput",
    top: TopOpt = 5,
    prefer: PreferOpt = "headroom",
    out: OutOpt = None,
    json_out: JsonOpt = False,
    spot: SpotOpt = False,
    price_per_hour: PriceOpt = None,
    tokens: TokensOpt = None,
    csv: CsvOpt = None,
    framework: FrameworkOpt = None,
    attention: AttentionOpt = None,
    dropout: DropoutOpt = None,
    grad_reduce_dtype: GradReduceOpt = None,
    master_weights: MasterWeightsOpt = None,
    kernels: KernelsOpt = None,
    mtbf_gpu_hours: MtbfGpuOpt = None,
    mtbf_node_hours: MtbfNodeOpt = None,
    restart_s: RestartOpt = None,
    storage: StorageOpt = None,
    checkpoint: CheckpointOpt = None,
    spot_interruptions_per_node_hour: SpotRateOpt = None,
    cp: CpOpt = None,
    max_cp: MaxCpOpt = None,
    cp_comm: CpCommsOpt = None,
    dp_shard: DpShardOpt = None,
    ep: EpOpt = None,
    max_ep: MaxEpOpt = None,
    recompute_modules: RecomputeModulesOpt = None,
    bf16_optimizer: Bf16OptimizerOpt = False,
    activation_fp8_input: ActivationFp8InputOpt = False,
    loss: LossOpt = None,
    train_metrics: TrainMetricsOpt = None,
    fp8_scaling: Fp8ScalingOpt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeA2aOverlapOpt = None,
    moe_imbalance: MoeImbalanceOpt = None,
    tp_comm_overlap: TpCommOverlapOpt = None,
    overlap_grad_reduce: OverlapGradReduceOpt = None,
    overlap_param_gather: OverlapParamGatherOpt = None,
    overlap_p2p: OverlapP2pOpt = None,
    cuda_graphs: CudaGraphsOpt = None,
    wide: WideOpt = False,
) -> None:
    """Search every parallel strategy, rank by the objective and print the top plans."""
    options = run_options_of(locals())  # first: locals() are the parameters alone

    profile = load_profile(hardware)
    check_options(
        **options.chosen(),
        precision=precision,
        framework=framework,
        objective=objective,
        hardware=hardware,
        price_per_hour=price_per_hour,
        price=profile.spot_price_usd_per_hour if spot else profile.price_usd_per_hour,
    )
    space = search_space(
        cp=cp, max_cp=max_cp, cp_comm=cp_comm, dp_shard=dp_shard, ep=ep, max_ep=max_ep
    )
    token_count = parse_tokens(tokens)
    check_price(price_per_hour)
    reliability = ReliabilityInputs(
        mtbf_gpu_hours=mtbf_gpu_hours,
        mtbf_node_hours=mtbf_node_hours,
        restart_s=restart_s,
        storage=storage,
        checkpoint=checkpoint,
        spot_interruptions_per_node_hour=spot_interruptions_per_node_hour,
    )
    _check_outputs(model, hardware, out=out, csv=csv)  # before the search, not after it
    with _LazyProgress() as progress:
        rec = search(
            model,
            hardware,
            gpus=gpus,
            nodes=nodes,
            global_batch=global_batch,
            seq=seq,
            precision=precision,
            optimizer=optimizer,
            objective=objective,
            top=top,
            prefer=prefer,
            spot=spot,
            price_per_hour=price_per_hour,
            tokens=token_count,
            progress=progress.update,
            framework=default_framework(model, framework),
            options=options,
            reliability=reliability,
            space=space,
        )
    _print_notes(rec, spot=spot)
    _deliver(rec, out=out, csv=csv, json_out=json_out, wide=wide, price=price_per_hour, spot=spot)


def _deliver(rec, *, out, csv, json_out: bool, wide: bool, price, spot: bool) -> None:
    """The result where the user asked for it: the plan file (--out), the candidates (--csv), and the
    JSON document (--json) or the ranking table on stdout; each file written is named on stderr."""
    document = io.dumps_strict(rec.to_document(), "--json output") if json_out else None
    if out is not None:
        io.write_json(out, rec.plan_document(), "--out")
    if csv is not None:
        io.write_text(csv, candidates_csv(rec), "--csv")
    if document is not None:
        typer.echo(document)
    else:
        _print_table(rec, wide=wide, price_per_hour=price, spot=spot)
    for path in (out, csv):
        if path is not None:
            typer.echo(f"wrote {path}", err=True)


def search_space(
    *,
    cp: int | None = None,
    max_cp: int | None = None,
    cp_comm: str | None = None,
    dp_shard: int | None = None,
    ep: int | None = None,
    max_ep: int | None = None,
):
    """The SearchSpace the pinning and limiting flags ask for (--cp N pins, --max-cp N limits, --cp-comm lists,
    --dp-shard pins, --ep / --max-ep as --cp / --max-cp); the search checks the values against the framework,
    the model and the sequence (planner.search.check_space). --cp-comm: comma-separated, each once."""
    kw: dict = {"max_cp": max_cp, "dp_shard": dp_shard, "max_ep": max_ep}
    if cp is not None:
        kw["cp"] = (cp,)
    if ep is not None:
        kw["ep"] = (ep,)
    if cp_comm is not None:
        names = [c.strip() for c in cp_comm.split(",")]
        bad = [c for c in names if c not in CP_COMMS]
        if bad or not names or len(set(names)) != len(names):
            raise ConfigError(
                "cp-comm",
                cp_comm,
                "comma-separated exchanges, each once, from " + ", ".join(CP_COMMS),
            )
        kw["cp_comm"] = tuple(names)
    return SearchSpace(**kw)


def candidates_csv(rec) -> str:
    """Every scored candidate of the search as CSV text, fitting ones first, fastest first."""
    frame = rec.to_pandas()
    frame = frame.sort_values(
        ["fits", "step_time_s", "peak_bytes_per_gpu"], ascending=[False, True, True], kind="stable"
    )
    return frame.to_csv(index=False)


def batch_note(global_batch: int, gpus: int, devices_per_node: int) -> str | None:
    """A stderr note when the global batch shares few factors with the world size: dp must divide it,
    so e.g. 1537 sequences on 8 GPUs leave dp = 1 and force model parallelism. Quiet while dp can
    still span a node's devices (1536 on 960 GPUs allows dp up to 192)."""
    import math

    usable = math.gcd(global_batch, gpus)
    if usable >= min(gpus, devices_per_node):
        return None
    lower, upper = global_batch // gpus * gpus, -(-global_batch // gpus) * gpus
    nearby = " or ".join(str(b) for b in (lower, upper) if b > 0)
    return (
        f"note: global batch {global_batch} and {gpus} GPUs share only the factor {usable}: data parallelism "
        f"can use dp dividing {global_batch}; a multiple of {gpus} ({nearby}) allows dp up to {gpus}"
    )


class _LazyProgress:
    """A rich progress bar on stderr that appears only once the search has run for a second."""

    def __init__(self, delay_s: float = 1.0):
        self.delay_s, self.t0, self.bar, self.task = delay_s, time.perf_counter(), None, None

    def __enter__(self):
        return self

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.delay_s:
                return
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("scoring candidates"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("score", total=total)
        self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def price_line(doc: dict, *, price_per_hour: float | None, spot: bool) -> str | None:
    """Which price the costs use: the user's, or the profile's spot or on-demand price with its
    source and date."""
    cost = doc["prediction"].get("cost")
    if not cost:
        return None
    per_node = cost["usd_per_hour"] / doc["hardware"]["nodes"]
    if price_per_hour is not None:
        origin = "your --price-per-hour"
    else:
        key = "spot_price_usd_per_hour" if spot else "price_usd_per_hour"
        source = load_profile(doc["hardware"]["name"]).sources.get(key, "no source recorded")
        origin = f"{doc['hardware']['name']} {'spot' if spot else 'on-demand'} price: {source}"
    return f"priced at ${per_node:,.2f} per node-hour ({origin})"


def _print_table(
    rec, wide: bool = False, *, price_per_hour: float | None = None, spot: bool = False
) -> None:
    """The plans as plain text (planner.commands.plan_table), then the search's summary lines; on a
    terminal, lines wider than it are wrapped (table rows never: columns are left out instead)."""
    import shutil
    import sys
    import textwrap

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    best = rec.best
    hw, model, plan = best["hardware"], best["model"], best["plan"]
    title = (
        f"{model['name']} on {hw['gpus']} x {hw['name']} ({hw['nodes']} nodes), global batch "
        f"{plan['global_batch']} x {plan['seq']} tokens, objective {rec.objective}, "
        f"framework {plan.get('framework', 'megatron')}"
    )
    table = table_lines([best, *rec.alternatives], wide=wide, width=width)
    rows = table[: next(i for i, line in enumerate(table) if line.startswith("legend: "))]
    for line in [title, *table, *summary_lines(rec, price_per_hour=price_per_hour, spot=spot)]:
        keep = width is None or len(line) <= width or line in rows
        typer.echo(line if keep else textwrap.fill(line, width=width, subsequent_indent="  "))


def summary_lines(rec, *, price_per_hour: float | None, spot: bool) -> list[str]:
    """What the search did, the best plan in one line, the price used and the time to train."""
    s, best = rec.stats, rec.best
    lines = [
        f"searched {s.candidates_evaluated:,} candidates in {s.seconds:.2f} s "
        f"({s.feasible:,} fit; not scored: {s.pruned_by_memory_bound:,} below a memory bound, "
        f"{s.pruned_by_time_bound:,} above a time bound)"
    ]
    if s.near_misses_resplit:
        lines.append(
            f"re-split {s.near_misses_resplit} plan(s) over memory at even stages: "
            f"{s.near_misses_fit} fit with uneven stages"
        )
    tried = s.values_tried
    if tried:
        lines.append(
            "tried "
            + "; ".join(
                f"{name} {', '.join(map(str, tried[name]))}"
                for name in ("cp", "cp_comm", "dp_shard", "ep")
                if name in tried
            )
        )
    for reason in dict.fromkeys(s.held.values()):
        held = ", ".join(k for k, v in s.held.items() if v == reason)
        lines.append(f"held at 1: {held}: {reason}")
    if s.free_overlaps:
        lines.append(overlap_line(s, best["plan"].get("framework", "megatron")))
    lines.append(f"best: {describe_config(best['plan'])}")
    lines += tie_lines(rec)
    price = price_line(best, price_per_hour=price_per_hour, spot=spot)
    if price:
        lines.append(price)
    train = best["prediction"].get("to_train")
    if train:
        cost = f", ${train['usd']:,.0f}" if "usd" in train else ""
        failures = " with failures" if "days_without_failures" in train else ""
        lines.append(
            f"to train {_token_count(train['tokens'])} tokens: {train['steps']:,} steps, "
            f"{train['days']:.1f} days{cost}{failures}"
        )
    rel = best["prediction"].get("reliability")
    return lines + (reliability_lines(rel) if rel else [])


def overlap_line(stats, framework: str) -> str:
    """Which of the overlaps left unset (off by the framework's default) the search turned on for
    the best plan (planner.search.overlaps), and the flag that keeps each off."""
    on = [name for name in stats.free_overlaps if name in stats.turned_on]
    off = [name for name in stats.free_overlaps if name not in stats.turned_on]
    flags = ", ".join("--no-" + name.replace("_", "-") for name in on)
    parts = ([f"turned on {', '.join(on)} (set {flags} to keep it off)"] if on else []) + (
        [f"left {', '.join(off)} off (it does not fit or does not apply)"] if off else []
    )
    return f"overlaps unset, off by {framework}'s default: " + "; ".join(parts)


def tie_lines(rec) -> list[str]:
    """The plans the model cannot rank (planner.uncertainty.near_ties), and the one to prefer."""
    ties = rec.best["search"].get("near_ties")
    if not ties or len(ties["plans"]) < 2:
        return []
    plans = [rec.best, *rec.alternatives]
    pick = plans[ties["preferred"]]
    peak = pick["prediction"]["memory"]["peak_bytes_per_gpu"] / 2**30
    where = f"{pick['plan'].get('framework', 'megatron')} runs at {ties['scale']} GPUs"
    numbers = ", ".join(f"#{i + 1}" for i in ties["plans"])
    fastest = ties.get("fastest", 0)
    if ties["preferred"] == 0 and fastest != 0:
        order = (
            f"#1 is ranked first: it uses the fewest axes ({axes(pick['plan'])}) and then the "
            f"least memory ({peak:.1f} GiB per GPU); #{fastest + 1} is predicted fastest "
            "(--prefer fastest ranks it first)."
        )
    else:
        order = (
            f"Of those, #{ties['preferred'] + 1} uses the fewest axes ({axes(pick['plan'])}) "
            f"and then the least memory ({peak:.1f} GiB per GPU)."
        )
    return [
        f"near-ties: plans {numbers} are within the model's measured error of the fastest "
        f"(+-{ties['mape']:.1%}, leaving each source out, {where}); the model cannot rank them. "
        + order
    ]


def _token_count(tokens: float) -> str:
    """300000000000.0 -> '300B' (the --tokens spelling), 1.5e12 -> '1.5T'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.4g}{suffix}"
    return f"{tokens:.4g}"


def reliability_lines(rel: dict) -> list[str]:
    """The goodput figures of a plan in a few lines (planner.goodput)."""
    without = rel["time_to_train_without_failures_s"] / 86400.0
    usd = (
        (
            f" (${rel['usd_without_failures']:,.0f} -> ${rel['usd']:,.0f}: +${rel['usd_reliability']:,.0f} for "
            f"reliability)"
        )
        if "usd" in rel
        else ""
    )
    spot = (
        f" + {rel['spot_interruptions_per_node_hour']:g} spot reclaims/node-h"
        if rel.get("spot_interruptions_per_node_hour")
        else ""
    )
    return [
        f"goodput {rel['goodput']:.1%}: {rel['expected_interruptions']:.1f} expected interruptions (job MTBF "
        f"{rel['mtbf_hours']:.1f} h{spot}), {rel['lost_hours']:.1f} h lost to rework and restarts, "
        f"{rel['checkpoint_hours']:.1f} h in checkpoints",
        f"checkpoint every {rel['checkpoint_interval_s'] / 60:.1f} min ({rel['checkpoint']} to {rel['storage']}: "
        f"{rel['checkpoint_bytes'] / 1e12:.2f} TB, write {rel['checkpoint_write_s']:.0f} s, stall "
        f"{rel['checkpoint_stall_s']:.1f} s, read {rel['checkpoint_read_s']:.0f} s; "
        f"restart {rel['restart_s']:.0f} s)",
        f"time to train: {without:.1f} days without failures, {rel['time_to_train_s'] / 86400.0:.1f} days with "
        f"them{usd}",
    ]
