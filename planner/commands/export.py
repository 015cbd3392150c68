"""`planner export PLAN.json --format torchtitan|megatron|fsdp|deepspeed|sagemaker|sagemaker-v1 [--out FILE]`
(docs/exports.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.commands.common import PlanArg
from planner import io
from planner.exports import export_plan
from planner.plan import load_plan

FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="torchtitan (0.3 Python job module), megatron "
        "(pretrain_gpt.py arguments), fsdp (Accelerate FSDP/DDP YAML + TrainingArguments), deepspeed (config JSON), sagemaker (SMP v2 for "
        "SDK v3, JSON) or sagemaker-v1 (SMP v1 distribution for SDK v2, JSON).",
    ),
]
OutOpt = Annotated[
    Optional[Path], typer.Option("--out", help="Write the configuration here instead of stdout.")
]


def export(plan: PlanArg, format: FormatOpt, out: OutOpt = None) -> None:
    """Translate a plan into a torchtitan, Megatron-LM, Accelerate FSDP, DeepSpeed or SageMaker configuration (notes on stderr)."""
    if out is not None:
        io.check_writable(out, "--out", inputs=((plan, "plan"),))
    result = export_plan(load_plan(plan), format)
    if out is None:
        typer.echo(result.text, nl=False)
    else:
        io.write_text(out, result.text, "--out")
        typer.echo(f"wrote {result.format} configuration to {out}", err=True)
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
