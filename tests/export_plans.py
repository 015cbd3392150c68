"""Plan documents for the export tests: real `planner estimate` documents (with model.arch), plus
variants that set the newer plan fields (cp, ep, dp_shard, fp8, ...) the estimator does not cost yet."""

from __future__ import annotations

import copy
from dataclasses import asdict
from functools import cache

from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.plan import plan_from_document


@cache
def _base(model: str, hardware: str, gpus: int, config: tuple) -> dict:
    return estimate(model, hardware, ParallelConfig(**dict(config)), gpus=gpus).to_document()


GPT3 = (
    "gpt3-175b",
    "p4d.24xlarge",
    960,
    (
        ("dp", 12),
        ("tp", 8),
        ("pp", 10),
        ("micro_batch", 1),
        ("global_batch", 1440),
        ("schedule", "interleaved-1f1b"),
        ("virtual_stages", 2),
        ("zero", 1),
        ("recompute", "selective"),
        ("sequence_parallel", True),
        ("seq", 2048),
        ("stages", (4,) + (5,) * 18 + (2,)),
    ),
)
LLAMA = (
    "llama3-70b",
    "p5.48xlarge",
    512,
    (
        ("dp", 32),
        ("tp", 4),
        ("pp", 4),
        ("micro_batch", 1),
        ("global_batch", 512),
        ("schedule", "1f1b"),
        ("zero", 1),
        ("sequence_parallel", True),
        ("seq", 8192),
    ),
)

LLAMA_B200 = (LLAMA[0], "p6-b200.48xlarge", *LLAMA[2:])
"""The Llama plan on B200s, whose tensor cores run block-scaled FP8 (MXFP8)."""


def _interleaved_fp8(base: tuple, scaling: str, **software) -> tuple:
    """`base` under FP8 with `scaling` (and `software` options), interleaved over 5 chunks of 4
    blocks per rank."""
    changes = dict(
        schedule="interleaved-1f1b",
        virtual_stages=5,
        stages=[4] * 20,
        precision="fp8",
        _software={"fp8_scaling": scaling, **software},
    )
    return base, changes, {}


FSDP_LLAMA = (
    "llama3-8b",
    "p5.48xlarge",
    64,
    (
        ("dp", 64),
        ("micro_batch", 1),
        ("global_batch", 256),
        ("zero", 3),
        ("recompute", "full"),
        ("seq", 8192),
        ("framework", "fsdp"),
    ),
)
FSDP_GPT = (
    "gpt3-6.7b",
    "p4d.24xlarge",
    64,
    (
        ("dp", 64),
        ("micro_batch", 2),
        ("global_batch", 512),
        ("zero", 3),
        ("recompute", "full"),
        ("seq", 2048),
        ("framework", "fsdp"),
    ),
)
DS_GPT = (
    "gpt3-6.7b",
    "p4d.24xlarge",
    64,
    (
        ("dp", 64),
        ("micro_batch", 2),
        ("global_batch", 512),
        ("zero", 3),
        ("recompute", "full"),
        ("seq", 2048),
        ("framework", "deepspeed"),
        ("offload", "optimizer+activations"),
        ("placement", "PDT"),
    ),
)


def catalog_arch(name: str) -> dict:
    """model.arch of a catalog model (the MoE variants put a catalog MoE model on the Llama plan)."""
    from planner.catalog import get

    return {k: v for k, v in asdict(get(name)).items() if k not in ("name", "extras")}


def fsdp_hf(model_type: str, seq: int = 8192, framework: str = "fsdp") -> tuple:
    """FSDP_LLAMA's layout for the released config.json of a Hugging Face family (tests/fixtures/hf)."""
    from pathlib import Path

    path = str(Path(__file__).parent / "fixtures" / "hf" / f"{model_type}.json")
    over = {"seq": seq, "framework": framework}
    return (path, *FSDP_LLAMA[1:3], tuple((k, over.get(k, v)) for k, v in FSDP_LLAMA[3]))


