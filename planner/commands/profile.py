"""`planner profile MODEL [--seq S] [--micro-batch B] [--precision P] [--json]`.

Parameters, forward/backward FLOPs and activation bytes (recompute none/selective/full) of one
micro-batch, in total and per layer; for mixture-of-experts models also the active parameters per
token, and for every transformer the training FLOPs per token (JSON keys params_active,
params_active_without_input_embedding, params_mtp, flops_per_token; docs/models.md). A thin shell over
`planner.profiler.profile_model`: the table (stderr with --json suppressed) and the JSON document are
printed from the same ModelProfile.
"""

from __future__ import annotations

from typing import Annotated

import typer

from planner.commands.common import (
    run_options_of,
    MAX_WORLD_SIZE,
    ActivationFp8InputOpt,
    AttentionOpt,
    FrameworkOpt,
    JsonOpt,
    LossOpt,
    MicroBatchOpt,
    ModelArg,
    PrecisionOpt,
    RecomputeModulesOpt,
    SeqOpt,
    emit_json,
)
from planner.profiler import profile_model
from planner.sources import default_framework

DropoutFlag = Annotated[
    bool, typer.Option("--dropout/--no-dropout", help="Dropout layers active (masks saved).")
]
ZeroOpt = Annotated[
    int,
    typer.Option(
        "--zero",
        min=0,
        max=3,
        help="ZeRO stage the plan shards with: from 2 on, FSDP's mixed precision runs "
        "Hugging Face (eager) modules on 16-bit weights, which changes what they save.",
    ),
]


TpOpt = Annotated[
    int,
    typer.Option(
        "--tp",
        min=1,
        max=MAX_WORLD_SIZE,
        help="Tensor-parallel degree: activation bytes per rank of the group.",
    ),
]
SpFlag = Annotated[
    bool,
    typer.Option("--sequence-parallel", help="Megatron sequence parallelism over the tp group."),
]


def profile(
    model: ModelArg,
    seq: SeqOpt = None,
    micro_batch: MicroBatchOpt = 1,
    precision: PrecisionOpt = "amp-bf16",
    framework: FrameworkOpt = None,
    attention: AttentionOpt = None,
    dropout: DropoutFlag = False,
    zero: ZeroOpt = 0,
    tp: TpOpt = 1,
    sequence_parallel: SpFlag = False,
    loss: LossOpt = None,
    recompute_modules: RecomputeModulesOpt = None,
    activation_fp8_input: ActivationFp8InputOpt = False,
    json: JsonOpt = False,
) -> None:
    """Parameters, FLOPs and activation bytes per layer for one micro-batch, on a framework's kernels (with the
    run options estimate takes, the same bytes estimate reports)."""
    options = run_options_of(locals())  # first: locals() are the parameters alone

    result = profile_model(
        model,
        seq=seq,
        micro_batch=micro_batch or 1,
        precision=precision,
        framework=default_framework(model, framework),
        zero=zero,
        tp=tp,
        sp=sequence_parallel,
        options=options,
    )
    if json:
        emit_json(result.to_dict())
        return
    render(result)


def _si(value: float, unit: str = "") -> str:
    for factor, prefix in (
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _bytes(value: float) -> str:
    for factor, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{int(value)} B"


def _collapse(layers):
    """Runs of identical blocks shown as one row 'layers.0-95 (x96)'."""
    rows, i = [], 0
    while i < len(layers):
        j = i
        key = lambda u: (
            u.kind,
            u.params,
            u.flops_fwd,
            u.flops_bwd,
            tuple(u.activation_bytes.items()),
        )  # noqa: E731
        while (
            j + 1 < len(layers)
            and layers[j + 1].kind in ("block", "encoder_block")
            and key(layers[j + 1]) == key(layers[i])
        ):
            j += 1
        name = (
            layers[i].name if j == i else f"{layers[i].name}..{layers[j].name.rsplit('.', 1)[-1]}"
        )
        rows.append((name, j - i + 1, layers[i]))
        i = j + 1
    return rows


def render(result) -> None:
    """The human table (rich) on stdout."""
    from rich.console import Console
    from rich.table import Table

    model = result.model
    title = (
        f"{model['name']}: {_si(result.params)} params, micro-batch {result.micro_batch} x seq {result.seq}, "
        f"{result.precision}, {'flash' if result.flash else 'math'} attention, {result.framework} kernels "
        f"({result.method})" + run_options(result.extra)
    )
    table = Table(title=title, show_lines=False)
    for column in (
        "layer",
        "kind",
        "count",
        "params",
        "fwd FLOPs",
        "bwd FLOPs",
        "act none",
        "act selective",
        "act full",
    ):
        table.add_column(column, justify="left" if column in ("layer", "kind") else "right")
    for name, count, unit in _collapse(result.layers):
        a = unit.activation_bytes
        table.add_row(
            name,
            unit.kind,
            str(count),
            _si(unit.params),
            _si(unit.flops_fwd),
            _si(unit.flops_bwd),
            _bytes(a.get("none", 0)),
            _bytes(a.get("selective", 0)),
            _bytes(a.get("full", 0)),
        )
    table.add_row(
        "total",
        "",
        str(len(result.layers)),
        _si(result.params),
        _si(result.flops_fwd),
        _si(result.flops_bwd),
        _bytes(result.activation_bytes("none")),
        _bytes(result.activation_bytes("selective")),
        _bytes(result.activation_bytes("full")),
        style="bold",
    )
    console = Console(width=160)
    console.print(table)
    if "model_flops" in result.extra:
        console.print(
            f"model FLOPs per micro-batch (6 N tokens + attention, for MFU): {_si(result.extra['model_flops'])}"
        )
    for line in summary_lines(result):
        console.print(line)


def run_options(extra: dict) -> str:
    """The run options the activation bytes follow, where not the defaults: ', per rank of tp 8 with SP, loss
    inplace, recomputing mlp, SwiGLU input in FP8'."""
    sw, parts = extra.get("software") or {}, []
    if extra.get("tp", 1) > 1:
        parts.append(
            f"per rank of tp {extra['tp']}" + (" with SP" if extra.get("sequence_parallel") else "")
        )
    if extra.get("zero"):
        parts.append(f"ZeRO {extra['zero']}")
    if sw.get("recompute_modules"):
        parts.append("selective recomputes " + ", ".join(sw["recompute_modules"]))
    if sw.get("activation_fp8_input"):
        parts.append("SwiGLU input kept in FP8")
    if sw.get("loss"):
        parts.append(f"loss {sw['loss']}")
    return "".join(", " + p for p in parts)


def summary_lines(result) -> list[str]:
    """Parameter and per-token FLOP lines under the table: total and active parameters of a
    mixture-of-experts model (cost_models.params.active_params, both publisher conventions) and its MTP
    modules, and the training FLOPs per token (cost_models.flops.flops_per_token)."""
    extra, lines = result.extra, []
    if result.model.get("moe"):
        active, without = extra["params_active"], extra["params_active_without_input_embedding"]
        lines.append(
            f"parameters: {_si(result.params)} total, {_si(active)} active per token "
            f"({_si(without)} without the input embedding)"
        )
    if extra.get("params_mtp"):
        lines.append(
            f"multi-token prediction modules: {_si(extra['params_mtp'])} more parameters (not in the total)"
        )
    if "flops_per_token" in extra:
        lines.append(
            f"training FLOPs per token at seq {result.seq} (6 N_active + attention): "
            f"{_si(extra['flops_per_token'])}"
        )
    return lines
