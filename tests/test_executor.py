"""The embedded executor: fast unit checks here, one launch per parallel layout in
test_executor_parallel.py, faults and checkpoints in test_executor_faults.py."""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from executor_plans import plan_document, write_plan
from planner.cli import app
from planner.errors import ConfigError
from planner.executor.parallelize import stage_block_counts, stage_ids
from planner.executor.reference import ReferenceResult, dp_shard, run_reference, synthetic_tokens
from planner.executor.runspec import RunSpec, build_run_spec, proxy_spec
from planner.executor.tiny import gpt_tiny_spec, llama_tiny_spec
from planner.executor.verify import compare
from planner.executor.worker import clean_name
from planner.parallel import ParallelConfig

runner = CliRunner()


def one_line_exit_2(result):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_even_split_puts_extra_blocks_on_leading_stages_and_plan_split_is_kept():
    assert stage_block_counts(ParallelConfig(pp=3, global_batch=1), 8) == [3, 3, 2]
    assert stage_block_counts(ParallelConfig(pp=2, global_batch=1, stages=(1, 3)), 4) == [1, 3]


@pytest.mark.parametrize("schedule,v,expected", [("1f1b", 1, [[0], [1]]), ("gpipe", 1, [[0], [1]]),
                                                 ("interleaved-1f1b", 2, [[0, 2], [1, 3]]),
                                                 ("zero-bubble", 1, [[0], [1]])])
def test_stage_ids_per_pipeline_rank(schedule, v, expected):
    cfg = ParallelConfig(pp=2, schedule=schedule, virtual_stages=v, global_batch=1)
    assert [stage_ids(cfg, r) for r in range(2)] == expected


def test_data_shards_tile_the_global_batch_and_are_reproducible():
    spec = RunSpec(config=ParallelConfig(dp=2, global_batch=4, seq=8), model=gpt_tiny_spec(seq=8), model_name="m")
    tokens = synthetic_tokens(spec, 3)
    assert tokens.shape == (4, 9) and torch.equal(tokens, synthetic_tokens(spec, 3))
    assert not torch.equal(tokens, synthetic_tokens(spec, 4))
    assert torch.equal(torch.cat([dp_shard(tokens, 2, 0), dp_shard(tokens, 2, 1)]), tokens)


def test_run_spec_round_trips_through_json():
    spec = RunSpec(config=ParallelConfig(pp=2, stages=(1, 3), global_batch=2), model=llama_tiny_spec(),
                   model_name="x:y", notes=("a",), checkpoint_dir="/tmp/c")
    assert RunSpec.from_json(spec.to_json()) == spec


def test_proxy_keeps_every_parallel_dimension_and_the_split_shape():
    big = gpt_tiny_spec(layers=96, hidden=12288, heads=96, vocab=50257, seq=2048).with_(name="gpt3-175b")
    cfg = ParallelConfig(dp=2, tp=2, pp=2, schedule="interleaved-1f1b", virtual_stages=2, global_batch=8,
                         micro_batch=2, seq=2048, stages=(30, 18, 24, 24))
    small, small_cfg, note = proxy_spec(big, cfg)
    assert (small_cfg.dp, small_cfg.tp, small_cfg.pp, small_cfg.virtual_stages, small_cfg.schedule) == (2, 2, 2, 2, "interleaved-1f1b")
    assert small_cfg.stages == (2, 1, 1, 1) and small.layers == 5
    assert small.heads % 2 == 0 and small.hidden < big.hidden and small.seq <= 64
    assert small_cfg.num_microbatches == cfg.num_microbatches and "proxy" in note
    small_cfg.check_model(heads=small.heads, kv_heads=small.n_kv_heads, blocks=small.total_blocks)
    # an even split of 10 blocks over 4 stages ([3, 3, 2, 2]) stays front-loaded: 4 + 2 blocks -> [2, 2, 1, 1]
    even, even_cfg, _ = proxy_spec(big.with_(layers=10), ParallelConfig(pp=4, global_batch=4, seq=2048))
    assert stage_block_counts(even_cfg, even.layers) == [2, 2, 1, 1]


def test_proxy_never_grows_a_model():
    from planner.executor.runspec import parameter_count

    spec = gpt_tiny_spec(layers=6, hidden=32, heads=2, vocab=128)
    small, _, _ = proxy_spec(spec, ParallelConfig(tp=2, pp=2, global_batch=2, seq=32))
    assert small.heads <= spec.heads and small.hidden <= spec.hidden and small.vocab <= spec.vocab
    assert parameter_count(small) < parameter_count(spec)


def test_proxy_of_grouped_query_model_keeps_gqa_and_divides_by_tp():
    spec = llama_tiny_spec(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=32000, seq=4096)
    small, cfg, _ = proxy_spec(spec, ParallelConfig(tp=4, global_batch=1, seq=4096))
    assert small.n_kv_heads < small.heads and small.heads % 4 == 0 and small.n_kv_heads % 4 == 0


def test_clean_name_strips_ddp_and_checkpoint_wrappers():
    assert clean_name("module.layers.0._checkpoint_wrapped_module.attention.wq.weight") == "layers.0.attention.wq.weight"