VARIANTS = {
    # name: (base, changes to the plan object, changes to model.arch)
    "gpt3-interleaved-uneven": (GPT3, {}, {}),
    "gpt3-1f1b-ends": (
        GPT3,
        dict(schedule="1f1b", virtual_stages=1, stages=[8] + [10] * 8 + [8], recompute="full"),
        {},
    ),
    "gpt3-pp1-zero0-fp16": (
        GPT3,
        dict(
            dp=120,
            pp=1,
            micro_batch=2,
            global_batch=1920,
            schedule="1f1b",
            virtual_stages=1,
            zero=0,
            stages=[],
            recompute="none",
            precision="amp-fp16",
            sequence_parallel=False,
            placement="PDT",
        ),
        {},
    ),
    "gpt3-gpipe-offload": (
        GPT3,
        dict(
            dp=6,
            tp=4,
            pp=40,
            micro_batch=4,
            global_batch=1440,
            schedule="gpipe",
            virtual_stages=1,
            zero=1,
            stages=[],
            offload="optimizer",
            placement="TDP",
        ),
        {},
    ),
    "gpt3-1f1b-recompute-layers": (
        GPT3,
        dict(schedule="1f1b", virtual_stages=1, stages=[], recompute="full", recompute_layers=3),
        {},
    ),
    "gpt3-zero3-1f1b": (
        GPT3,
        dict(
            schedule="1f1b", virtual_stages=1, zero=3, stages=[10] * 6 + [9] * 4, recompute="full"
        ),
        {},
    ),
    "llama-1f1b": (LLAMA, {}, {}),
    "llama-interleaved": (
        LLAMA,
        dict(schedule="interleaved-1f1b", virtual_stages=5, stages=[4] * 20),
        {},
    ),
    "llama-zb-uneven": (LLAMA, dict(schedule="zero-bubble", stages=[19, 21, 21, 19]), {}),
    "llama-hsdp-cp-fp8": (
        LLAMA,
        dict(
            dp=32,
            tp=8,
            pp=1,
            cp=2,
            cp_comm="p2p",
            zero=3,
            dp_shard=8,
            stages=[],
            global_batch=256,
            micro_batch=1,
            precision="fp8",
            recompute="full",
            placement="PDCT",
            checkpoint_interval_s=1800.0,
        ),
        {},
    ),
    "llama-interleaved-fp8-delayed": _interleaved_fp8(LLAMA, "delayed"),
    "llama-interleaved-fp8-mxfp8": _interleaved_fp8(LLAMA_B200, "mxfp8"),
    "llama-interleaved-nvfp4": _interleaved_fp8(LLAMA_B200, "nvfp4"),
    "llama-interleaved-nvfp4-params": _interleaved_fp8(LLAMA_B200, "nvfp4", fp8_param_gather=True),
    "llama-hsdp-zero3-megatron-fsdp": (
        LLAMA,
        dict(
            dp=128,
            tp=4,
            pp=1,
            zero=3,
            dp_shard=16,
            stages=[],
            global_batch=512,
            recompute="full",
            placement="DPT",
        ),
        {},
    ),
    "llama-pp1-zero2-sel": (
        LLAMA,
        dict(
            dp=128,
            tp=4,
            pp=1,
            zero=2,
            stages=[],
            global_batch=512,
            recompute="selective",
            placement="DPT",
        ),
        {},
    ),
    "llama-bf16-offload-act": (
        LLAMA,
        dict(
            dp=64,
            tp=8,
            pp=1,
            zero=1,
            stages=[],
            global_batch=512,
            precision="bf16",
            recompute="full",
            offload="activations",
        ),
        {},
    ),
    "llama-custom-shape": (
        LLAMA,
        dict(dp=32, tp=4, pp=4, stages=[6, 6, 6, 6], global_batch=256),
        dict(
            layers=24,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=11008,
            vocab=32000,
            rope_theta=10000.0,
            tied_embeddings=True,
        ),
    ),
    "moe-ep": (
        LLAMA,
        dict(dp=32, tp=4, pp=4, ep=8, stages=[], placement="PDET"),
        dict(
            moe=dict(
                experts=16,
                top_k=2,
                expert_ffn=8192,
                shared_experts=1,
                shared_expert_ffn=8192,
                first_dense_layers=1,
            )
        ),
    ),
    "moe-ep-recompute-modules": (
        LLAMA,
        dict(
            dp=32,
            tp=4,
            pp=4,
            ep=8,
            stages=[],
            placement="PDET",
            recompute="selective",
            _software={"recompute_modules": ["layernorm", "moe"]},
        ),
        dict(
            moe=dict(
                experts=16,
                top_k=2,
                expert_ffn=8192,
                shared_experts=1,
                shared_expert_ffn=8192,
                first_dense_layers=1,
            )
        ),
    ),
    "moe-deepseek-v3": (
        LLAMA,
        dict(dp=32, tp=4, pp=4, ep=8, stages=[16, 15, 15, 15], placement="PDET", seq=4096),
        catalog_arch("deepseek-v3"),
    ),
    "moe-qwen3-30b": (
        LLAMA,
        dict(dp=64, tp=2, pp=4, ep=16, stages=[], placement="PDET", seq=4096),
        catalog_arch("qwen3-30b-a3b"),
    ),
    # DeepEP through Megatron-Core's flex dispatcher, the exchange hidden under interleaved stages
    "moe-qwen3-30b-deepep-overlap": (
        LLAMA,
        dict(
            dp=64,
            tp=2,
            pp=4,
            ep=16,
            stages=[],
            placement="PDET",
            seq=4096,
            schedule="interleaved-1f1b",
            virtual_stages=2,
            _software={"moe_dispatcher": "deepep", "moe_a2a_overlap": True},
        ),
        catalog_arch("qwen3-30b-a3b"),
    ),
    "fsdp-llama-zero3-ckpt": (FSDP_LLAMA, dict(checkpoint_interval_s=1200.0), {}),
    "fsdp-llama-hsdp-zero2": (FSDP_LLAMA, dict(zero=2, dp_shard=8, micro_batch=2), {}),
    "fsdp-llama-recompute-layers": (FSDP_LLAMA, dict(recompute="full", recompute_layers=5), {}),
    "fsdp-llama-ddp": (FSDP_LLAMA, dict(zero=0, micro_batch=1, precision="amp-fp16"), {}),
    "fsdp-llama-bf16-offload": (
        FSDP_LLAMA,
        dict(precision="bf16", offload="optimizer", recompute="none"),
        {},
    ),
    "fsdp-gpt3-zero3": (FSDP_GPT, {}, {}),
    # the released configs of three more Hugging Face families, estimated as the user's config.json would be
    "fsdp-qwen3-8b": (fsdp_hf("qwen3"), {}, {}),
    "fsdp-phi3-mini": (fsdp_hf("phi3", seq=4096), {}, {}),
    "fsdp-gemma-7b": (fsdp_hf("gemma"), {}, {}),
    "torchtitan-qwen3-8b": (
        fsdp_hf("qwen3", framework="torchtitan"),
        dict(tp=2, dp=32, sequence_parallel=True),
        {},
    ),
    "deepspeed-gpt3-zero3-offload-both": (DS_GPT, {}, {}),
    "deepspeed-gpt3-bf16-optimizer": (
        DS_GPT,
        dict(zero=1, offload="none", recompute="full", _software={"bf16_optimizer": True}),
        {},
    ),
}


