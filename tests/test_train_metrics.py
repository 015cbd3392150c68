"""A trainer's train metrics over the logits (RunOptions.train_metrics): Composer updates every
train metric on every micro-batch after its backward (Trainer._train_microbatch ->
_eval_train_metrics), and llm-foundry's MPT logs two, LanguageCrossEntropy and
LanguagePerplexity, each a torch CrossEntropyLoss over the whole logits under autocast.

Expected bytes come from what those kernels do: the 16-bit logits read (2 bytes) and written as an
fp32 copy (4), then log_softmax over rows too long for its cached kernels (PyTorch SoftMax.cu,
cunn_SoftMaxForward) reads them three times (max, sum of exponentials, result) and writes its output
(4 + 4 + 4 + 4): 22 bytes per vocabulary entry and metric. The bandwidth and the stack's rate are
read from the shipped data files, not from the code under test."""

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
BYTES_PER_ENTRY_AND_METRIC = 2 + 4 + 3 * 4 + 4


def one_gpu(metrics, *, micro_batch=8, m=4, precision="amp-bf16", framework="fsdp", **degrees):
    """gpt2 on A100s of a p4d, `m` micro-batches of `micro_batch` x 1024 (one GPU unless `degrees`
    say more)."""
    shape = {"dp": 1, "tp": 1, "pp": 1, **degrees}
    cfg = ParallelConfig(
        **shape,
        micro_batch=micro_batch,
        global_batch=micro_batch * m * shape["dp"],
        seq=1024,
        precision=precision,
        framework=framework,
        sequence_parallel=False,
    )
    gpus = shape["dp"] * shape["tp"] * shape["pp"]
    options = RunOptions(train_metrics=metrics)
    return estimate(SPEC, "p4d.24xlarge", cfg, gpus=gpus, options=options)


def expected_metric_seconds(metrics, tokens, per_entry=BYTES_PER_ENTRY_AND_METRIC) -> float:
    bandwidth = HW_FILE["memory_bandwidth_GBps"] * 1e9
    bandwidth *= HW_FILE["efficiency"]["elementwise_bandwidth_fraction"]
    entries = tokens * SPEC.vocab
    return metrics * per_entry * entries / bandwidth / FSDP_FILE["compute_efficiency"]


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
    the step grows by the metrics' launches (7 per metric and micro-batch: the fp32 cast,
    log_softmax, nll_loss, the target mask and its sum, two running sums), and their device time
    fills the host's wait (cost_models.timeline)."""
    base, more = one_gpu(0, micro_batch=1, m=4), one_gpu(2, micro_batch=1, m=4)
    launches = 4 * 2 * 7 * HW_FILE["efficiency"]["dispatch_us_per_op"] * 1e-6
    device = expected_metric_seconds(2, 4 * 1024)
    wait = base.time_breakdown_s()["host_wait"]
    assert more.step_time_s - base.step_time_s == pytest.approx(launches, rel=1e-9)
    assert more.time_breakdown_s()["host_wait"] == pytest.approx(wait - device + launches, rel=1e-9)


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


@pytest.mark.parametrize(
    "precision, per_entry",
    [("fp32", 3 * 4 + 4), ("bf16", 3 * 2 + 2)],  # no copy: log_softmax on the logits' own dtype
)
def test_without_autocast_the_metric_runs_on_the_logits_own_dtype(precision, per_entry):
    base, more = one_gpu(0, precision=precision), one_gpu(1, precision=precision)
    added = more.step_time_s - base.step_time_s
    assert added == pytest.approx(expected_metric_seconds(1, 4 * 8 * 1024, per_entry), rel=1e-9)


def test_vocab_parallel_logits_split_the_metrics_over_tp():
    """Megatron's vocab-parallel head gives each tp rank V / tp of every token's logits."""
    one, two = (
        one_gpu(2, framework="megatron", tp=tp).step_time_s
        - one_gpu(0, framework="megatron", tp=tp).step_time_s
        for tp in (1, 2)
    )
    assert two == pytest.approx(one / 2, rel=1e-6) and two > 0


def test_only_the_last_stage_holds_the_metrics_logits():
    """Two pipeline stages: the metrics' moment can only raise the last stage's peak."""
    ranks = [
        [r["peak_bytes_per_gpu"] for r in one_gpu(n, pp=2, framework="megatron").memory_per_rank()]
        for n in (0, 2)
    ]
    assert ranks[1][0] == ranks[0][0] and ranks[1][1] > ranks[0][1]


def _plan_file(tmp_path, metrics):
    doc = one_gpu(2).to_document()
    doc["software"]["train_metrics"] = metrics
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def test_another_stacks_export_drops_composers_metrics_and_says_so(tmp_path):
    from planner.exports import export_plan
    from planner.plan import plan_from_document

    plan = plan_from_document(one_gpu(2).to_document())
    notes = export_plan(plan, "deepspeed").notes
    assert any("train_metrics dropped" in n for n in notes), notes
    fsdp_notes = export_plan(plan, "fsdp").notes
    assert any(n.startswith("train_metrics=2: ") for n in fsdp_notes), fsdp_notes


def test_a_plan_file_saying_two_point_zero_metrics_means_two(tmp_path):
    path = _plan_file(tmp_path, 2.0)
    assert type(run_options(json.loads(path.read_text())).train_metrics) is int
    for args in (["explain", str(path), "--search"], ["export", str(path), "--format", "fsdp"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output


def test_a_plan_file_with_an_impossible_count_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["explain", str(_plan_file(tmp_path, 9))])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "train_metrics" in lines[0], result.output
