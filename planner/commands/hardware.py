"""`planner hardware list | show NAME | calibrate`: the hardware profiles as tables, JSON, and measurements.

A thin shell over `hardware_profiles` (loading and validation) and `planner.calibrate` (measuring).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from hardware_profiles import HardwareProfile, available_profiles, load_profile
from hardware_profiles.loader import profile_to_dict
from planner.commands.common import JsonOpt, emit_json
from planner import calibrate as cal

app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="List, show and calibrate hardware profiles."
)


def _row(p: HardwareProfile) -> dict:
    return {
        "name": p.name,
        "device": p.device,
        "devices_per_node": p.devices_per_node,
        "memory_GiB": round(p.memory_bytes / 2**30, 2),
        "bf16_tflops": p.peak_tflops.get("bf16"),
        "network_Gbps_per_node": p.inter_node_Gbps_per_node,
        "network": p.inter_node_interconnect,
        "price_usd_per_hour": p.price_usd_per_hour,
    }


@app.command("list")
def list_(json_out: JsonOpt = False) -> None:
    """Every profile in hardware_profiles/: device, devices per node, memory, bf16 peak, network, price."""
    rows = [_row(load_profile(name)) for name in available_profiles()]
    if json_out:
        emit_json({"profiles": rows})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Hardware profiles (per device unless noted)")
    for header, justify in (
        ("name", "left"),
        ("device", "left"),
        ("devices/node", "right"),
        ("memory GiB", "right"),
        ("bf16 TFLOP/s", "right"),
        ("network Gbps/node", "right"),
        ("$/h (node)", "right"),
    ):
        table.add_column(header, justify=justify)
    for r in rows:
        table.add_row(
            r["name"],
            r["device"],
            str(r["devices_per_node"]),
            f"{r['memory_GiB']:.2f}",
            "-" if r["bf16_tflops"] is None else f"{r['bf16_tflops']:g}",
            f"{r['network_Gbps_per_node']:g}",
            "-" if r["price_usd_per_hour"] is None else f"{r['price_usd_per_hour']:.2f}",
        )
    Console(width=160).print(table)


@app.command("show")
def show(
    name: Annotated[
        str, typer.Argument(help="Profile name in hardware_profiles/ or a path to a profile file.")
    ],
    json_out: JsonOpt = False,
) -> None:
    """One profile, every number with its unit and its source (--json: the file form, loadable again)."""
    profile = load_profile(name)
    document = profile_to_dict(profile)
    if json_out:
        emit_json(document)
        return
    width = max(len(k) for k in document)
    for key, value in document.items():
        if key in ("sources", "calibration", "schema_version"):
            continue
        shown = (
            ", ".join(f"{k}={v:g}" for k, v in value.items()) if isinstance(value, dict) else value
        )
        typer.echo(f"{key:<{width}}  {shown if shown not in ('', None) else '-'}")
        if key in profile.sources:
            typer.echo(f"{'':<{width}}    source: {profile.sources[key]}")
    if profile.calibration:
        typer.echo(
            f"{'calibration':<{width}}  {profile.calibration.get('command', '')} "
            f"({profile.calibration.get('date', '')}); see `--json` for the points and fits"
        )


@app.command("calibrate")
def calibrate(
    out: Annotated[
        Path, typer.Option("--out", help="Profile file to write.", dir_okay=False)
    ] = Path("cpu-local.json"),
    world_size: Annotated[
        Optional[int], typer.Option("--gpus", min=2, max=64, help="World size (total devices).")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Few, small sizes (seconds, for tests).")
    ] = False,
    name: Annotated[
        str, typer.Option("--name", help="Profile name written in the file.")
    ] = "cpu-local",
    json_out: JsonOpt = False,
) -> None:
    """Measure this machine (GEMM rate, memory copy, collectives over torch.distributed) into a
    profile, with --gpus local ranks (default: the CUDA devices, else the CPU cores, at least 2)."""
    cal.previous_profile(out)  # a --out that cannot be written fails now, not after the work
    import torch

    if world_size is None:
        world_size = (
            torch.cuda.device_count() if torch.cuda.is_available() else (os.cpu_count() or 2)
        )
        world_size = max(2, world_size)
    command = (
        f"planner hardware calibrate --out {shlex.quote(str(out))} --gpus {world_size}"
        + (" --quick" if quick else "")
        + (f" --name {shlex.quote(name)}" if name != "cpu-local" else "")
    )
    typer.echo(
        f"calibrating with {world_size} local ranks{' (quick)' if quick else ''}...", err=True
    )
    doc = cal.calibrate(
        out=out, world_size=world_size, quick=quick, name=name, command=command.strip()
    )
    if json_out:
        emit_json(doc)
        return
    c = doc["calibration"]
    typer.echo(f"wrote {out}")
    for dtype, g in c["gemm"].items():
        typer.echo(
            f"gemm {dtype:<5} best {g['best_measured_tflops'] * 1e3:9.3f} GFLOP/s per rank; fit "
            f"R={g['rate_tflops'] * 1e3:.3f} GFLOP/s, t0={g['overhead_us']:.1f} us "
            f"(rms rel err {g['rms_rel_error']:.2f})"
        )
    typer.echo(f"copy        {c['copy']['GBps']:.2f} GB/s per rank (read + write)")
    for coll, f in c["collectives"].items():
        typer.echo(
            f"{coll:<13} alpha {f['alpha_us']:8.1f} us/step, busbw {f['busbw_GBps']:7.3f} GB/s "
            f"(rms rel err {f['rms_rel_error']:.2f}, {f['points']} sizes)"
            + (
                "  [bandwidth not identified: messages too small]"
                if f["bandwidth_share_at_max"] < 0.05
                else ""
            )
        )