def document(variant: str) -> dict:
    base, plan_changes, arch_changes = VARIANTS[variant]
    doc = copy.deepcopy(_base(*base))
    plan = doc["plan"]
    plan_changes = dict(plan_changes)
    doc["software"].update(
        plan_changes.pop("_software", {})
    )  # run options the plan was costed with
    plan.update(plan_changes)
    plan["num_microbatches"] = plan["global_batch"] // (plan["dp"] * plan["micro_batch"])
    plan["world_size"] = plan["dp"] * plan["tp"] * plan["pp"] * plan.get("cp", 1)
    doc["model"]["arch"].update(arch_changes)
    describe_model(doc["model"])
    if "moe" in arch_changes and arch_changes.get("model_type"):
        doc["model"]["name"] = variant
    return doc


def describe_model(model: dict) -> None:
    """The model description and parameter count of an edited `model.arch`, as estimate writes them (the plan
    reader refuses a description that no longer matches its arch: planner.plan.check_against_model)."""
    from cost_models.params import total_params
    from planner.plan import DESCRIPTION_FIELDS
    from planner.spec import TransformerSpec, record_of

    spec = record_of(TransformerSpec, {"name": model["name"], **model["arch"]}, "model.arch")
    for key, attribute in DESCRIPTION_FIELDS.items():
        if key in model or key in ("layers", "hidden", "heads", "vocab"):
            model[key] = getattr(spec, attribute)
    model["params"] = total_params(spec)


def plan_for(variant: str):
    return plan_from_document(document(variant))
