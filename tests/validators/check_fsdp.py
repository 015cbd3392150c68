"""Run exported `fsdp` files through Accelerate's launcher code and FSDP plugin and transformers' own
classes, as `accelerate launch --config_file FILE train.py` and the script's Trainer would.

One list a line, one PLANNER-RESULT line each, until stdin closes (_serve.py).
stdin: JSON list of {"text": exported file}. stdout: JSON list of {"ok": true, "config": {...}} or
{"ok": false, "error": "..."}.

For each file: `ClusterConfig.from_yaml_file` (unknown keys refused), the launcher's own argument
parser + `_validate_launch_command` + `prepare_multi_gpu_env` (the FSDP_* / PARALLELISM_CONFIG_*
environment the training processes get), then in that environment `FullyShardedDataParallelPlugin()`
and `ParallelismConfig()` (their __post_init__ read and check it; the mesh must cover every process),
the `TrainingArguments(**kwargs)` of the commented Python block, the Hugging Face model of its config
built on the meta device (parameter count) and the plugin's transformer auto-wrap policy resolved
against that model (the decoder layer class must exist in it).

Shims: the launcher's free-port probe answers "free" (no socket is opened for a config check), and
TrainingArguments' bf16 capability check answers yes (the plan's GPUs, A100/H100 class, have bf16;
this machine has no GPU).
"""

import ast
import contextlib
import io
import json
import logging
import os
import tempfile
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
import accelerate.utils.launch as launch_utils  # noqa: E402
import transformers  # noqa: E402
import transformers.training_args  # noqa: E402
from accelerate.commands.config.config_args import ClusterConfig  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402
from accelerate.parallelism_config import ParallelismConfig  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin  # noqa: E402

launch_utils.is_port_in_use = lambda *a, **k: False
# the launcher refuses fp8 unless Transformer Engine, MS-AMP or torchao is installed: a property of
# the nodes
launch_utils.is_fp8_available = lambda: True
transformers.training_args.is_torch_bf16_gpu_available = lambda *a, **k: True


def python_block(text):
    """The commented Python block between the BEGIN/END markers, uncommented."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# --- BEGIN train.py"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# --- END train.py"))
    return "\n".join(
        line[2:] if line.startswith("# ") else line[1:] for line in lines[start + 1 : end]
    )


def calls(source):
    """{callee name: keyword arguments} of the block's top-level assignments (literal values only)."""
    out = {}
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
        ):
            call = node.value
            out[call.func.id] = (
                {k.arg: ast.literal_eval(k.value) for k in call.keywords}
                if call.keywords
                else [ast.unparse(a) for a in call.args]
            )
    return out


def _first(config, *names):
    """The first of these attributes the Hugging Face config has (GPT-2 names its own)."""
    return next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)


def check(item, workdir, i):
    path = os.path.join(workdir, f"planner_fsdp_{i}.yaml")
    with open(path, "w") as f:
        f.write(item["text"])
    saved = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cluster = ClusterConfig.from_yaml_file(path)
            args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
            args, _, _ = _validate_launch_command(args)
            env = launch_utils.prepare_multi_gpu_env(args)
            os.environ.clear()
            os.environ.update(env)
            plugin = FullyShardedDataParallelPlugin() if args.use_fsdp else None
            if plugin is not None and env["ACCELERATE_MIXED_PRECISION"] != "no":
                plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
            mesh = None
            if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
                pc = ParallelismConfig()
                if pc.total_size != cluster.num_processes:
                    raise ValueError(
                        f"ParallelismConfig total_size ({pc.total_size}) does not match num_processes "
                        f"({cluster.num_processes})"
                    )
                mesh = {"dp_replicate": pc.dp_replicate_size, "dp_shard": pc.dp_shard_size}
            block = calls(python_block(item["text"]))
            targs = transformers.TrainingArguments(**block["TrainingArguments"])
            ((config_cls, config_kwargs),) = [
                (k, v) for k, v in block.items() if k.endswith("Config")
            ]
            (model_cls,) = [
                k for k, v in block.items() if k not in ("TrainingArguments", config_cls)
            ]
            model_config = getattr(transformers, config_cls)(**config_kwargs)
            with torch.device("meta"):
                model = getattr(transformers, model_cls)(model_config)
            params = sum(p.numel() for p in model.parameters())
            wrapped = None
            if plugin is not None:
                plugin.set_auto_wrap_policy(
                    model
                )  # ValueError if the layer class is not in the model
                layer_classes = set(plugin.transformer_cls_names_to_wrap)
                wrapped = sum(type(m).__name__ in layer_classes for m in model.modules())
        out = {
            "distributed_type": str(cluster.distributed_type),
            "num_processes": cluster.num_processes,
            "num_machines": cluster.num_machines,
            "mixed_precision": env["ACCELERATE_MIXED_PRECISION"],
            "fsdp_version": None if plugin is None else plugin.fsdp_version,
            "reshard_after_forward": None if plugin is None else plugin.reshard_after_forward,
            "cpu_offload": None
            if plugin is None
            else bool(
                getattr(plugin.cpu_offload, "offload_params", False)
                or type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy"
            ),
            "activation_checkpointing": None if plugin is None else plugin.activation_checkpointing,
            "param_dtype": None
            if plugin is None or plugin.mixed_precision_policy is None
            else str(plugin.mixed_precision_policy.param_dtype),
            "mesh": mesh,
            "wrapped_layers": wrapped,
            "per_device_train_batch_size": targs.per_device_train_batch_size,
            "gradient_accumulation_steps": targs.gradient_accumulation_steps,
            "bf16": targs.bf16,
            "fp16": targs.fp16,
            "gradient_checkpointing": targs.gradient_checkpointing,
            # what the Trainer hands Accelerator(mixed_precision=...), and the FP8 backend the
            # launcher exported
            "trainer_mixed_precision": targs.mixed_precision,
            "fp8_backend": env.get("ACCELERATE_FP8_BACKEND"),
            "hidden": _first(model_config, "hidden_size", "n_embd"),
            "heads": _first(model_config, "num_attention_heads", "n_head"),
            "vocab": model_config.vocab_size,
            "save_strategy": str(targs.save_strategy),
            "save_steps": targs.save_steps,
            "model_type": model_config.model_type,
            "params": params,
            "layers": len(
                [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]
            ),
        }
        return {"ok": True, "config": json.loads(json.dumps(out, default=str))}
    except BaseException as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}
    finally:
        os.environ.clear()
        os.environ.update(saved)


if __name__ == "__main__":
    from _serve import serve

    with tempfile.TemporaryDirectory() as tmp:
        serve(lambda items, first: [check(item, tmp, first + i) for i, item in enumerate(items)])
