"""Hugging Face config.json reader: every supported model_type, and every malformed input as one line + exit 2."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models import params as P
from planner.cli import app
from planner.errors import ConfigError
from planner.hf_config import MODEL_TYPES, read_hf_config
from planner.sources import resolve_model

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
VALIDATION = Path(__file__).resolve().parents[1] / "validation" / "hf_configs"
MOE_FIXTURES = Path(__file__).resolve().parents[1] / "validation" / "models" / "hf_configs"
DENSE_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "gpt2",
    "opt",
    "gpt_neox",
    "bloom",
    "falcon",
    "qwen3",
    "phi3",
    "gemma",
)
FIXTURE = {t: FIXTURES / f"{t}.json" for t in DENSE_TYPES} | {
    "mixtral": MOE_FIXTURES / "mixtral-8x7b.json",
    "qwen2_moe": MOE_FIXTURES / "qwen2-moe-57b-a14b.json",
    "qwen3_moe": MOE_FIXTURES / "qwen3-30b-a3b.json",
    "deepseek_v3": MOE_FIXTURES / "deepseek-v3.json",
    "gpt_oss": MOE_FIXTURES / "gpt-oss-120b.json",
}
"""One config per model_type: tests/fixtures/hf for dense ones, validation/models/hf_configs (the
published MoE configs, provenance in its README) for mixture-of-experts ones."""
runner = CliRunner()

# Element counts of the released checkpoints these configs come from (Hugging Face num_parameters(),
# tied weights once) and, for the validation configs, the count measured by measure_train_steps.py.
EXPECTED = {
    "llama": 1_100_048_384,  # TinyLlama-1.1B: GQA 32/4, untied
    "mistral": 7_241_732_096,  # Mistral-7B-v0.1: GQA 32/8, sliding window
    "qwen2": 494_032_768,  # Qwen2-0.5B: Q/K/V biases, tied, GQA 14/2
    "gpt2": 124_439_808,  # gpt2
    "opt": 125_239_296,  # opt-125m: 2 extra position rows
    "gpt_neox": 162_322_944,  # pythia-160m: parallel residual, untied
    "bloom": 559_214_592,  # bloom-560m: ALiBi, embedding LayerNorm
    "falcon": 6_921_720_704,  # falcon-7b: multi-query, one norm per block, no biases
    "qwen3": 8_190_735_360,  # Qwen3-8B: QK-norm, head_dim 128, GQA 32/8, untied (model card: 8.2B, 6.95B
    # without the embeddings)
    "phi3": 3_821_079_552,  # Phi-3-mini-4k-instruct: fused qkv / gate_up, sliding window 2047 (3.8B)
    "gemma": 8_537_680_896,  # gemma-7b: head_dim 256 (16 x 256 > hidden 3072), GeGLU, tied (8.54B)
    # MoE: validation/models/moe_models.json params_check (an independent count from the same config),
    # which reproduces each publisher's total (tests/test_moe_models.py); differences explained:
    "mixtral": 46_702_792_704,  # Mixtral-8x7B: 8 experts, top-2
    "qwen3_moe": 30_532_122_624,  # Qwen3-30B-A3B: 128 experts of 768, QK-norm
    "gpt_oss": 116_829_156_672,  # gpt-oss-120b: sinks, biases, router bias
    "deepseek_v3": 671_026_404_352,  # params_check 671_026_419_200 less the 58 x 256 balancing biases (a buffer)
    "qwen2_moe": 57_408_658_944,  # params_check 57_408_529_920 plus the Q/K/V biases it leaves out (28 x 4608)
}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_each_model_type_reads_to_the_released_parameter_count(model_type):
    spec = read_hf_config(FIXTURE[model_type])
    assert spec.model_type == model_type
    assert P.total_params(spec) == EXPECTED[model_type]


def test_validation_configs_match_the_measured_parameter_count():
    gpt2m = read_hf_config(VALIDATION / "gpt2-medium.json")
    assert P.total_params(gpt2m) == 355_871_744  # h100_train_steps.jsonl "params" of gpt2-medium
    llama = read_hf_config(VALIDATION / "llama3.2-1b.json")
    assert (llama.n_kv_heads, llama.d_head, llama.tied_embeddings, llama.vocab) == (
        8,
        64,
        True,
        128256,
    )
    assert P.total_params(llama) == 1_235_814_400


def test_features_are_honoured():
    qwen = read_hf_config(FIXTURES / "qwen2.json")
    assert (
        qwen.qkv_bias
        and not qwen.out_bias
        and qwen.tied_embeddings
        and qwen.gated_mlp
        and qwen.rope_theta == 1e6
    )
    falcon = read_hf_config(FIXTURES / "falcon.json")
    assert falcon.n_kv_heads == 1 and falcon.parallel_block and falcon.norms_per_block == 1
    mistral = read_hf_config(FIXTURES / "mistral.json")
    assert mistral.sliding_window == 4096 and mistral.n_kv_heads == 8
    assert read_hf_config(FIXTURES / "opt.json").n_positions == 2050
    assert read_hf_config(FIXTURES / "bloom.json").position == "alibi"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_each_model_type_profiles_through_the_cli(model_type):
    result = runner.invoke(app, ["profile", str(FIXTURE[model_type]), "--seq", "512", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["params"] == EXPECTED[model_type]
    assert doc["flops"]["forward"] > 0 and doc["flops"]["backward"] > doc["flops"]["forward"]
    assert doc["seq"] == 512


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _config(family="llama", **changes):
    data = json.loads((FIXTURES / f"{family}.json").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    "case,text,field",
    [
        ("empty", "", "empty"),
        ("whitespace", "  \n", "empty"),
        ("malformed", '{"model_type": "llama", "hidden_size": 2048,', "not valid JSON"),
        ("not-an-object", "[1, 2, 3]", "JSON object"),
        ("no-model-type", _config(model_type=None), "model_type"),
        ("unknown-model-type", _config(model_type="mamba"), "model_type"),
        ("missing-hidden", _config(hidden_size=None), "hidden_size"),
        ("missing-layers", _config(num_hidden_layers=None), "num_hidden_layers"),
        ("missing-vocab", _config(vocab_size=None), "vocab_size"),
        ("negative-heads", _config(num_attention_heads=-4), "num_attention_heads"),
        ("string-ffn", _config(intermediate_size="5632"), "intermediate_size"),
        ("bad-kv", _config(num_key_value_heads=5), "num_key_value_heads"),
        ("heads-not-dividing", _config(num_attention_heads=30), "num_attention_heads"),
        ("bad-tie", _config(tie_word_embeddings="yes"), "tie_word_embeddings"),
        ("qwen3-window", _config("qwen3", use_sliding_window=True), "use_sliding_window"),
        ("gemma-activation", _config("gemma", hidden_activation="relu"), "hidden_activation"),
        ("phi3-window", _config("phi3", sliding_window=-5), "sliding_window"),
        ("rope-list", _config(rope_scaling=["yarn", 4.0]), "rope_scaling"),
        ("rope-string", _config(rope_parameters="yarn"), "rope_parameters"),
    ],
)
def test_bad_config_is_one_line_naming_the_field_and_exit_2(tmp_path, case, text, field):
    path = _write(tmp_path, f"{case}.json", text)
    result = runner.invoke(app, ["profile", path])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], lines
    assert result.stdout == ""


def test_missing_file_and_unknown_model_exit_2():
    for arg in ("no/such/config.json", "not-a-model"):
        result = runner.invoke(app, ["profile", arg])
        assert (
            result.exit_code == 2
            and "MODEL" in result.stderr
            and len(result.stderr.strip().splitlines()) == 1
        )


def test_opt_embedding_projection_is_refused_by_name(tmp_path):
    data = json.loads((FIXTURES / "opt.json").read_text()) | {"word_embed_proj_dim": 512}
    with pytest.raises(ConfigError) as err:
        resolve_model(_write(tmp_path, "opt350.json", json.dumps(data)))
    assert err.value.field == "word_embed_proj_dim"


def test_seq_beyond_learned_positions_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="seq=4096"):
        resolve_model(str(FIXTURES / "gpt2.json"), seq=4096)


def test_long_context_rope_models_default_to_a_training_length(tmp_path):
    import json as _json

    data = _json.loads((FIXTURES / "qwen2.json").read_text())
    data["max_position_embeddings"] = 131072  # Qwen2 / Llama 3.1 extended context
    path = tmp_path / "config.json"
    path.write_text(_json.dumps(data))
    spec = read_hf_config(path)
    assert spec.seq == 8192 and dict(spec.extras)["seq_default_capped_from"] == 131072
    assert read_hf_config(path, seq=32768).seq == 32768  # an explicit --seq is kept
    data["max_position_embeddings"] = 4096
    path.write_text(_json.dumps(data))
    assert read_hf_config(path).seq == 4096  # short contexts are the model's own
