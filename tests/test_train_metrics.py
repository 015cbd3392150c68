"""A trainer's train metrics over the logits (RunOptions.train_metrics): Composer updates every
train metric on every micro-batch after its backward (Trainer._train_microbatch ->
_eval_train_metrics), and llm-foundry's MPT logs two, LanguageCrossEntropy and
LanguagePerplexity, each a torch CrossEntropyLoss over the whole logits under autocast.

Expected bytes come from what that kernel does: the 16-bit logits read (2 bytes) and written as an
fp32 copy (4), then log_softmax over rows longer than on-chip memory reads them twice (max, sum)
and writes its output (4 + 4 + 4): 18 bytes per vocabulary entry and metric. The bandwidth and
the stack's rate are read from the shipped data files, not from the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.published_rows import options_of
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.plan import run_options
from planner.run_options import RunOptions
from planner.sources import resolve_model

ROOT = Path(__file__).resolve().parents[1]
HW_FILE = json.loads((ROOT / "hardware_profiles" / "p4d.24xlarge.json").read_text())
FSDP_FILE = json.loads((ROOT / "frameworks" / "fsdp.json").read_text())
SPEC = resolve_model("gpt2")
BYTES_PER_ENTRY_AND_METRIC = 2 + 4 + 4 + 4 + 4


def one_gpu(metrics: int | None, *, micro_batch: int = 8, m: int = 4):
    """gpt2 on one A100 of a p4d under the fsdp stack, `m` micro-batches of `micro_batch` x 1024."""
    cfg = ParallelConfig(
        dp=1,
        tp=1,
        pp=1,
        micro_batch=micro_batch,
        global_batch=micro_batch * m,
        seq=1024,
        precision="amp-bf16",
        framework="fsdp",
    )
    options = RunOptions(train_metrics=metrics)
    return estimate(SPEC, "p4d.24xlarge", cfg, gpus=1, options=options)


def expected_metric_seconds(metrics: int, tokens_per_step: int) -> float:
    bandwidth = HW_FILE["memory_bandwidth_GBps"] * 1e9
    bandwidth *= HW_FILE["efficiency"]["elementwise_bandwidth_fraction"]
    entries = tokens_per_step * SPEC.vocab
    return (
        metrics * BYTES_PER_ENTRY_AND_METRIC * entries / bandwidth / FSDP_FILE["compute_efficiency"]
    )


@pytest.mark.parametrize("metrics", [1, 2, 3])
def test_each_metric_streams_the_logits_once_more_per_micro_batch(metrics):
    base, more = one_gpu(None), one_gpu(metrics)
    added = more.step_time_s - base.step_time_s
    assert added == pytest.approx(expected_metric_seconds(metrics, 4 * 8 * 1024), rel=1e-9)


def test_the_cost_follows_the_tokens_not_the_micro_batches():
    def added(micro_batch, m):
        return (
            one_gpu(2, micro_batch=micro_batch, m=m).step_time_s
            - one_gpu(0, micro_batch=micro_batch, m=m).step_time_s
        )

    assert added(8, 4) == pytest.approx(added(16, 2), rel=1e-9) and added(8, 4) > 0


def test_a_host_bound_step_runs_the_metrics_in_the_hosts_wait():
    """At micro-batch 1 the eager stack's host issues kernels slower than gpt2's device runs them:
    the metrics' device time fills that wait and the step stays as long (cost_models.timeline)."""
    base, more = one_gpu(0, micro_batch=1, m=4), one_gpu(2, micro_batch=1, m=4)
    wait = base.time_breakdown_s()["host_wait"]
    device = expected_metric_seconds(2, 4 * 1024)
    assert device < wait and more.step_time_s == pytest.approx(base.step_time_s, rel=1e-12)
    assert more.time_breakdown_s()["host_wait"] == pytest.approx(wait - device, rel=1e-9)


def test_zero_is_the_default_and_the_plan_records_the_choice():
    assert one_gpu(None).step_time_s == one_gpu(0).step_time_s
    doc = one_gpu(2).to_document()
    assert doc["software"]["train_metrics"] == 2
    assert run_options(doc).train_metrics == 2
    assert run_options(one_gpu(None).to_document()).train_metrics is None


@pytest.mark.parametrize("bad", [-1, 9, 2.0, True, "2"])
def test_the_api_refuses_what_is_not_a_count(bad):
    with pytest.raises(ConfigError, match="train_metrics"):
        one_gpu(bad)


def _command(*extra: str):
    args = ["estimate", "gpt2", "--hardware", "p4d.24xlarge", "--gpus", "1", "--dp", "1"]
    args += ["--framework", "fsdp", "--micro-batch", "8", "--global-batch", "32", *extra]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("bad", ["-1", "9"])
def test_the_command_line_refuses_a_count_out_of_range_in_one_line(bad):
    result = _command("--train-metrics", bad)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "train_metrics" in lines[0] and "0 to 8" in lines[0]


def test_the_command_line_costs_and_reports_the_metrics():
    plain = json.loads(_command("--json").output)
    metered = json.loads(_command("--train-metrics", "2", "--json").output)
    assert metered["software"]["train_metrics"] == 2
    tokens = plain["plan"]["global_batch"] * plain["plan"]["seq"]
    added = metered["prediction"]["step_time_s"] - plain["prediction"]["step_time_s"]
    assert added == pytest.approx(expected_metric_seconds(2, tokens), rel=1e-9)


def test_a_published_row_says_its_metrics_in_extras():
    row = {"extras": {"train_metrics": 2}, "framework": "fsdp"}
    assert options_of(row).train_metrics == 2
    assert options_of({"extras": {}, "framework": "fsdp"}).train_metrics is None


def test_every_llm_foundry_row_runs_composers_two_metrics():
    runs = json.loads((ROOT / "validation" / "published" / "fsdp.json").read_text())["runs"]
    foundry = [r for r in runs if r["source_id"].startswith("llmfoundry")]
    assert foundry and all(r["extras"]["train_metrics"] == 2 for r in foundry)
    others = [r for r in runs if not r["source_id"].startswith("llmfoundry")]
    assert not any((r.get("extras") or {}).get("train_metrics") for r in others)


def test_after_the_backward_the_metrics_hold_the_logits_and_two_fp32_copies():
    """With full recomputation (little saved) gpt2's peak is the metrics' moment: the logits the
    trainer still holds (2 bytes per entry), their fp32 copy (4) and the log_softmax output (4)
    beside the states, plus the framework's workspace (under 256 MiB)."""

    def peak_beyond_states(metrics):
        cfg = ParallelConfig(
            dp=1, tp=1, pp=1, micro_batch=32, global_batch=32, seq=1024,
            precision="amp-bf16", framework="fsdp", recompute="full",
        )  # fmt: skip
        est = estimate(
            SPEC,
            "p4d.24xlarge",
            cfg,
            gpus=1,
            options=RunOptions(train_metrics=metrics, loss="fused"),
        )
        mem = est.memory()
        states = mem["params_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]
        return est.peak_bytes_per_gpu - states

    transient = (2 + 4 + 4) * SPEC.vocab * 32 * 1024
    assert peak_beyond_states(0) < transient
    assert transient < peak_beyond_states(2) < transient + 256 * 2**20
    assert peak_beyond_states(1) == peak_beyond_states(2)  # one metric at a time
