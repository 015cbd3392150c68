"""Arguments shared by commands (docs/cli-contract.md, 'Arguments shared by commands'), declared once."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

ModelArg = Annotated[str, typer.Argument(
    help="Catalog name (e.g. gpt3-175b), a Hugging Face config.json path, or package.module:factory.")]
HardwareOpt = Annotated[str, typer.Option("--hardware", help="Profile name in hardware_profiles/ or a path to a profile file.")]
GpusOpt = Annotated[Optional[int], typer.Option("--gpus", min=1, help="World size (total devices).")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", min=1, help="Nodes; world size = nodes x devices per node.")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq", min=1, help="Sequence length (default: the model's).")]
GlobalBatchOpt = Annotated[Optional[int], typer.Option("--global-batch", min=1, help="Sequences per optimizer step.")]
MicroBatchOpt = Annotated[Optional[int], typer.Option("--micro-batch", min=1, help="Sequences per micro-batch.")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="fp32, amp-bf16, amp-fp16 or bf16.")]
HwPrecisionOpt = Annotated[Optional[str], typer.Option(
    "--precision", help="fp32, amp-bf16, amp-fp16 or bf16 (default: amp-bf16, or amp-fp16 on devices without bf16).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adamw or sgd.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document to stdout and nothing else there.")]
PlanArg = Annotated[Path, typer.Argument(help="A plan JSON file written by `recommend --out` or `estimate --json`.")]


def emit_json(document: dict, what: str = "--json output") -> None:
    """The one JSON document on stdout (--json): strict JSON, or one error line and nothing on stdout
    when a number is not finite (planner.io.dumps_strict)."""
    from planner.io import dumps_strict

    sys.stdout.write(dumps_strict(document, what) + "\n")
