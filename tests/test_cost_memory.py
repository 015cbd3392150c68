"""Memory model: Korthikanti et al. 2022 golden counts, state bytes, ZeRO and micro-batch properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cost_models import memory as M
from cost_models.blocks import block_table
from hardware_profiles import load_profile
from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES
from planner.software import software_for
from planner.score import CandidateArrays, score
from planner.spec import TransformerSpec
from planner.run_options import RunOptions

GPT = TransformerSpec(name="gpt-22b", layers=48, hidden=6144, heads=64, vocab=51200, seq=2048)
HW = load_profile("dgx-a100-80g")


def test_korthikanti_eq1_34_plus_5as_over_h():
    # Korthikanti et al. 2022, eq. 1: activations per layer = s b h (34 + 5 a s / h) bytes (fp16, dropout)
    s, h, a = 2048, GPT.hidden, GPT.heads
    t = block_table(GPT, "amp-fp16", "fused", flash=False, dropout=True)
    assert float(t.saved.at(1, False, s)) == pytest.approx(h * (34 + 5 * a * s / h))


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_korthikanti_tensor_and_sequence_parallel(tp):
    s, h, a = 2048, GPT.hidden, GPT.heads
    t = block_table(GPT, "amp-fp16", "fused", flash=False, dropout=True)
    # eq. 2 (TP): s b h (10 + 24/t + 5 a s /(h t)); eq. 4 (TP + SP): s b h / t (34 + 5 a s / h)
    assert float(t.saved.at(tp, False, s)) == pytest.approx(
        h * (10 + 24 / tp + 5 * a * s / (h * tp))
    )
    assert float(t.saved.at(tp, True, s)) == pytest.approx(h / tp * (34 + 5 * a * s / h))
    # selective recompute drops the 5 a s / h term; full recompute keeps 2 s b h (the block input)
    assert float(t.saved.at(tp, True, s) - t.scores_saved.at(tp, True, s)) == pytest.approx(
        34 * h / tp
    )
    assert float(t.saved_full_recompute.at(tp, False, s)) == pytest.approx(2 * h)


LLAMA70 = TransformerSpec(
    name="llama-70b-shape",
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=8,
    ffn=28672,
    vocab=128256,
    seq=8192,
    gated_mlp=True,
    norm="rmsnorm",
    position="rope",
)


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True), (8, False)])
def test_fp8_linear_inputs_are_saved_in_one_byte_under_transformer_engine(tp, sp):
    # TE's FP8 linears keep the FP8 cast of their input: QKV in and fc1 in (h each, replicated) and fc2 in (f,
    # sharded) drop from 2 bytes to 1; the flash kernel still keeps its 16-bit output and the projection adds
    # its 1-byte copy (q, sharded). Torch modules (torchao float8) keep 16-bit inputs: unchanged.
    s, h, q, f = 8192, LLAMA70.hidden, LLAMA70.attn_width, LLAMA70.d_ffn
    bf16 = block_table(LLAMA70, "amp-bf16", "fused").saved.at(tp, sp, s)
    fp8 = block_table(LLAMA70, "fp8", "fused").saved.at(tp, sp, s)
    rep_div = tp if sp else 1
    assert float(bf16 - fp8) == pytest.approx(2 * h / rep_div + (f - q) / tp)
    assert float(block_table(LLAMA70, "fp8", "torch").saved.at(tp, sp, s)) == pytest.approx(
        float(block_table(LLAMA70, "amp-bf16", "torch").saved.at(tp, sp, s))
    )


def test_state_bytes_per_param():
    fw = lambda name: software_for(name).framework  # noqa: E731
    assert sum(M.state_bytes_per_param(fw("fsdp"), "amp-bf16", "adamw")) == 16  # PyTorch AMP
    assert (
        sum(M.state_bytes_per_param(fw("megatron"), "amp-fp16", "adamw")) == 18
    )  # Megatron mixed precision
    assert sum(M.state_bytes_per_param(fw("fsdp"), "bf16", "adamw")) == 8  # pure bf16: 2 + 2 + 4
    assert sum(M.state_bytes_per_param(fw("megatron"), "fp32", "adamw")) == 16
    assert (
        sum(M.state_bytes_per_param(fw("deepspeed"), "amp-bf16", "adamw")) == 16
    )  # ZeRO paper: 2 + 2 + 12
    assert M.state_bytes_per_param(fw("megatron"), "amp-bf16", "sgd")[2] == 8  # master + one state


def _cands(n, **over):
    base = dict(
        dp=np.full(n, 4),
        tp=np.full(n, 2),
        pp=np.full(n, 2),
        micro_batch=np.full(n, 1),
        virtual_stages=np.ones(n, int),
        zero=np.zeros(n, int),
        recompute=np.zeros(n, int),
        offload=np.zeros(n, int),
        sequence_parallel=np.zeros(n, bool),
        schedule=np.full(n, 1),
        placement=np.zeros(n, int),
    )
    base.update({k: np.asarray(v) for k, v in over.items()})
    return CandidateArrays(**base)


knobs = dict(
    dp=st.sampled_from([1, 2, 4, 8]),
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    recompute=st.integers(0, len(RECOMPUTE) - 1),
    offload=st.integers(0, len(OFFLOAD) - 1),
    sp=st.booleans(),
    schedule=st.integers(0, len(SCHEDULES) - 1),
    placement=st.integers(0, 5),
    framework=st.sampled_from(["megatron", "torchtitan", "fsdp", "deepspeed"]),
    precision=st.sampled_from(["amp-bf16", "bf16", "fp32"]),
)


@settings(max_examples=60, deadline=None)
@given(**knobs)
def test_zero_stage_k_plus_1_never_uses_more_memory(
    dp, tp, pp, recompute, offload, sp, schedule, placement, framework, precision
):
    n = 4
    c = _cands(
        n,
        dp=np.full(n, dp),
        tp=np.full(n, tp),
        pp=np.full(n, pp),
        zero=np.arange(4),
        recompute=np.full(n, recompute),
        offload=np.full(n, offload),
        sequence_parallel=np.full(n, sp),
        schedule=np.full(n, schedule if pp > 1 else 1),
        placement=np.full(n, placement),
    )
    peak = score(
        GPT,
        HW,
        c,
        global_batch=dp * 8,
        seq=2048,
        precision=precision,
        software=software_for(framework),
    ).peak_bytes_per_gpu
    assert np.all(np.diff(peak) <= 1e-6 * peak[:-1])


@settings(max_examples=60, deadline=None)
@given(**knobs, m=st.sampled_from([1, 2, 8]))
def test_memory_never_falls_when_the_micro_batch_grows(
    dp, tp, pp, recompute, offload, sp, schedule, placement, framework, precision, m
):
    mbs = np.array([1, 2, 4, 8])
    for fixed_global in (True, False):
        if fixed_global and software_for(framework).framework.grads_persist != "always":
            continue  # these stacks free grads between steps: m -> 1 legitimately drops them from the forward peak
        gb = dp * 8 * m if fixed_global else None
        peaks = []
        for mb in mbs:
            c = _cands(
                1,
                dp=[dp],
                tp=[tp],
                pp=[pp],
                micro_batch=[mb],
                recompute=[recompute],
                offload=[offload],
                sequence_parallel=[sp],
                schedule=[schedule if pp > 1 else 1],
                placement=[placement],
            )
            peaks.append(
                float(
                    score(
                        GPT,
                        HW,
                        c,
                        global_batch=gb or dp * mb * m,
                        seq=2048,
                        precision=precision,
                        software=software_for(framework),
                    ).peak_bytes_per_gpu[0]
                )
            )
        assert all(b >= a * (1 - 1e-9) for a, b in zip(peaks, peaks[1:])), peaks


@settings(max_examples=25, deadline=None)
@given(
    pp=st.sampled_from([2, 4, 8]),
    schedule=st.sampled_from([0, 1, 3]),
    zero=st.integers(0, 3),
    recompute=st.integers(0, 2),
    offload=st.integers(0, 2),
    extra=st.integers(0, 3),
)
def test_one_candidates_ranks_at_once_equal_the_batch_path(
    pp, schedule, zero, recompute, offload, extra
):
    """estimate's per-rank memory (one candidate: every rank in one vector call) is bit for bit what the same
    candidate gets inside a batch of two (one call per rank), for every rank and for the peak."""
    blocks = [GPT.layers // pp] * pp
    blocks[0] += extra
    blocks[-1] -= extra
    row = dict(
        dp=np.array([2]),
        tp=np.array([2]),
        pp=np.array([pp]),
        micro_batch=np.array([1]),
        virtual_stages=np.array([1]),
        zero=np.array([zero]),
        recompute=np.array([recompute]),
        offload=np.array([offload]),
        sequence_parallel=np.array([True]),
        schedule=np.array([schedule]),
        placement=np.array([0]),
        blocks_first=np.array([blocks[0]]),
        blocks_last=np.array([blocks[-1]]),
        blocks_max=np.array([max(blocks)]),
        rank_blocks=np.array([blocks]),
    )
    kw = dict(global_batch=16, seq=2048, software=software_for("megatron"))
    one = score(GPT, HW, CandidateArrays(**row), **kw)
    two = score(
        GPT, HW, CandidateArrays(**{k: np.concatenate([v, v]) for k, v in row.items()}), **kw
    )
    for name, values in one.stage_memory.items():
        assert values[0].tolist() == two.stage_memory[name][1].tolist(), name
    assert one.peak_bytes_per_gpu.tolist() == two.peak_bytes_per_gpu[:1].tolist()
    assert one.params_bytes.tolist() == two.params_bytes[:1].tolist()


def test_partial_activation_offload_sits_between_none_and_all_and_grows_with_the_layers_offloaded():
    # Megatron-Core's cpu_offloading_num_layers: the first N blocks' saved tensors go to the host
    from planner.catalog import get
    from planner.errors import ConfigError
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    spec = get("llama3-8b")

    def run(offload, layers=None):
        cfg = ParallelConfig(
            dp=8,
            tp=1,
            pp=1,
            zero=1,
            micro_batch=1,
            global_batch=8,
            seq=8192,
            offload=offload,
            framework="megatron",
        )
        return estimate(
            spec, "p5.48xlarge", cfg, gpus=8, options=RunOptions(activation_offload_layers=layers)
        )

    none, every = run("none"), run("activations")
    parts = [run("activations", n) for n in (4, 16, 28)]
    acts = [e.memory()["activations_bytes"] for e in (none, *parts, every)]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == len(acts)
    assert (
        run("activations", 32).memory()["activations_bytes"] == every.memory()["activations_bytes"]
    )
    assert none.step_time_s <= parts[0].step_time_s <= every.step_time_s
    with pytest.raises(ConfigError, match="activation_offload_layers"):
        run("activations", 0)
    # Transformer Engine's offload handler reloads one group ahead at the start of the backward, while the rank
    # still holds its n - N kept blocks: n - N + 1 blocks (the embedding's and head's share offloads with them)
    from cost_models.activations import block_bytes
    from cost_models.blocks import block_table

    block = float(block_bytes(block_table(spec, "amp-bf16", "fused"), 1, 8192))
    ends = none.memory()["activations_bytes"] - 32 * block
    assert parts[2].memory()["activations_bytes"] == pytest.approx(
        (32 - 28 + 1) * block + ends * 4 / 32, rel=1e-9
    )


def test_expandable_segments_drop_the_caching_allocators_overhead_from_what_the_device_must_hold():
    """cost_models.memory.allocator_overhead: the caching allocator's blocks outgrow their tensors (the framework's
    allocator_overhead_fraction); with expandable segments free pages are remapped where requests need them, so
    the device holds the peak and the CUDA context only. A run near capacity fits with them and not without."""
    import dataclasses

    from planner.catalog import get
    from planner.errors import ConfigError
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    caching, expandable = (
        software_for("megatron"),
        software_for("megatron", options=RunOptions(expandable_segments=True)),
    )
    assert not caching.expandable_segments and expandable.expandable_segments
    peak = np.array([10e9, 70e9])
    ctx = M.cuda_context_bytes(HW)
    frac = caching.framework.allocator_overhead_fraction
    assert frac > 0
    assert M.needed_bytes(peak, HW, caching) == pytest.approx(peak * (1 + frac) + ctx)
    assert M.needed_bytes(peak, HW, expandable) == pytest.approx(peak + ctx)
    # the stacks whose launchers set it hold it by default; a run can say otherwise
    assert (
        software_for("torchtitan").expandable_segments
        and not software_for("fsdp").expandable_segments
    )
    assert not software_for(
        "torchtitan", options=RunOptions(expandable_segments=False)
    ).expandable_segments

    cfg = ParallelConfig(
        dp=8, tp=1, pp=1, zero=1, micro_batch=1, global_batch=8, seq=8192, framework="megatron"
    )
    spec = get("llama3-8b")
    base = estimate(spec, "p5.48xlarge", cfg, gpus=8)
    # a device just large enough for the peak with the context, not for the caching allocator's overhead too
    p5 = load_profile("p5.48xlarge")
    tight = dataclasses.replace(
        p5, memory_bytes=base.peak_bytes_per_gpu * (1 + frac / 2) + M.cuda_context_bytes(p5)
    )
    no, yes = (
        estimate(spec, tight, cfg, gpus=8, options=RunOptions(expandable_segments=e))
        for e in (False, True)
    )
    assert no.peak_bytes_per_gpu == yes.peak_bytes_per_gpu
    assert not no.fits and yes.fits
    assert yes.to_document()["software"]["expandable_segments"] is True
    with pytest.raises(ConfigError, match="expandable_segments"):
        estimate(spec, "p5.48xlarge", cfg, gpus=8, options=RunOptions(expandable_segments="yes"))


def test_a_fused_rmsnorm_keeps_only_its_input_and_streams_less():
    """torchtitan's fused_rmsnorm (a Triton kernel saving x, weight and rstd) against the module's op-by-op RMSNorm,
    which saves the fp32 upcast and the fp32 normalized copy: per norm 4 + 4 - r bytes per hidden element less
    (r = 2 for the bf16 residual of FSDP2's bf16 parameters), and one kernel reading x and writing y."""
    from planner.catalog import get
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    spec = get("llama3-8b")
    h = spec.hidden
    # the eager (HF) table counts the normalized copy in the residual dtype: 4 + r - r per norm there
    for kernels, per_norm in (("torch", 4 + 4 - 2), ("eager", 4)):
        plain, fused = (block_table(spec, "bf16", kernels, fused_norm=f) for f in (False, True))
        less = float(plain.saved.at(1, False, 4096) - fused.saved.at(1, False, 4096))
        assert less == pytest.approx(spec.norms_per_block * h * per_norm), kernels
        assert float(fused.traffic_fwd.at(1, False, 4096)) < float(
            plain.traffic_fwd.at(1, False, 4096)
        )
        assert fused.kernels_fwd < plain.kernels_fwd
    # Megatron's fused block already fuses its norms: the option changes nothing there
    assert block_table(spec, "bf16", "fused", fused_norm=True) == block_table(spec, "bf16", "fused")
    cfg = ParallelConfig(
        dp=8, zero=3, micro_batch=2, global_batch=16, seq=4096, framework="torchtitan"
    )
    plain, fused = (
        estimate(spec, "p4d.24xlarge", cfg, gpus=8, options=RunOptions(fused_norm=f))
        for f in (False, True)
    )
    assert fused.memory()["activations_bytes"] < plain.memory()["activations_bytes"]
    assert fused.step_time_s < plain.step_time_s
    assert (
        fused.to_document()["software"]["fused_norm"] is True
        and plain.to_document()["software"]["fused_norm"] is False
    )
    from planner.errors import ConfigError

    with pytest.raises(ConfigError, match="fused_norm") as err:
        estimate(spec, "p4d.24xlarge", cfg, gpus=8, options=RunOptions(fused_norm="yes"))
    assert "\n" not in str(err.value)


def test_largest_module_is_the_fused_up_projection_or_qkv():
    from cost_models.params import largest_module_params
    from planner.catalog import get

    h = 12288
    assert largest_module_params(get("gpt3-175b")) == 4 * h * h  # h -> 4h, larger than QKV (3 h^2)
    llama = get("llama3-70b")  # gate and up fused: 2 h f
    assert largest_module_params(llama) == 2 * llama.hidden * llama.d_ffn
    wide_attention = GPT.with_(ffn=GPT.hidden)  # f = h: QKV (3 h^2) is the largest
    assert largest_module_params(wide_attention) == 3 * GPT.hidden**2


def test_deepspeed_zero3_gathers_modules_up_to_its_live_parameter_bound_while_fsdp_gathers_two_blocks():
    """ZeRO-3 by module (DeepSpeed, stage3_max_live_parameters 1e9) holds max(largest module, 1e9) parameters
    gathered where FSDP holds the block in use and the one prefetched; for blocks smaller than that both agree."""
    from cost_models.params import block_params, largest_module_params, total_params
    from planner.catalog import get
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    def gathered(spec, framework, dp=64):
        """Parameter bytes beyond the rank's own shard, in parameters of the gather dtype."""
        cfg = ParallelConfig(
            dp=dp,
            tp=1,
            pp=1,
            zero=3,
            micro_batch=1,
            global_batch=dp,
            recompute="full",
            precision="amp-fp16",
            framework=framework,
            seq=2048,
        )
        sw = software_for(framework)
        shard = sw.states("amp-fp16", "adamw")[0] * total_params(spec) / dp
        params = estimate(spec, "dgx-a100-80g", cfg, gpus=dp).scores.params_bytes[0]
        return (params - shard) / sw.state_bytes("amp-fp16").gather

    big = get("gpt3-175b")  # block 1.8e9 parameters, largest module 6.0e8
    assert gathered(big, "fsdp") == pytest.approx(2 * block_params(big) * (1 - 1 / 64), rel=1e-9)
    assert gathered(big, "deepspeed") == pytest.approx(1e9 * (1 - 1 / 64), rel=1e-9)
    huge = big.with_(
        hidden=25600, heads=160, ffn=4 * 25600, layers=8
    )  # Megatron's 1T shape: a 2.6e9 module
    assert largest_module_params(huge) > 1e9
    assert gathered(huge, "deepspeed") == pytest.approx(
        largest_module_params(huge) * (1 - 1 / 64), rel=1e-9
    )
    small = get("llama3-8b")  # two blocks (4.4e8) under the bound: no difference
    assert 2 * block_params(small) < 1e9
    assert gathered(small, "deepspeed") == pytest.approx(gathered(small, "fsdp"), rel=1e-9)


def test_zero3_max_live_params_in_a_framework_file_is_checked(tmp_path):
    import json
    from frameworks import load_framework
    from frameworks.loader import FRAMEWORK_DIR
    from planner.errors import ConfigError

    base = json.loads((FRAMEWORK_DIR / "deepspeed.json").read_text())
    assert load_framework("deepspeed").zero3_max_live_params == 1e9
    assert load_framework("fsdp").zero3_max_live_params is None
    for i, bad in enumerate((-1, True, "1e9", 1e13)):
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps({**base, "zero3_max_live_params": bad}))
        with pytest.raises(ConfigError, match="zero3_max_live_params"):
            load_framework(str(path))
    unsourced = {
        **base,
        "sources": {k: v for k, v in base["sources"].items() if k != "zero3_max_live_params"},
    }
    path = tmp_path / "unsourced.json"
    path.write_text(json.dumps(unsourced))
    with pytest.raises(ConfigError, match="sources.zero3_max_live_params"):
        load_framework(str(path))


