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
from planner.executor.reference import AnchoredReference, dp_shard, make_optimizer, synthetic_tokens
from planner.executor.record import sample_indices
from planner.executor.runspec import RunSpec, build_run_spec, proxy_spec
from planner.executor.tiny import gpt_tiny_spec, llama_tiny_spec
from planner.executor.verify import Check
from planner.executor.worker import clean_name
from planner.models.transformer import lm_loss
from planner.parallel import ParallelConfig

runner = CliRunner()
MIXTRAL = "planner.executor.tiny:mixtral_tiny"


def one_line_exit_2(result):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_even_split_puts_extra_blocks_on_leading_stages_and_plan_split_is_kept():
    assert stage_block_counts(ParallelConfig(pp=3, global_batch=1), 8) == [3, 3, 2]
    assert stage_block_counts(ParallelConfig(pp=2, global_batch=1, stages=(1, 3)), 4) == [1, 3]


@pytest.mark.parametrize(
    "schedule,v,expected",
    [
        ("1f1b", 1, [[0], [1]]),
        ("gpipe", 1, [[0], [1]]),
        ("interleaved-1f1b", 2, [[0, 2], [1, 3]]),
        ("zero-bubble", 1, [[0], [1]]),
    ],
)
def test_stage_ids_per_pipeline_rank(schedule, v, expected):
    cfg = ParallelConfig(pp=2, schedule=schedule, virtual_stages=v, global_batch=1)
    assert [stage_ids(cfg, r) for r in range(2)] == expected


def test_data_shards_tile_the_global_batch_and_are_reproducible():
    spec = RunSpec(
        config=ParallelConfig(dp=2, global_batch=4, seq=8),
        model=gpt_tiny_spec(seq=8),
        model_name="m",
    )
    tokens = synthetic_tokens(spec, 3)
    assert tokens.shape == (4, 9) and torch.equal(tokens, synthetic_tokens(spec, 3))
    assert not torch.equal(tokens, synthetic_tokens(spec, 4))
    assert torch.equal(torch.cat([dp_shard(tokens, 2, 0), dp_shard(tokens, 2, 1)]), tokens)


def test_run_spec_round_trips_through_json():
    spec = RunSpec(
        config=ParallelConfig(pp=2, stages=(1, 3), global_batch=2),
        model=llama_tiny_spec(),
        model_name="x:y",
        notes=("a",),
        checkpoint_dir="/tmp/c",
    )
    assert RunSpec.from_json(spec.to_json()) == spec


def test_proxy_keeps_every_parallel_dimension_and_the_split_shape():
    big = gpt_tiny_spec(layers=96, hidden=12288, heads=96, vocab=50257, seq=2048).with_(
        name="gpt3-175b"
    )
    cfg = ParallelConfig(
        dp=2,
        tp=2,
        pp=2,
        schedule="interleaved-1f1b",
        virtual_stages=2,
        global_batch=8,
        micro_batch=2,
        seq=2048,
        stages=(30, 18, 24, 24),
    )
    small, small_cfg, note = proxy_spec(big, cfg)
    assert (
        small_cfg.dp,
        small_cfg.tp,
        small_cfg.pp,
        small_cfg.virtual_stages,
        small_cfg.schedule,
    ) == (2, 2, 2, 2, "interleaved-1f1b")
    assert small_cfg.stages == (2, 1, 1, 1) and small.layers == 5
    assert small.heads % 2 == 0 and small.hidden < big.hidden and small.seq <= 64
    assert small_cfg.num_microbatches == cfg.num_microbatches and "proxy" in note
    small_cfg.check_model(heads=small.heads, kv_heads=small.n_kv_heads, blocks=small.total_blocks)
    # an even split of 10 blocks over 4 stages ([3, 3, 2, 2]) stays front-loaded: 4 + 2 blocks -> [2, 2, 1, 1]
    even, even_cfg, _ = proxy_spec(
        big.with_(layers=10), ParallelConfig(pp=4, global_batch=4, seq=2048)
    )
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
    assert (
        clean_name("module.layers.0._checkpoint_wrapped_module.attention.wq.weight")
        == "layers.0.attention.wq.weight"
    )


