"""Run Megatron-LM's own parse_args + validate_args on exported argument files (one process, many files).

One list a line, one PLANNER-RESULT line each, until stdin closes (_serve.py).
stdin: JSON list of {"text": argument file, "world_size": int, "device_capability": [major, minor]}.
stdout: JSON list of {"ok": true, "args": {...}} or {"ok": false, "error": "..."}.

Shims (the least needed to import megatron.training on a CPU machine with Python 3.11; see
tests/validators/README.md): typing.override from typing_extensions (a 3.12 name), a stand-in for
one triton kernel module that the pipeline schedules import, and the GPU's compute capability that
validate_args asks torch.cuda for (the plan's device, e.g. 9.0 for H100).
"""

import contextlib
import io
import os
import re
import shlex
import sys
import types
import typing

import typing_extensions

if not hasattr(typing, "override"):
    typing.override = typing_extensions.override


def _gpu_kernel(*args, **kwargs):
    raise RuntimeError("GPU kernel called inside the config validator")


_stub = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
_stub.GLOBAL_BLOCK_SIZE = 1024
_stub.paged_stash_copy_kernel = _stub.paged_stash_pop_kernel = _gpu_kernel
sys.modules[_stub.__name__] = _stub

import torch  # noqa: E402

import megatron.training.arguments as arguments  # noqa: E402
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout  # noqa: E402

KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "group_query_attention",
    "num_query_groups",
    "kv_channels",
    "seq_length",
    "max_position_embeddings",
    "position_embedding_type",
    "rotary_base",
    "normalization",
    "swiglu",
    "add_bias_linear",
    "add_qkv_bias",
    "untie_embeddings_and_output_weights",
    "vocab_size",
    "attention_dropout",
    "hidden_dropout",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "cp_comm_type",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "data_parallel_size",
    "micro_batch_size",
    "global_batch_size",
    "sequence_parallel",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "use_distributed_optimizer",
    "num_distributed_optimizer_instances",
    "use_megatron_fsdp",
    "data_parallel_sharding_strategy",
    "optimizer_cpu_offload",
    "bf16",
    "fp16",
    "fp8",
    "fp8_recipe",
    "fp4",
    "fp4_recipe",
    "fp8_param_gather",
    "fp4_param_gather",
    "use_tp_pp_dp_mapping",
    "save_interval",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "window_size",
    "params_dtype",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "qk_layernorm",
    "mtp_num_layers",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_router_topk_scaling_factor",
    "moe_router_pre_softmax",
    "moe_grouped_gemm",
    "moe_token_dispatcher_type",
    "moe_shared_expert_gate",
    "moe_flex_dispatcher_backend",
    "overlap_moe_expert_parallel_comm",
)


NVFP4_TE = (2, 8, 0)
"""The Transformer Engine an NVFP4 export asks for (planner/exports/megatron.py _fp4_args)."""
_ABSENT_TE = arguments.is_te_min_version


def _te_version_check(installed):
    """megatron's is_te_min_version against `installed` (a version tuple), or the absent TE's."""
    if installed is None:
        return _ABSENT_TE

    def at_least(version, check_equality=True):
        wanted = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
        return installed >= wanted if check_equality else installed > wanted

    return at_least


def check(item):
    text = item["text"]
    env = dict(
        line[len("# env ") :].split("=", 1)
        for line in text.splitlines()
        if line.startswith("# env ")
    )
    saved = dict(os.environ)
    os.environ.update(env, WORLD_SIZE=str(item["world_size"]), RANK="0", LOCAL_RANK="0")
    capability = tuple(item.get("device_capability", (9, 0)))
    torch.cuda.get_device_capability = lambda *a, **k: capability
    arguments.get_device_arch_version = lambda: capability[0]
    # no Transformer Engine here: an NVFP4 export states the TE it needs (>= 2.8, the first with
    # NVFP4BlockScaling), which validate_args asks for; other exports keep the absent TE's answers
    arguments.is_te_min_version = _te_version_check(NVFP4_TE if "--fp4-format" in text else None)
    sys.argv = ["pretrain_gpt.py"] + shlex.split(text, comments=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args = arguments.parse_args()
            arguments.validate_args(args, {})
            chunks = None
            layout = args.pipeline_model_parallel_layout
            if layout is not None:
                if isinstance(layout, str):
                    layout = PipelineParallelLayerLayout(layout, args.pipeline_model_parallel_size)
                chunks = [
                    [sum(1 for t in chunk if str(t).endswith("decoder")) for chunk in rank]
                    for rank in layout.layout
                ]
        out = {k: _plain(getattr(args, k, None)) for k in KEYS}
        out["layout_decoder_blocks"] = chunks
        return {"ok": True, "args": out}
    except BaseException as err:  # argparse exits, asserts: all reported, none raised
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _plain(v):
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


if __name__ == "__main__":
    from _serve import serve

    serve(lambda items, first: [check(item) for item in items])
