"""`planner estimate MODEL --hardware HW --gpus N|--nodes K --dp D --tp T --pp P [...]`: one configuration.

A thin shell over `planner.estimate.estimate`: the rich tables and the `--json` plan document are
printed, on stdout, from the same Estimate. A configuration that does not fit is still
evaluated (exit 0, fits false); bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from planner.commands.common import (
    run_options_of,
    MAX_WORLD_SIZE,
    AttentionOpt,
    DropoutOpt,
    FrameworkOpt,
    GlobalBatchOpt,
    GpusOpt,
    GradReduceOpt,
    Fp8ParamGatherOpt,
    Fp8ScalingOpt,
    MasterWeightsOpt,
    KernelsOpt,
    RecomputeModulesOpt,
    Bf16OptimizerOpt,
    ActivationFp8InputOpt,
    LossOpt,
    TrainMetricsOpt,
    MoeDispatcherOpt,
    MoeA2aOverlapOpt,
    MoeImbalanceOpt,
    TpCommOverlapOpt,
    OverlapGradReduceOpt,
    OverlapParamGatherOpt,
    OverlapP2pOpt,
    CudaGraphsOpt,
    HardwareOpt,
    JsonOpt,
    MicroBatchOpt,
    ModelArg,
    NodesOpt,
    OptimizerOpt,
    HwPrecisionOpt,
    SeqOpt,
    emit_json,
)
from planner.errors import ConfigError
from frameworks import load_framework
from frameworks.rules import framework_placement
from planner.option_rules import check_options
from planner.io import check_finite
from hardware_profiles import load_profile
from planner.estimate import estimate as run_estimate
from planner.explain import expert_lines
from planner.parallel import ParallelConfig
from planner.search import default_global_batch as default, model_params
from planner.uncertainty import with_bands
from planner.sources import default_framework, resolve_model
from cost_models.compute import resolve_precision

DegreeOpt = lambda flag, what: Annotated[
    int, typer.Option(flag, min=1, max=MAX_WORLD_SIZE, help=what)
]  # noqa: E731
ScheduleOpt = Annotated[
    Optional[str],
    typer.Option(
        "--schedule",
        help="gpipe, 1f1b, interleaved-1f1b or zero-bubble (default: 1f1b, interleaved with --virtual-stages > 1).",
    ),
]
VirtualOpt = Annotated[
    int,
    typer.Option(
        "--virtual-stages",
        min=1,
        max=MAX_WORLD_SIZE,
        help="Model chunks per pipeline rank (interleaved-1f1b).",
    ),
]
ZeroOpt = Annotated[
    int, typer.Option("--zero", min=0, max=3, help="ZeRO stage 0, 1, 2 or 3 (sharded over dp).")
]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="none, selective or full.")]
RecomputeLayersOpt = Annotated[
    Optional[int],
    typer.Option(
        "--recompute-layers",
        min=1,
        help="With --recompute full: recompute only this many blocks of each pipeline chunk "
        "(the first ones; Megatron-Core's --recompute-method block "
        "--recompute-num-layers); default every block.",
    ),
]
OffloadOpt = Annotated[
    str,
    typer.Option("--offload", help="none, optimizer, activations or optimizer+activations (both)."),
]
SpOpt = Annotated[
    bool,
    typer.Option("--sequence-parallel", help="Megatron sequence parallelism over the tp group."),
]
PlacementOpt = Annotated[
    Optional[str],
    typer.Option(
        "--placement",
        help="Order of the axes D, P, T (and C, E when used), outermost first; the right-most letter gets "
        "adjacent ranks (default DPT, with C just before T when cp > 1).",
    ),
]
CpCommOpt = Annotated[
    str,
    typer.Option(
        "--cp-comm",
        help="Context-parallel key/value exchange: p2p (ring), all_gather or a2a (Ulysses).",
    ),
]
DpShardOpt = Annotated[
    int,
    typer.Option(
        "--dp-shard",
        min=0,
        max=MAX_WORLD_SIZE,
        help="ZeRO/FSDP shard group (hybrid sharding when < dp); 0: all dp ranks.",
    ),
]
StagesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--stages",
        help="Blocks per pipeline stage, comma-separated (pp x virtual-stages entries); default even.",
    ),
]


def parse_stages(text: str | None) -> tuple[int, ...]:
    """'20,19,19' -> (20, 19, 19)."""
    if not text:
        return ()
    try:
        stages = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(
            "stages", text, "comma-separated positive integers, e.g. 20,19,19"
        ) from None
    if min(stages) < 1:
        raise ConfigError("stages", text, "comma-separated positive integers, e.g. 20,19,19")
    return stages


def world_size(hw, gpus: int | None, nodes: int | None) -> int:
    """--gpus N, or --nodes K (K x devices per node); exactly one of them."""
    if gpus is not None and nodes is not None:
        if gpus != nodes * hw.devices_per_node:
            raise ConfigError(
                "gpus",
                gpus,
                f"nodes({nodes}) x devices_per_node({hw.devices_per_node}) = "
                f"{nodes * hw.devices_per_node}, or give only one of --gpus/--nodes",
            )
        return gpus
    if gpus is None and nodes is None:
        raise ConfigError("gpus", None, "--gpus N or --nodes K")
    return gpus if gpus is not None else nodes * hw.devices_per_node


def default_global_batch(gpus: int, seq: int, per_step: int, params: int | None = None) -> int:
    """About 2M tokens (planner.search's default; a few sequences per rank for a tiny model), a
    multiple of
    dp * micro_batch."""
    g = default(gpus, seq, params)
    return per_step * math.ceil(g / per_step)


def estimate(
    model: ModelArg,
    hardware: HardwareOpt,
    gpus: GpusOpt = None,
    nodes: NodesOpt = None,
    dp: DegreeOpt("--dp", "Data-parallel degree.") = 1,
    tp: DegreeOpt("--tp", "Tensor-parallel degree.") = 1,
    pp: DegreeOpt("--pp", "Pipeline-parallel degree.") = 1,
    cp: DegreeOpt("--cp", "Context-parallel degree (each sequence split over cp ranks).") = 1,
    cp_comm: CpCommOpt = "p2p",
    dp_shard: DpShardOpt = 0,
    ep: DegreeOpt("--ep", "Expert-parallel degree (mixture-of-experts).") = 1,
    expert_tp: DegreeOpt("--expert-tp", "Tensor parallelism inside each expert.") = 1,
    micro_batch: MicroBatchOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq: SeqOpt = None,
    schedule: ScheduleOpt = None,
    virtual_stages: VirtualOpt = 1,
    zero: ZeroOpt = 0,
    recompute: RecomputeOpt = "none",
    recompute_layers: RecomputeLayersOpt = None,
    offload: OffloadOpt = "none",
    sequence_parallel: SpOpt = False,
    placement: PlacementOpt = None,
    precision: HwPrecisionOpt = None,
    optimizer: OptimizerOpt = "adamw",
    framework: FrameworkOpt = None,
    attention: AttentionOpt = None,
    dropout: DropoutOpt = None,
    grad_reduce_dtype: GradReduceOpt = None,
    fp8_scaling: Fp8ScalingOpt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    master_weights: MasterWeightsOpt = None,
    kernels: KernelsOpt = None,
    stages: StagesOpt = None,
    recompute_modules: RecomputeModulesOpt = None,
    bf16_optimizer: Bf16OptimizerOpt = False,
    activation_fp8_input: ActivationFp8InputOpt = False,
    loss: LossOpt = None,
    train_metrics: TrainMetricsOpt = None,
    moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeA2aOverlapOpt = None,
    moe_imbalance: MoeImbalanceOpt = None,
    tp_comm_overlap: TpCommOverlapOpt = None,
    overlap_grad_reduce: OverlapGradReduceOpt = None,
    overlap_param_gather: OverlapParamGatherOpt = None,
    overlap_p2p: OverlapP2pOpt = None,
    cuda_graphs: CudaGraphsOpt = None,
    json: JsonOpt = False,
) -> None:
    """Predict step time and peak memory of one parallel configuration."""
    options = run_options_of(locals())  # first: locals() are the parameters alone

    check_options(**options.chosen(), precision=precision, recompute=recompute, framework=framework)
    hw = load_profile(hardware)
    n = world_size(hw, gpus, nodes)
    spec = resolve_model(model, seq=seq)
    s = seq or spec.seq
    b = micro_batch or 1
    g = global_batch or default_global_batch(n, s, dp * b, model_params(spec))
    precision = resolve_precision(hw, precision)
    cfg = ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch=b,
        global_batch=g,
        schedule=schedule or ("interleaved-1f1b" if virtual_stages > 1 else "1f1b"),
        virtual_stages=virtual_stages,
        zero=zero,
        recompute=recompute,
        recompute_layers=recompute_layers,
        offload=offload,
        sequence_parallel=sequence_parallel,
        placement=placement
        or framework_placement(load_framework(default_framework(model, framework)), cp=cp, ep=ep),
        precision=precision,
        optimizer=optimizer,
        seq=s,
        stages=parse_stages(stages),
        framework=default_framework(model, framework),
        cp=cp,
        cp_comm=cp_comm,
        dp_shard=dp_shard,
        ep=ep,
        expert_tp=expert_tp,
    )
    est = run_estimate(spec, hw, cfg, gpus=n, options=options)
    document = with_bands([est.to_document()])[0]  # the step's measured error (uncertainty)
    if json:
        emit_json(document)
        return
    check_finite(document, "estimate")
    render(document)


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f} GiB"


def render(doc: dict) -> None:
    """Time and memory breakdown tables: the result, on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    plan, pred, mem = doc["plan"], doc["prediction"], doc["prediction"]["memory"]
    console.print(
        f"[bold]{doc['model']['name']}[/] ({doc['model']['params'] / 1e9:.2f} B params) on "
        f"{doc['hardware']['gpus']} x {doc['hardware']['name']}: dp={plan['dp']} tp={plan['tp']} "
        f"pp={plan['pp']} mb={plan['micro_batch']} gb={plan['global_batch']} m={plan['num_microbatches']} "
        f"{plan['schedule']} v={plan['virtual_stages']} zero={plan['zero']} recompute={plan['recompute']}"
        + (
            ""
            if plan.get("recompute_layers") is None
            else f" ({plan['recompute_layers']} per chunk)"
        )
        + f" sp={plan['sequence_parallel']} {plan['placement']} {plan['precision']} "
        f"framework={plan.get('framework', 'megatron')}"
        + (
            f" ep={plan['ep']} expert_tp={plan['expert_tp']}"
            if plan.get("ep", 1) > 1 or plan.get("expert_tp", 1) > 1
            else ""
        )
    )
    t = Table(title="time per step")
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k, val in pred["time_breakdown_s"].items():
        t.add_row(
            k,
            f"{val:.4f}",
            "" if k.endswith("of_compute") else f"{val / pred['step_time_s'] * 100:.1f}%",
        )
    t.add_row("[bold]step", f"[bold]{pred['step_time_s']:.4f}", "")
    band = pred.get("uncertainty")
    if band is not None:  # planner.uncertainty: the measured error of such steps
        low, high = band["step_time_s"]
        t.add_row("measured error", f"{low:.4f}-{high:.4f}", f"+-{band['mape'] * 100:.1f}%")
    console.print(t)
    mt = Table(title="memory per GPU (peak rank)")
    mt.add_column("term")
    mt.add_column("bytes", justify="right")
    for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
        mt.add_row(k.removesuffix("_bytes"), _gib(mem[k]))
    mt.add_row("[bold]peak", f"[bold]{_gib(mem['peak_bytes_per_gpu'])}")
    mt.add_row("needed", _gib(mem["needed_bytes"]))
    mt.add_row("capacity", _gib(mem["capacity_bytes"]))
    console.print(mt)
    fit = "[green]fits" if mem["fits"] else "[red]does NOT fit"
    console.print(
        f"{fit}[/]; {pred['tokens_per_s']:,.0f} tokens/s, {pred['tflops_per_gpu']:.1f} TFLOP/s per GPU, "
        f"MFU {pred['mfu'] * 100:.1f}%"
    )
    # the fit margin (cost_models.memory.needed_bytes) and where the software choices came from
    console.print(
        f"needed = peak x (1 + allocator overhead) + CUDA context: margin {_gib(mem['margin_bytes'])}",
        highlight=False,
    )
    sw = doc.get("software", {})
    if sw:
        taken = set(sw.get("from_config", ()))
        said = lambda key, text: text + (" (from config)" if key in taken else "")  # noqa: E731
        console.print(
            f"software: {sw['framework']} ({sw['kernels']} kernels), "
            + said("attention", f"attention {sw['attention']}")
            + ", "
            + said("dropout", f"dropout {'on' if sw['dropout'] else 'off'}")
            + (
                ", master weights as 16-bit remainders"
                if sw.get("master_weights") == "remainder"
                else ""
            )
            + (
                f", recomputing {', '.join(sw['recompute_modules'])}"
                if sw.get("recompute_modules")
                else ""
            )
            + (", DeepSpeed BF16_Optimizer" if sw.get("bf16_optimizer") else "")
            + (", SwiGLU input kept in FP8" if sw.get("activation_fp8_input") else "")
            + (f", loss {sw['loss']}" if sw.get("loss") else "")
            + (f", {sw['train_metrics']} train metrics" if sw.get("train_metrics") else ""),
            highlight=False,
        )
    if pred.get("expert_parallel"):
        for line in expert_lines(doc):
            console.print(line, highlight=False)