def _tiny_spec(model, steps=4):
    return RunSpec(
        config=ParallelConfig(global_batch=4, seq=16, precision="fp32"),
        model=model,
        model_name="m",
        steps=steps,
    )


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 70k-parameter model: threads only contend on a shared 2-core box
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "model",
    [
        gpt_tiny_spec(seq=16),
        gpt_tiny_spec(seq=16).with_(tied_embeddings=True),
        llama_tiny_spec(seq=16),
    ],
    ids=["gpt", "gpt-tied", "llama"],
)
def test_gradient_bound_covers_every_term_and_separates_reordering_from_bugs(model, one_thread):
    """The bound's ||T|| is at least ||g|| for every parameter (a term the hooks missed would break it);
    evaluating the batch one sequence at a time in reverse order, with ulp-sized noise on every
    attention output gradient (what tensor parallelism does), stays far below the bound over AdamW
    steps; the gradient of half the batch (skipped data-parallel reduction) is far above it."""
    spec = _tiny_spec(model)
    ref = AnchoredReference(spec)
    factor = ref.rounding.gradient_factor
    optimizer = make_optimizer(ref.model.parameters(), spec)
    gen = torch.Generator().manual_seed(1)

    def ulp_noise(module, grad_in, grad_out):
        return (grad_in[0] * (1 + 2.0**-24 * torch.randn(grad_in[0].shape, generator=gen)),)

    worst_reordered, least_half = 0.0, float("inf")
    for step in range(spec.steps):
        expected = ref.gradient(step)
        for name, g in expected.grads.items():
            assert expected.grad_bounds[name] / factor >= g.norm().item() * (1 - 1e-5), name
        tokens = synthetic_tokens(spec, step)
        hooks = [
            b.attention.wo.register_full_backward_hook(ulp_noise) for b in ref.model.layers.values()
        ]
        for i in reversed(range(4)):
            (lm_loss(ref.model(tokens[i : i + 1, :-1]), tokens[i : i + 1, 1:]) / 4).backward()
        for h in hooks:
            h.remove()
        for name, p in ref.params.items():
            worst_reordered = max(
                worst_reordered,
                (p.grad - expected.grads[name]).norm().item() / expected.grad_bounds[name],
            )
            p.grad = None
        lm_loss(ref.model(tokens[:2, :-1]), tokens[:2, 1:]).backward()
        least_half = min(
            least_half,
            max(
                (p.grad - expected.grads[n]).norm().item() / expected.grad_bounds[n]
                for n, p in ref.params.items()
            ),
        )
        for name, p in ref.params.items():
            p.grad = expected.grads[name]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert worst_reordered < 0.02
    assert least_half > 50


def test_loss_bound_is_above_reordering_and_below_a_changed_batch(one_thread):
    spec = _tiny_spec(gpt_tiny_spec(seq=16), steps=1)
    ref = AnchoredReference(spec)
    expected = ref.gradient(0)
    tokens = synthetic_tokens(spec, 0)
    with torch.no_grad():
        per_sequence = [
            lm_loss(ref.model(tokens[i : i + 1, :-1]), tokens[i : i + 1, 1:]).item()
            for i in range(4)
        ]
    reordered = sum(reversed(per_sequence)) / 4
    assert abs(reordered - expected.loss) < 0.05 * expected.loss_bound
    doubled = (2 * per_sequence[0] + sum(per_sequence[2:])) / 4  # sequence 1 replaced by sequence 0
    assert abs(doubled - expected.loss) > expected.loss_bound


def test_replay_bound_accumulates_the_rounding_of_each_update():
    """The replay's bound after k steps is u sum_k (2 |theta| + 8 |delta theta|) elementwise: it grows
    with every step and is zero only where nothing ever moved."""
    spec = _tiny_spec(gpt_tiny_spec(seq=16), steps=2)
    ref = AnchoredReference(spec)
    u = ref.rounding.u_run + ref.rounding.u_ref
    before = {n: p.detach().clone() for n, p in ref.params.items()}
    grads = {n: torch.full_like(p, 1e-3) for n, p in ref.params.items()}
    first = {n: b.clone() for n, b in ref.apply(grads).items()}
    name = "layers.0.feed_forward.w1.weight"
    p = ref.params[name].detach()
    expected = u * (2 * p.abs() + 8 * (p - before[name]).abs())
    assert torch.allclose(first[name], expected, rtol=1e-6, atol=0)
    second = ref.apply(grads)
    assert bool((second[name] > first[name]).all())


def test_unravel_matches_row_major_layout():
    from planner.executor.record import _unravel

    t = torch.arange(2 * 3 * 4).reshape(2, 3, 4)
    flat = torch.tensor([0, 5, 13, 23])
    coords = _unravel(flat, t.shape)
    assert torch.equal(t[tuple(coords.T)], flat)


def test_sample_indices_are_fixed_per_name_and_cover_small_tensors():
    assert torch.equal(sample_indices("a.weight", 10**6), sample_indices("a.weight", 10**6))
    assert not torch.equal(sample_indices("a.weight", 10**6), sample_indices("b.weight", 10**6))
    assert torch.equal(sample_indices("bias", 5), torch.arange(5))