def test_offloading_optimizer_and_activations_together_costs_both_and_holds_the_least():
    """offload=optimizer+activations (DeepSpeed offload_optimizer with cpu_checkpointing): no optimizer states
    and no saved checkpoints on the device, and the PCIe traffic of both."""
    from planner.catalog import get
    from planner.errors import ConfigError
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    spec = get("gpt3-175b")
    runs = {}
    for offload in OFFLOAD:
        cfg = ParallelConfig(
            dp=64,
            tp=1,
            pp=1,
            zero=3,
            micro_batch=4,
            global_batch=256,
            recompute="full",
            precision="amp-fp16",
            framework="deepspeed",
            offload=offload,
            seq=2048,
        )
        assert cfg.offloads("optimizer") == ("optimizer" in offload)
        assert cfg.offloads("activations") == ("activations" in offload)
        runs[offload] = estimate(spec, "dgx-a100-80g", cfg, gpus=64)
    both, opt, act = runs["optimizer+activations"], runs["optimizer"], runs["activations"]
    assert float(both.scores.optimizer_bytes[0]) == 0.0 == float(opt.scores.optimizer_bytes[0])
    assert float(both.scores.saved_activations_bytes[0]) == pytest.approx(
        float(act.scores.saved_activations_bytes[0])
    )
    assert both.peak_bytes_per_gpu < min(opt.peak_bytes_per_gpu, act.peak_bytes_per_gpu)
    assert float(both.scores.offload[0]) == pytest.approx(float(act.scores.offload[0]))
    assert float(both.scores.optimizer[0]) == pytest.approx(float(opt.scores.optimizer[0]))
    # a stack without it says so in one line
    cfg = ParallelConfig(
        dp=64,
        tp=1,
        pp=1,
        zero=3,
        micro_batch=4,
        global_batch=256,
        recompute="full",
        precision="amp-bf16",
        framework="torchtitan",
        offload="optimizer+activations",
        seq=2048,
    )
    with pytest.raises(ConfigError, match="offload=optimizer\\+activations"):
        estimate(spec, "dgx-a100-80g", cfg, gpus=64)
