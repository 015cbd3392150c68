"""The ops Megatron-Core runs outside its fused kernels for gpt-oss: RoPE under YaRN's attention
factor, the routed experts' fc2 bias and the activation clamp (cost_models.blocks
unfused_rope_traffic, moe_expert_traffic). Expected bytes are counted here from the Megatron-Core
source the docstrings cite (rope_utils.py, experts.py, fused_bias_geglu.py at core_r0.16.0), not
read from the code."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from cost_models import blocks as B
from cost_models import compute as K
from cost_models.activations import block_table_of
from planner.catalog import get
from planner.cli import app
from planner.errors import ConfigError
from planner.hf_config import spec_from_dict
from planner.parallel import ParallelConfig
from planner.run_options import RunOptions
from planner.software import software_for
from planner.spec import yarn_attention_factor
from tests.fixtures.cli import one_line
from tests.fixtures.steps import step

GPT_OSS = get("gpt-oss-120b")
PLAIN = GPT_OSS.with_(rope_attention_factor=1.0, activation_clamp=0.0, mlp_bias=False)
"""gpt-oss without the three: what the fused table held before."""
YARN_32 = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0}


def test_yarn_attention_factor_is_the_papers_formula():
    assert yarn_attention_factor(32.0) == pytest.approx(0.1 * math.log(32.0) + 1.0)
    assert yarn_attention_factor(40.0, 1.0, 1.0) == 1.0  # DeepSeek-V3's mscale pair
    assert yarn_attention_factor(40.0, 0.707, 1.0) == pytest.approx(
        (0.0707 * math.log(40.0) + 1.0) / (0.1 * math.log(40.0) + 1.0)
    )
    assert yarn_attention_factor(1.0) == 1.0


def test_hf_reader_takes_the_yarn_factor_and_the_swiglu_limit():
    oss = spec_from_dict(
        {"model_type": "gpt_oss", "rope_scaling": YARN_32, "swiglu_limit": 5.0}, name="oss"
    )
    assert oss.rope_attention_factor == pytest.approx(1.3465736)
    assert oss.activation_clamp == 5.0
    given = spec_from_dict(
        {"model_type": "qwen3_moe", "rope_scaling": YARN_32 | {"attention_factor": 1.1}}, name="q"
    )
    assert given.rope_attention_factor == 1.1
    llama3 = {"rope_type": "llama3", "factor": 8.0}
    assert (
        spec_from_dict(
            {"model_type": "mixtral", "rope_scaling": llama3}, name="m"
        ).rope_attention_factor
        == 1.0
    )
    with pytest.raises(ConfigError, match="factor"):
        spec_from_dict(
            {"model_type": "gpt_oss", "rope_scaling": YARN_32 | {"factor": -2}}, name="x"
        )
    with pytest.raises(ConfigError, match="activation_clamp"):
        GPT_OSS.with_(activation_clamp=-1.0)


def test_gpt_oss_fused_table_adds_the_source_counted_bytes():
    c = 2
    q_k = 64 * 64 + 8 * 64  # query and key elements per token
    rope = 12 * c * q_k  # t cos 2, -x2 1, cat 2, x sin 2, add 3, cat 2
    bias = 4 * 6 * c * 2880  # top-4 copies: b p 1, t + b p 3, cat 2
    clamp = 4 * 8 * c * 2880  # two clamps over 2 f_e (4 f_e c), the cat (4 f_e c)
    full = B.block_table(GPT_OSS, "amp-bf16", "fused")
    plain = B.block_table(PLAIN, "amp-bf16", "fused")
    extra = full.traffic_fwd.at(1, False, 4096) - plain.traffic_fwd.at(1, False, 4096)
    assert extra == pytest.approx(rope + bias + clamp)
    assert full.copy_traffic_fwd.at(1, False, 4096) == pytest.approx(rope + bias + clamp)
    assert full.kernels_fwd - plain.kernels_fwd == 22 + 3
    # tensor parallelism splits the heads and the experts' width, not the bias's h
    assert full.copy_traffic_fwd.at(2, False, 4096) == pytest.approx(rope / 2 + bias + clamp / 2)
    # eager modules (Hugging Face's) and torch.compile'd ones run none of Megatron-Core's paths
    eager, eager_plain = (B.block_table(s, "amp-bf16", "eager") for s in (GPT_OSS, PLAIN))
    assert eager.traffic_fwd == eager_plain.traffic_fwd


def test_mla_and_plain_rope_models_run_the_fused_kernel():
    dsv3 = get("deepseek-v3")
    yarn = dsv3.with_(rope_attention_factor=1.5)
    assert B.block_table(yarn, "fp8", "fused") == B.block_table(dsv3, "fp8", "fused")
    assert B.unfused_rope_traffic(get("qwen3-235b-a22b"), 2) == B.Terms()


def test_copy_like_ops_stream_their_forward_bytes_once_in_the_backward():
    cfg = ParallelConfig(dp=8, ep=8, micro_batch=1, global_batch=64, seq=4096, placement="PDET")
    full, plain = (K.block_seconds(step(s, cfg)) for s in (GPT_OSS, PLAIN))
    added_fwd = float(full.elem_fwd[0] - plain.elem_fwd[0])
    added_bwd = float(full.elem_bwd[0] - plain.elem_bwd[0])
    assert added_fwd > 0
    assert added_bwd == pytest.approx(B.COPY_BWD_TRAFFIC_FACTOR * added_fwd)


def test_moe_act_recompute_reruns_the_clamp_not_the_bias():
    c = 2
    with_clamp = B.module_sac(GPT_OSS, "amp-bf16", ("moe_act",))
    without = B.module_sac(GPT_OSS.with_(activation_clamp=0.0), "amp-bf16", ("moe_act",))
    assert (with_clamp.elem.at(1, False, 4096) - without.elem.at(1, False, 4096)) == pytest.approx(
        4 * 8 * c * 2880
    )


def test_deepep_and_hybridep_hand_the_bias_fp32_probabilities():
    c = 2
    bf16 = B.block_table(GPT_OSS, "amp-bf16", "fused")
    fp32 = B.block_table(GPT_OSS, "amp-bf16", "fused", fp32_probs=True)
    # b p in fp32 (w 4), t + b p (r 2 + 4, w 4), the cat (r 4, w 4), the cast back (r 4, w 2): 28
    extra = fp32.traffic_fwd.at(1, False, 4096) - bf16.traffic_fwd.at(1, False, 4096)
    assert extra == pytest.approx(4 * (28 - 6 * c) * 2880)
    plain = PLAIN.with_(activation_clamp=7.0)  # no biases: the probabilities' dtype costs nothing
    assert B.block_table(plain, "amp-bf16", "fused", fp32_probs=True) == B.block_table(
        plain, "amp-bf16", "fused"
    )
    # through the software: the DeepEP dispatcher's table carries the fp32 products
    tables = {
        d: block_table_of(
            software_for("megatron", RunOptions(moe_dispatcher=d)), GPT_OSS, "amp-bf16"
        )
        for d in ("alltoall", "deepep")
    }
    moved = tables["deepep"].traffic_fwd.at(1, False, 4096) - tables["alltoall"].traffic_fwd.at(
        1, False, 4096
    )
    assert moved == pytest.approx(4 * (28 - 6 * c) * 2880)


def test_compiled_modules_fuse_what_megatron_core_leaves_unfused():
    for dispatcher in ("alltoall", "deepep"):
        sw = software_for("torchtitan", RunOptions(compile=True, moe_dispatcher=dispatcher))
        full, plain = (block_table_of(sw, s, "amp-bf16") for s in (GPT_OSS, PLAIN))
        assert full.traffic_fwd.at(1, False, 4096) == pytest.approx(
            plain.traffic_fwd.at(1, False, 4096)
        )
        assert full.kernels_fwd == plain.kernels_fwd and full.traffic_fwd.rep > 0


def test_a_gpt_oss_config_without_rope_scaling_takes_its_classes_yarn_default():
    # transformers' GptOssConfig defaults rope_scaling to YaRN with factor 32
    assert spec_from_dict({"model_type": "gpt_oss"}, name="oss").rope_attention_factor == (
        pytest.approx(0.1 * math.log(32.0) + 1.0)
    )
    with pytest.raises(ConfigError, match="factor"):
        spec_from_dict(
            {"model_type": "gpt_oss", "rope_scaling": YARN_32 | {"factor": float("nan")}}, name="x"
        )


def test_a_bad_yarn_factor_on_the_command_line_is_one_line_exit_2(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"model_type": "gpt_oss", "rope_scaling": YARN_32 | {"factor": "32x"}})
    )
    args = ["estimate", str(config), "--hardware", "dgx-h100", "--gpus", "8", "--ep", "8"]
    result = CliRunner().invoke(app, [*args, "--dp", "8"])
    one_line(result, "factor", "positive number")