def test_check_ratio_and_message():
    ok = Check(step=2, kind="gradient", tensor="w", error=1e-6, bound=1e-3)
    assert ok.ratio == pytest.approx(1e-3) and not ok.failed
    bad = Check(step=2, kind="gradient", tensor="w", error=2e-3, bound=1e-3)
    assert (
        bad.failed
        and "the gradient of w at step 2" in bad.describe()
        and "2 x its rounding bound" in bad.describe()
    )
    assert Check(step=0, kind="parameters", tensor="w", error=1e-9, bound=0.0).failed
    assert not Check(step=0, kind="parameters", tensor="w", error=0.0, bound=0.0).failed
    assert (
        "after step 0"
        in Check(step=0, kind="parameters", tensor="w", error=1.0, bound=0.5).describe()
    )


def test_cpu_run_downgrades_precision_and_says_so(tmp_path):
    cfg = ParallelConfig(
        dp=2, global_batch=2, seq=16, precision="amp-bf16", offload="optimizer", zero=1
    )
    spec = build_run_spec(write_plan(tmp_path / "p.json", cfg), steps=1)
    assert spec.dtype == "fp32"
    text = " | ".join(spec.notes)
    assert (
        "amp-bf16 downgraded to fp32" in text
        and "offload optimizer not applied" in text
        and "ZeRO-1" in text
    )


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
    assert "inject-fault" in one_line_exit_2(
        runner.invoke(app, ["run", str(plan), "--inject-fault", "boom"])
    )
    other = write_plan(
        tmp_path / "q.json", ParallelConfig(dp=2, global_batch=2, seq=16), model="torch.nn:Linear"
    )
    assert "model" in one_line_exit_2(runner.invoke(app, ["run", str(other)]))


def test_a_factory_plan_reads_its_spec_on_meta():
    # the launcher only needs the factory's TransformerSpec: building GPT-3 175B for real would need 700 GB
    from planner.executor.runspec import resolve_transformer

    spec = resolve_transformer("tests.fixtures.factories:gpt3_175b", None)
    assert spec.layers == 96 and spec.hidden == 12288
    with pytest.raises(ConfigError, match="planner.models.transformer.Transformer"):
        resolve_transformer("tests.fixtures.factories:convnet", None)


@pytest.mark.parametrize("value", ["abc", "0", "-3", "2.5"])
def test_bad_max_local_ranks_is_one_line_naming_the_variable(tmp_path, monkeypatch, value):
    monkeypatch.setenv("PLANNER_MAX_LOCAL_RANKS", value)
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=2, global_batch=2, seq=16))
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan)]))
    assert f"PLANNER_MAX_LOCAL_RANKS={value!r}" in line and "a positive integer" in line


def test_bad_start_method_and_torchrun_world_size_are_one_line(tmp_path, monkeypatch):
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=2, global_batch=2, seq=16))
    monkeypatch.setenv("PLANNER_EXECUTOR_START", "thread")
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan), "--steps", "1"]))
    assert "PLANNER_EXECUTOR_START='thread'" in line and "fork, spawn" in line
    monkeypatch.delenv("PLANNER_EXECUTOR_START")
    env = {"RANK": "0", "WORLD_SIZE": "two", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan)], env=env))
    assert "WORLD_SIZE='two'" in line
    line = one_line_exit_2(
        runner.invoke(app, ["run", str(plan)], env=dict(env, WORLD_SIZE="2", RANK="-1"))
    )
    assert "RANK='-1'" in line and "integer >= 0" in line
    line = one_line_exit_2(
        runner.invoke(app, ["run", str(plan)], env=dict(env, WORLD_SIZE="2", RANK="2"))
    )
    assert "RANK='2'" in line and "0..1" in line


REFUSED = {
    # what is still outside the executor: one line naming the field, exit 2, before any rank starts
    "expert_tp": (dict(dp=4, ep=2, expert_tp=2, placement="DPET"), MIXTRAL, "plan.expert_tp=2"),
    "ep-beside-tp": (dict(dp=2, tp=2, ep=2, placement="DPET"), MIXTRAL, "plan.ep=2"),
    "moe-beside-tp": (dict(tp=2), MIXTRAL, "plan.tp=2"),
    "ep-on-a-dense-model": (
        dict(dp=2, ep=2, placement="DPET"),
        "planner.executor.tiny:gpt_tiny",
        "dense model",
    ),
    "ep-not-dividing-experts": (
        dict(dp=8, ep=8, placement="DPET"),
        MIXTRAL,
        "a divisor of experts(4)",
    ),
    "cp-odd-split": (
        dict(cp=2, seq=30, placement="DPCT"),
        "planner.executor.tiny:gpt_tiny",
        "divisible by 2*cp",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_dimensions_the_executor_cannot_run_are_refused_by_name(name, tmp_path):
    knobs, model, expected = REFUSED[name]
    knobs = {"seq": 32, "global_batch": knobs.get("dp", 1), **knobs}
    doc = plan_document(ParallelConfig(**knobs), model)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan)]))
    assert expected in line, line


