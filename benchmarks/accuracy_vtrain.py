"""Predicted vs measured step time of vTrain's 1,549 Megatron-DeepSpeed runs (validation/vtrain/).

Bang et al. (MICRO 2024, "vTrain") measured GPT-style models trained with Megatron-DeepSpeed on
A100s: 1,440 configurations on one 8-GPU node (0.2-1.3B parameters, micro-batch 1-8, tp 1-8, pp 1-4)
and 109 on 64 to 512 GPUs (3.6B to 175B). Nothing in the planner was fitted to them: this is a check
of the model on a regime the published collections barely hold (small steps of one node, where the
host and small collectives decide).

Each CSV row becomes a row of validation/published/FORMAT.md (`row_of`, what the release does not
say is listed in `INFERRED`) and is predicted through benchmarks/published_rows.py and
benchmarks/stack_predictions.py, the path of every other published set. The table groups the rows by
node count, tensor degree and micro-batch. `floor_table` prints what the single-node set measures
and what the model predicts per block execution (step time over (m + pp - 1) x blocks per stage),
the figure docs/cost-model.md discusses.

Run: .venv/bin/python benchmarks/accuracy_vtrain.py (writes benchmarks/results/accuracy_vtrain.json)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.published_rows import Case, config_of, hardware, options_of, spec_of  # noqa: E402
from benchmarks.stack_predictions import Result, predict, summary  # noqa: E402
from planner.exports.megatron import padded_vocab  # noqa: E402

DATA = ROOT / "validation" / "vtrain"
FILES = {"single": DATA / "ground_truth_single.csv", "multi": DATA / "ground_truth_multi.csv"}
RESULTS = ROOT / "benchmarks" / "results" / "accuracy_vtrain.json"
HARDWARE = {"single": "dgx-a100-80g", "multi": "vtrain-a100-800g"}
"""The single node is an NVSwitch A100 node (its all-reduce tables, validation/vtrain/README.md);
the multi-node runs had 800 Gb/s per node (validation/hardware/clusters/vtrain-a100-800g.json)."""
GPT2_VOCAB = 50257
"""GPT-2's vocabulary; Megatron pads it (planner.exports.megatron.padded_vocab)."""
INFERRED = {
    "framework": "validation/vtrain/README.md: Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed)",
    "precision": "fp16 (Megatron-DeepSpeed's GPT examples; the release does not say)",
    "recompute": "full: use_checkpoint is true in every released configuration",
    "attention": "unfused: Megatron-DeepSpeed's default (use_flash_attn off)",
    "zero": "0 (DeepSpeed's default; the release does not say)",
    "dropout": "on: Megatron-DeepSpeed's defaults (--hidden-dropout and --attention-dropout 0.1), "
    "and vTrain's traced model applies 0.1 in both places (src/model/gpt_modeling.py)",
    "arch": "GPT-2 blocks (vTrain's ShardedGptModel): learned positions, LayerNorm, GeLU, biases, "
    "tied embeddings, ffn 4 h, vocabulary 50257 padded by Megatron",
    "schedule": "1f1b (pipeline_scheduling in every configuration)",
}
COLUMNS = (
    "gpus",
    "global_batch",
    "micro_batch",
    "hidden",
    "heads",
    "layers",
    "seq",
    "tp",
    "dp",
    "pp",
)