def test_reference_is_deterministic_and_learns():
    spec = RunSpec(config=ParallelConfig(global_batch=4, seq=16), model=gpt_tiny_spec(seq=16), model_name="m", steps=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 70k-parameter model: threads only contend on a shared 2-core box
    try:
        a, b = run_reference(spec), run_reference(spec)
    finally:
        torch.set_num_threads(threads)
    assert a.losses == b.losses and all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert a.losses[-1] < a.losses[0]
    # the key bias only shifts every logit of a softmax row equally: its gradient is exactly zero
    assert set(a.zero_grad_params) == {f"layers.{i}.attention.wk.bias" for i in range(4)}


def test_compare_flags_a_perturbed_parameter_and_a_missing_one():
    params = {"w": torch.ones(4), "b": torch.zeros(2)}
    ref = ReferenceResult(losses=(1.0, 0.9), params=params, step_times_s=(0.1, 0.1), zero_grad_params=("b",))
    assert compare([1.0, 0.9], dict(params), ref).passed
    bad = compare([1.0, 0.9], {"w": torch.ones(4) * (1 + 1e-4), "b": torch.zeros(2)}, ref)
    assert not bad.passed and bad.worst_param == "w" and bad.param_max_rel_err == pytest.approx(1e-4, rel=1e-2)
    missing = compare([1.0, 0.9], {"w": torch.ones(4)}, ref)
    assert not missing.passed and "missing parameters: b" in missing.problems[0]
    drift = compare([1.0, 0.9], {"w": torch.ones(4), "b": torch.full((2,), 1e-2)}, ref, max_move=1e-3)
    assert not drift.passed and "zero-gradient parameter drifted" in drift.problems[0]


def test_compare_bounds_adam_eps_sensitive_elements_absolutely():
    # w[0]'s gradient was within 100 eps of zero: its move (up to lr per step) is bounded absolutely
    # and left out of the relative error; the other elements are still held to 1e-5.
    params = {"w": torch.ones(4)}
    mask = torch.tensor([True, False, False, False])
    ref = ReferenceResult(losses=(1.0,), params=params, step_times_s=(0.1,), eps_sensitive={"w": mask})
    moved = torch.tensor([1.0 + 1e-3, 1.0, 1.0, 1.0])
    ok = compare([1.0], {"w": moved}, ref, max_move=2e-3)
    assert ok.passed and ok.param_max_rel_err == 0.0 and ok.eps_sensitive_elements == 1 and ok.hint() == ""
    too_far = compare([1.0], {"w": moved}, ref, max_move=5e-4)
    assert not too_far.passed and "near Adam's eps drifted" in too_far.problems[0]
    others = compare([1.0], {"w": torch.tensor([1.0, 1.0 + 1e-4, 1.0, 1.0])}, ref, max_move=2e-3)
    assert not others.passed and others.param_max_rel_err == pytest.approx(5e-5, rel=1e-2)
    assert "--steps 1" in others.hint()


def test_cpu_run_downgrades_precision_and_says_so(tmp_path):
    cfg = ParallelConfig(dp=2, global_batch=2, seq=16, precision="amp-bf16", offload="optimizer", zero=1)
    spec = build_run_spec(write_plan(tmp_path / "p.json", cfg), steps=1)
    assert spec.dtype == "fp32"
    text = " | ".join(spec.notes)
    assert "amp-bf16 downgraded to fp32" in text and "offload optimizer not applied" in text and "ZeRO-1" in text


def test_model_too_large_for_this_machine_needs_proxy(tmp_path, monkeypatch):
    import planner.executor.runspec as runspec

    monkeypatch.setattr(runspec, "host_memory_bytes", lambda: 1 << 20)  # a 1 MiB machine
    plan = write_plan(tmp_path / "p.json", ParallelConfig(pp=2, global_batch=2, seq=16))
    with pytest.raises(ConfigError, match="pass --proxy"):
        build_run_spec(plan)
    spec = build_run_spec(plan, proxy=True)
    assert spec.config.pp == 2 and any("--proxy" in n for n in spec.notes)


def test_broken_plan_file_is_one_line_exit_2(tmp_path):
    broken = tmp_path / "plan.json"
    broken.write_text("{not json")
    assert "line 1" in one_line_exit_2(runner.invoke(app, ["run", str(broken)]))
    assert "plan" in one_line_exit_2(runner.invoke(app, ["run", str(tmp_path / "missing.json")]))
    doc = plan_document(ParallelConfig(dp=2, global_batch=2))
    doc["plan"]["dp"] = 0
    broken.write_text(json.dumps(doc))
    assert "dp" in one_line_exit_2(runner.invoke(app, ["run", str(broken)]))


def test_world_size_this_machine_cannot_host_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_MAX_LOCAL_RANKS", "8")
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=16, global_batch=16, seq=16))
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan)]))
    assert "world_size=16" in line and "at most 8" in line and "torchrun" in line


def test_unknown_backend_model_and_fault_are_one_line_exit_2(tmp_path):
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=2, global_batch=2, seq=16))
    assert "backend" in one_line_exit_2(runner.invoke(app, ["run", str(plan), "--backend", "mpi"]))
    assert "inject-fault" in one_line_exit_2(runner.invoke(app, ["run", str(plan), "--inject-fault", "boom"]))
    other = write_plan(tmp_path / "q.json", ParallelConfig(dp=2, global_batch=2, seq=16), model="torch.nn:Linear")
    assert "model" in one_line_exit_2(runner.invoke(app, ["run", str(other)]))


def test_a_factory_plan_reads_its_spec_on_meta():
    # the launcher only needs the factory's TransformerSpec: building GPT-3 175B for real would need 700 GB
    from planner.executor.runspec import resolve_transformer

    spec = resolve_transformer("tests.fixtures.factories:gpt3_175b", None)
    assert spec.layers == 96 and spec.hidden == 12288
    with pytest.raises(ConfigError, match="planner.models.transformer.Transformer"):
        resolve_transformer("tests.fixtures.factories:convnet", None)