def test_checkpoint_every_steps_without_a_directory_is_one_line(tmp_path):
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=2, global_batch=2, seq=16))
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan), "--checkpoint-every-steps", "2"]))
    assert "--checkpoint-every-steps=2" in line and "--checkpoint-dir" in line


@pytest.mark.parametrize(
    "fault,needle",
    [
        ("bug:nonsense", "bug:NAME"),
        ("stop:1", "stop|segv:RANK:STEP"),
        ("bug:zero_shard_offset", "zero 1, 2 or 3"),
        ("bug:drop_microbatch", "pp > 1"),
    ],
)
def test_bad_or_inapplicable_faults_are_one_line(tmp_path, fault, needle):
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=2, global_batch=2, seq=16))
    line = one_line_exit_2(runner.invoke(app, ["run", str(plan), "--inject-fault", fault]))
    assert needle in line


def test_checkpoint_cadence_by_interval_steps_and_last():
    from planner.executor.checkpoint import Cadence

    now = [0.0]
    every = Cadence(clock=lambda: now[0])
    assert all(every.due(s, last=False) for s in range(3))
    timed = Cadence(interval_s=10.0, clock=lambda: now[0])
    saved = []
    for step in range(8):
        now[0] += 4.0  # a step takes 4 s: due at 12 s, then 24 s, then the last
        if timed.due(step, last=step == 7):
            timed.saved()
            saved.append(step)
    assert saved == [2, 5, 7]
    steps = Cadence(every_steps=3, interval_s=0.001, clock=lambda: now[0])
    assert [s for s in range(7) if steps.due(s, last=s == 6)] == [2, 5, 6]


pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _fake_step(root, step, *, losses=(1.0,), run=None):
    """A real torch.distributed.checkpoint step (one process) with its manifest."""
    import torch.distributed.checkpoint as dcp

    from planner.executor.checkpoint import write_manifest

    path = root / f"step-{step}"
    dcp.save({"w": torch.full((64,), float(step))}, checkpoint_id=str(path))
    write_manifest(path, step, list(losses) * (step + 1), run)
    return path


def test_damaged_latest_checkpoint_falls_back_to_the_last_intact_step(tmp_path):
    from planner.executor.checkpoint import choose_resume_step, step_problem

    for step in range(3):
        _fake_step(tmp_path, step)
    assert step_problem(tmp_path / "step-2") is None
    shard = next(p for p in (tmp_path / "step-2").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:10])  # truncated
    (tmp_path / "step-1" / "trainer.json").unlink()  # a save that never finished
    said = []
    assert choose_resume_step(tmp_path, say=said.append) == 0
    assert "has 10 bytes" in step_problem(tmp_path / "step-2.damaged")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-0",
        "step-1.damaged",
        "step-2.damaged",
    ]
    assert len(said) == 2 and all("resuming from step 0" in line for line in said)
    assert "step 2" in said[1] and "bytes" in said[1] and "did not finish" in said[0]


@pytest.mark.parametrize("damage", ["truncate", "metadata", "manifest", "missing"])
def test_a_directory_without_an_intact_step_is_one_line_exit_2(tmp_path, damage):
    path = _fake_step(tmp_path / "ckpt", 0)
    if damage == "truncate":
        shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
        shard.write_bytes(b"")
    elif damage == "metadata":
        meta = path / ".metadata"
        size = meta.stat().st_size
        meta.write_bytes(b"x" * size)  # same size, unreadable
    elif damage == "manifest":
        (path / "trainer.json").write_text("{half")
    else:
        next(p for p in path.iterdir() if p.suffix == ".distcp").unlink()
    plan = write_plan(tmp_path / "p.json", ParallelConfig(dp=2, global_batch=2, seq=16))
    line = one_line_exit_2(
        runner.invoke(app, ["run", str(plan), "--checkpoint-dir", str(tmp_path / "ckpt")])
    )
    assert "no intact checkpoint" in line and "step 0" in line