def measured_rows(which: str) -> list[dict]:
    """The CSV's rows as published: the columns above and `step_s` (its iteration time in ms /
    1000)."""
    out = []
    with open(FILES[which], encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        next(reader)
        for line in reader:
            values = (
                line[1:] if which == "multi" else line
            )  # multi starts with the size in billions
            out.append(
                {
                    **dict(zip(COLUMNS, (int(v) for v in values[:10]))),
                    "step_s": float(values[10]) / 1000,
                }
            )
    return out


def row_of(which: str, index: int, m: dict) -> dict:
    """One measured run as a row of validation/published/FORMAT.md."""
    h = m["hidden"]
    return {
        "id": f"vtrain-{which}-{index:04d}",
        "source_id": f"vtrain-{which}",
        "framework": "deepspeed",
        "model": None,
        "arch": {
            "model_type": "gpt2",
            "layers": m["layers"],
            "hidden": h,
            "heads": m["heads"],
            "kv_heads": m["heads"],
            "head_dim": h // m["heads"],
            "ffn": 4 * h,
            "vocab": padded_vocab(GPT2_VOCAB, m["tp"]),
            "position": "learned",
            "gated_mlp": False,
            "activation": "gelu",
            "norm": "layernorm",
            "tied_embeddings": True,
            "qkv_bias": True,
            "out_bias": True,
            "mlp_bias": True,
        },
        "hardware": HARDWARE[which],
        "gpus": m["gpus"],
        **{k: m[k] for k in ("dp", "tp", "pp", "micro_batch", "global_batch", "seq")},
        "cp": 1,
        "ep": 1,
        "dp_shard": m["dp"],
        "zero": 0,
        "virtual_stages": 1,
        "schedule": "1f1b",
        "recompute": "full",
        "sequence_parallel": False,
        "precision": "amp-fp16",
        "attention": "unfused",
        "compile": False,
        "offload": "none",
        "extras": {"dropout": True},
        "measured": {"iteration_time_s": m["step_s"]},
        "trained": True,
        "inferred": INFERRED,
    }


def cases(which: str) -> list[Case]:
    out = []
    for i, m in enumerate(measured_rows(which)):
        row = row_of(which, i, m)
        out.append(
            Case(
                row=row,
                file=f"vtrain-{which}",
                spec=spec_of(row),
                hardware=hardware(row["hardware"]),
                config=config_of(row),
                options=options_of(row),
                measured_s=m["step_s"],
            )
        )
    return out


def block_executions(row: dict) -> int:
    """Blocks one pipeline rank runs per step under 1F1B, counting each micro-batch's forward and
    backward as one execution: (m + pp - 1) x blocks per stage (m micro-batches per step)."""
    m = row["global_batch"] // (row["micro_batch"] * row["dp"])
    return (m + row["pp"] - 1) * row["arch"]["layers"] // row["pp"]


def floor_table(single: list[Case], results: dict) -> dict:
    """Per (hidden, micro-batch, tp): the median ms per block execution on one node, measured and
    predicted (results: id -> Result)."""
    groups: dict = {}
    for c in single:
        key = (c.row["arch"]["hidden"], c.row["micro_batch"], c.row["tp"])
        per_block = 1e3 / block_executions(c.row)
        predicted = results[c.id].predicted_s
        groups.setdefault(key, []).append(
            (c.measured_s * per_block, None if predicted is None else predicted * per_block)
        )
    out = {}
    for (h, b, t), pairs in sorted(groups.items()):
        predicted = [p for _, p in pairs if p is not None]
        out[f"h{h} mb{b} tp{t}"] = {
            "measured": statistics.median(m for m, _ in pairs),
            "predicted": statistics.median(predicted) if predicted else None,
        }
    return out


BANDS = {
    "node": lambda r: "1 node (8 GPUs or fewer)" if r["gpus"] <= 8 else "64-512 GPUs",
    "tp": lambda r: f"tp {r['tp']}",
    "micro_batch": lambda r: f"micro-batch {r['micro_batch']}",
}
"""How the table groups the rows: by node count (all rows), by tp and micro-batch (one node)."""


def band(results: list[Result], rows: dict, name: str) -> dict:
    """Summaries of `results` grouped by BANDS[name] (rows: id -> FORMAT row)."""
    grouped: dict = {}
    for res in results:
        grouped.setdefault(BANDS[name](rows[res.id]), []).append(res)
    return {k: summary(v) for k, v in sorted(grouped.items())}


def table(report: dict) -> str:
    lines = [f"{'rows':34} {'n':>5} {'MAPE':>7} {'mean':>7} {'no fit':>7}"]
    for name, group in report["bands"].items():
        if name != "node":
            lines.append(f"-- by {name.replace('_', ' ')}, single node")
        for label, s in group.items():
            lines.append(
                f"{label:34} {s['predicted']:5} {100 * s['mape']:6.1f}% {100 * s['mean']:+6.1f}%"
                f" {s['trained_predicted_not_to_fit']:7}"
            )
    all_ = report["all"]
    lines.append(
        f"{'all':34} {all_['predicted']:5} {100 * all_['mape']:6.1f}% {100 * all_['mean']:+6.1f}%"
        f" {all_['trained_predicted_not_to_fit']:7}"
    )
    lines.append("ms per block execution, single node (median): measured, predicted")
    for k, v in report["floor_ms_per_block_execution"].items():
        predicted = "-" if v["predicted"] is None else f"{v['predicted']:6.2f}"
        lines.append(f"  {k:16} {v['measured']:6.2f} {predicted:>6}")
    return "\n".join(lines)


def run(write: bool = True) -> dict:
    single, multi = cases("single"), cases("multi")
    rows = {c.id: c.row for c in single + multi}
    results = {c.id: predict(c) for c in single + multi}
    singles = [results[c.id] for c in single]
    report = {
        "source": "VIA-Research/vTrain f8dda84 data/ground_truth_{single,multi}.csv (MIT)",
        "inferred": INFERRED,
        "all": summary(list(results.values())),
        "bands": {
            "node": band(list(results.values()), rows, "node"),
            "tp": band(singles, rows, "tp"),
            "micro_batch": band(singles, rows, "micro_batch"),
        },
        "floor_ms_per_block_execution": floor_table(single, results),
        "rows": {
            k: {"measured_s": r.measured_s, "predicted_s": r.predicted_s, "fits": r.fits}
            for k, r in results.items()
        },
    }
    if write:
        RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    print(table(run(write=not args.no_write)))


if __name__ == "__main__":
    main()
