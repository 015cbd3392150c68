"""Mixture-of-experts models described and counted exactly (docs/models.md): the spec's MoE/MLA/MTP/window
fields and their errors, the HF readers (every bad input one line + exit 2), the catalog entries equal to
their config.json fixtures, and the publishers' total / active / MTP parameter counts
(validation/models/moe_models.json: figures, wording and sources)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cost_models import params as P
from planner import catalog
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import arch_of
from planner.hf_config import read_hf_config
from planner.spec import MLASpec, MoESpec, TransformerSpec
from tests.fixtures.factories import SMALL_DEEPSEEK, SMALL_MIXTRAL

ROOT = Path(__file__).resolve().parents[1]
FACTS = json.loads((ROOT / "validation" / "models" / "moe_models.json").read_text())["models"]
HF = ROOT / "validation" / "models" / "hf_configs"
CATALOG_MOE = [
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "gpt-oss-120b",
]
runner = CliRunner()


def _fixture(name: str) -> TransformerSpec:
    return read_hf_config(HF / f"{name}.json")


# ----------------------------------------------------------------------------- publishers' counts

INPUT_EMBEDDING_ACTIVE = {
    "mixtral-8x7b": True,
    "mixtral-8x22b": True,
    "qwen3-30b-a3b": True,
    "qwen3-235b-a22b": True,
    "qwen2-moe-57b-a14b": True,
    "gpt-oss-120b": False,
    "deepseek-v3": False,
}
"""Whether each publisher's 'active' counts the input embedding (validation/models/README.md): Mistral and
Qwen do; OpenAI's 5.13B and DeepSeek's README_WEIGHTS 36.6B do not."""
TWO_DIGIT_FIGURES = {("qwen3-30b-a3b", "active"), ("qwen2-moe-57b-a14b", "active")}
"""Figures published with two significant digits and not rounded to the nearest (Qwen's model card: 3.35B
reads '3.3B', as 30.53B reads '30.5B'): held to one unit of their last digit instead of 1%."""


def _published(name: str) -> dict:
    pub = FACTS[name]["params_published"]
    active = (
        pub["readme_weights"]["main_active_params_hf_base"]
        if name == "deepseek-v3"
        else pub["active_params"]
    )
    return {"total": pub["total_params"], "active": active}


@pytest.mark.parametrize("name", list(FACTS))
def test_total_and_active_parameters_match_the_publishers(name):
    spec = _fixture(name)
    ours = {
        "total": P.total_params(spec),
        "active": P.active_params(spec, input_embedding=INPUT_EMBEDDING_ACTIVE[name]),
    }
    for key, published in _published(name).items():
        if (name, key) in TWO_DIGIT_FIGURES:
            unit = 10 ** (np.floor(np.log10(published)) - 1)
            assert abs(ours[key] - published) < unit, (key, ours[key], published)
        else:
            assert ours[key] == pytest.approx(published, rel=0.01), (key, ours[key], published)


def test_the_headline_figures_round_from_our_counts():
    """Mixtral 46.7B / 12.9B, DeepSeek-V3 671B / 37B, Qwen3 30.5B / 235B / 22B, gpt-oss 117B / 5.1B."""
    assert round(P.total_params(_fixture("mixtral-8x7b")) / 1e8) == 467
    assert round(P.active_params(_fixture("mixtral-8x7b")) / 1e8) == 129
    ds = _fixture("deepseek-v3")
    assert (
        round(P.total_params(ds) / 1e9) == 671
        and round(P.active_params(ds, input_embedding=False) / 1e9) == 37
    )
    oss = _fixture("gpt-oss-120b")
    assert (
        round(P.total_params(oss) / 1e9) == 117
        and round(P.active_params(oss, input_embedding=False) / 1e8) == 51
    )
    assert (
        int(P.active_params(_fixture("qwen3-30b-a3b")) / 1e8) == 33
    )  # truncated, as the card's 30.5B
    assert round(P.active_params(_fixture("qwen3-235b-a22b")) / 1e9) == 22


def test_qwen_non_embedding_parameters():
    """Qwen3 model cards: 29.9B and 234B without the embedding and the output head."""
    for name, published in (("qwen3-30b-a3b", 29.9e9), ("qwen3-235b-a22b", 234e9)):
        spec = _fixture(name)
        assert P.total_params(spec) - 2 * spec.vocab * spec.hidden == pytest.approx(
            published, rel=0.01
        )


def test_gpt_oss_parameter_breakdown_of_the_model_card():
    """Model card Table 1: MLP 114.71B, attention 0.96B, embed + unembed 1.16B."""
    spec = _fixture("gpt-oss-120b")
    mlp = spec.layers * P.mlp_params(spec)
    attention = spec.layers * P.attention_params(spec)
    assert mlp == pytest.approx(114.71e9, rel=0.001)
    assert attention == pytest.approx(0.96e9, rel=0.01)
    assert P.embedding_params(spec) + P.head_params(spec) == pytest.approx(1.16e9, rel=0.01)


def test_deepseek_mtp_is_counted_apart_as_the_publisher_does():
    """README: 685B on the hub = 671B main model + 14B MTP module (README_WEIGHTS: 11.5B unique, the
    embedding and head, 0.9B each, stored again with it)."""
    spec = _fixture("deepseek-v3")
    assert spec.mtp_modules == 1
    assert P.mtp_params(spec) == pytest.approx(11.5e9, rel=0.01)
    stored = (
        P.total_params(spec) + P.mtp_params(spec) + P.embedding_params(spec) + P.head_params(spec)
    )
    assert stored == pytest.approx(685e9, rel=0.002)
    assert P.total_params(spec.with_(mtp_modules=0)) == P.total_params(spec)


@pytest.mark.parametrize("name", list(FACTS))
def test_counts_equal_an_independent_count_of_the_same_configs(name):
    """validation/models/moe_models.json params_check, written from the same fixtures by another hand:
    equal except where that count says what it did differently."""
    spec, check = _fixture(name), FACTS[name]["params_check"]
    differs = {
        "deepseek-v3": 58 * 256,  # it counted the balancing bias (a buffer, not trained)
        "qwen2-moe-57b-a14b": -28 * 4608,
    }  # it left the Q/K/V biases out
    delta = differs.get(name, 0)
    assert P.total_params(spec) + delta == check["total_params_computed"]
    assert P.active_params(spec) + delta == check["active_params_computed_incl_input_embedding"]
    assert P.embedding_params(spec) == check["input_embedding_params"]


def test_dense_models_are_all_active():
    for name in ("llama3-8b", "gpt3-175b", "bert-large", "t5-3b"):
        spec = catalog.get(name)
        assert P.active_params(spec) == P.total_params(spec)
        assert (
            P.mtp_params(spec) == 0
            and spec.block_kinds[0].spec == spec  # equal: the kinds are cached per equal spec
            and len(spec.block_kinds) == 1
        )


def test_active_without_input_embedding_keeps_a_tied_head():
    spec = catalog.get("gpt2")
    assert (
        P.active_params(spec) - P.active_params(spec, input_embedding=False)
        == P.embedding_params(spec) - spec.vocab * spec.hidden
    )


# ----------------------------------------------------------------------------- catalog and readers


@pytest.mark.parametrize("name", CATALOG_MOE)
def test_catalog_entry_is_its_config_json(name):
    entry, read = catalog.get(name), read_hf_config(HF / f"{name}.json", seq=4096)
    strip = lambda s: {k: v for k, v in asdict(s).items() if k not in ("name", "extras")}  # noqa: E731
    assert strip(entry) == strip(read)
    assert "source" in dict(entry.extras)


def test_the_readers_honour_each_family():
    mixtral = _fixture("mixtral-8x7b")
    assert (mixtral.moe.experts, mixtral.moe.top_k, mixtral.moe.expert_ffn, mixtral.n_kv_heads) == (
        8,
        2,
        14336,
        8,
    )
    assert not (mixtral.qkv_bias or mixtral.mlp_bias or mixtral.sliding_window)
    qwen3 = _fixture("qwen3-30b-a3b")
    assert (
        qwen3.qk_norm
        and qwen3.d_head == 128
        and qwen3.moe.normalize_top_k
        and not qwen3.moe.shared_experts
    )
    qwen2 = _fixture("qwen2-moe-57b-a14b")
    assert (
        qwen2.qkv_bias
        and not qwen2.out_bias
        and qwen2.moe.shared_expert_gate
        and not qwen2.moe.normalize_top_k
    )
    assert (qwen2.moe.shared_experts, qwen2.moe.shared_expert_ffn) == (1, 20480)
    ds = _fixture("deepseek-v3")
    assert ds.mla == MLASpec(
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
    )
    assert (
        ds.d_head,
        ds.d_value,
        ds.moe.first_dense_layers,
        ds.moe.router,
        ds.moe.aux_free_bias,
    ) == (192, 128, 3, "sigmoid", True)
    assert (ds.moe.expert_groups, ds.moe.groups_per_token, ds.moe.routed_scaling, ds.ffn) == (
        8,
        4,
        2.5,
        18432,
    )
    oss = _fixture("gpt-oss-120b")
    assert oss.window_layers == tuple(range(0, 36, 2)) and oss.sliding_window == 128
    assert (
        oss.attention_sinks and oss.moe.router_bias and oss.mlp_bias and oss.rope_theta == 150000.0
    )


def test_reader_defaults_are_the_transformers_classes():
    """A config with only the required keys means what transformers' configuration class makes of it."""
    ds = read_hf_config_dict({"model_type": "deepseek_v3"})
    assert (
        ds.layers,
        ds.hidden,
        ds.moe.experts,
        ds.moe.top_k,
        ds.mla.q_lora_rank,
        ds.mtp_modules,
    ) == (61, 7168, 256, 8, 1536, 0)  # transformers builds no MTP module
    oss = read_hf_config_dict({"model_type": "gpt_oss"})
    assert (
        oss.window_layers == tuple(range(0, 36, 2)) and oss.moe.experts == 128 and oss.d_head == 64
    )
    base = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100}
    mixtral = read_hf_config_dict({"model_type": "mixtral"})
    assert (mixtral.layers, mixtral.hidden, mixtral.heads, mixtral.n_kv_heads, mixtral.vocab) == (
        32,
        4096,
        32,
        8,
        32000,
    )
    assert (mixtral.moe.experts, mixtral.moe.top_k, mixtral.moe.expert_ffn, mixtral.rope_theta) == (
        8,
        2,
        14336,
        1e6,
    )
    q3 = read_hf_config_dict({"model_type": "qwen3_moe", **base})
    assert (q3.heads, q3.n_kv_heads, q3.moe.experts, q3.moe.normalize_top_k, q3.d_head) == (
        32,
        4,
        128,
        False,
        2,
    )
    q2 = read_hf_config_dict({"model_type": "qwen2_moe", **base})
    assert (
        q2.moe.experts,
        q2.moe.top_k,
        q2.moe.expert_ffn,
        q2.moe.shared_expert_ffn,
        q2.qkv_bias,
    ) == (60, 4, 1408, 5632, True)
    windowed = read_hf_config_dict(
        {
            "model_type": "qwen2_moe",
            "use_sliding_window": True,
            "max_window_layers": 3,
            **base,
            "num_hidden_layers": 6,
        }
    )
    assert windowed.window_layers == (0, 2) and windowed.sliding_window == 4096


def read_hf_config_dict(data: dict) -> TransformerSpec:
    from planner.hf_config import spec_from_dict

    return spec_from_dict(data, name="config.json")


def _bad(name: str, **changes) -> str:
    data = json.loads((HF / f"{name}.json").read_text())
    for key, value in changes.items():
        data[key] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    "case,text,field",
    [
        ("mixtral-no-experts", _bad("mixtral-8x7b", num_local_experts=0), "num_local_experts"),
        ("mixtral-topk-over-experts", _bad("mixtral-8x7b", num_experts_per_tok=9), "moe.top_k"),
        (
            "mixtral-string-experts",
            _bad("mixtral-8x7b", num_local_experts="8"),
            "num_local_experts",
        ),
        ("mixtral-bad-kv", _bad("mixtral-8x7b", num_key_value_heads=5), "num_key_value_heads"),
        ("qwen3-sparse-step", _bad("qwen3-30b-a3b", decoder_sparse_step=2), "decoder_sparse_step"),
        ("qwen3-mlp-only", _bad("qwen3-30b-a3b", mlp_only_layers=[0, 1]), "mlp_only_layers"),
        ("qwen3-mlp-only-junk", _bad("qwen3-30b-a3b", mlp_only_layers="none"), "mlp_only_layers"),
        ("qwen3-window", _bad("qwen3-30b-a3b", use_sliding_window=True), "use_sliding_window"),
        (
            "qwen3-no-moe-width",
            _bad("qwen3-30b-a3b", moe_intermediate_size=-768),
            "moe_intermediate_size",
        ),
        ("qwen2-topk", _bad("qwen2-moe-57b-a14b", num_experts_per_tok=65), "moe.top_k"),
        ("qwen2-norm", _bad("qwen2-moe-57b-a14b", norm_topk_prob="yes"), "norm_topk_prob"),
        (
            "qwen2-layer-types",
            _bad("qwen2-moe-57b-a14b", use_sliding_window=True, layer_types=["full_attention"]),
            "layer_types",
        ),
        ("ds-layer-freq", _bad("deepseek-v3", moe_layer_freq=2), "moe_layer_freq"),
        ("ds-kv-heads", _bad("deepseek-v3", num_key_value_heads=8), "num_key_value_heads"),
        ("ds-all-dense", _bad("deepseek-v3", first_k_dense_replace=61), "first_k_dense_replace"),
        ("ds-groups", _bad("deepseek-v3", n_group=7), "n_group"),
        ("ds-topk-group", _bad("deepseek-v3", topk_group=9), "moe.groups_per_token"),
        ("ds-scoring", _bad("deepseek-v3", scoring_func="relu"), "scoring_func"),
        ("ds-kv-rank", _bad("deepseek-v3", kv_lora_rank=0), "kv_lora_rank"),
        ("ds-mtp", _bad("deepseek-v3", num_nextn_predict_layers=-1), "num_nextn_predict_layers"),
        ("ds-scaling", _bad("deepseek-v3", routed_scaling_factor=0), "routed_scaling_factor"),
        (
            "oss-layer-types",
            _bad("gpt-oss-120b", layer_types=["sliding_attention"] * 35),
            "layer_types",
        ),
        (
            "oss-layer-kind",
            _bad("gpt-oss-120b", layer_types=["chunked_attention"] * 36),
            "layer_types",
        ),
        ("oss-experts", _bad("gpt-oss-120b", num_local_experts=True), "num_local_experts"),
        ("oss-window", _bad("gpt-oss-120b", sliding_window=-128), "sliding_window"),
        ("oss-bias", _bad("gpt-oss-120b", attention_bias="true"), "attention_bias"),
    ],
)
def test_bad_moe_config_is_one_line_naming_the_field_and_exit_2(tmp_path, case, text, field):
    path = tmp_path / f"{case}.json"
    path.write_text(text)
    result = runner.invoke(app, ["profile", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], lines
    assert result.stdout == ""


# ----------------------------------------------------------------------------- the spec itself


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(moe=dict(experts=8, top_k=0, expert_ffn=32)), "moe.top_k"),
        (dict(moe=dict(experts=8, top_k=2, expert_ffn=32, router="relu")), "moe.router"),
        (
            dict(moe=dict(experts=8, top_k=2, expert_ffn=32, capacity_factor=0)),
            "moe.capacity_factor",
        ),
        (dict(moe=dict(experts=8, top_k=2, expert_ffn=32, expert_groups=3)), "moe.expert_groups"),
        (
            dict(moe=dict(experts=8, top_k=5, expert_ffn=32, expert_groups=4, groups_per_token=2)),
            "moe.top_k",
        ),
        (
            dict(moe=dict(experts=8, top_k=2, expert_ffn=32, first_dense_layers=4)),
            "moe.first_dense_layers",
        ),
        (dict(moe=dict(experts=2**17, top_k=2, expert_ffn=32)), "moe.experts"),
        (dict(moe=dict(experts=8, top_k=2, expert_ffn=32, gating="x")), "moe.gating"),
        (dict(moe=[8, 2]), "moe"),
        (dict(moe=dict(experts=8, top_k=2)), "moe.expert_ffn"),
        (dict(mla=dict(kv_lora_rank=16)), "mla.qk_rope_head_dim"),
        (
            dict(mla=dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=-1)),
            "mla.v_head_dim",
        ),
        (
            dict(
                mla=dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8),
                kv_heads=2,
            ),
            "kv_heads",
        ),
        (
            dict(
                mla=dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8),
                head_dim=8,
            ),
            "head_dim",
        ),
        (dict(sliding_window=8, window_layers=(0, 4)), "window_layers"),
        (dict(window_layers=(0,)), "window_layers"),
        (dict(sliding_window=8, window_layers=(1, 1)), "window_layers"),
        (dict(mtp_modules=-1), "mtp_modules"),
        (dict(mtp_modules=65), "mtp_modules"),
        (dict(attention_sinks="yes"), "attention_sinks"),
        (dict(encoder_layers=2, moe=dict(experts=8, top_k=2, expert_ffn=32)), "moe"),
    ],
)
def test_bad_spec_fields_are_config_errors_naming_the_field(changes, field):
    with pytest.raises(ConfigError) as err:
        TransformerSpec(name="x", layers=4, hidden=64, heads=4, vocab=100, **changes)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_plan_documents_round_trip_the_nested_records():
    """A plan's model.arch (asdict: nested dicts, lists) builds the same spec back (exports, run specs)."""
    for name in CATALOG_MOE + ["llama3-8b"]:
        spec = catalog.get(name)
        arch = json.loads(json.dumps(arch_of(spec)))
        assert TransformerSpec(name=spec.name, extras=spec.extras, **arch) == spec


def test_block_kinds_split_dense_prefix_and_windows():
    ds = catalog.get("deepseek-v3")
    assert [(k.name, len(k.layers)) for k in ds.block_kinds] == [("dense", 3), ("moe", 58)]
    dense, moe = (k.spec for k in ds.block_kinds)
    assert dense.moe is None and dense.d_ffn == 18432 and moe.moe.first_dense_layers == 0
    assert [(share, kind.moe is not None) for share, kind in ds.block_mix] == [(1.0, True)]
    oss = catalog.get("gpt-oss-120b")
    assert [(k.name, k.layers[:2]) for k in oss.block_kinds] == [
        ("moe-window", (0, 2)),
        ("moe", (1, 3)),
    ]
    assert [share for share, _ in oss.block_mix] == [0.5, 0.5]
    assert catalog.get("mixtral-8x7b").block_kinds[0].spec is catalog.get("mixtral-8x7b")


# ----------------------------------------------------------------------------- properties

moe_specs = st.builds(
    lambda experts, k, f, shared, dense, layers, gated: TransformerSpec(
        name="p",
        layers=layers,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=96,
        vocab=100,
        gated_mlp=gated,
        moe=MoESpec(
            experts=experts,
            top_k=min(k, experts),
            expert_ffn=f,
            shared_experts=shared,
            first_dense_layers=min(dense, layers - 1),
        ),
    ),
    st.integers(1, 64),
    st.integers(1, 8),
    st.integers(1, 512),
    st.integers(0, 2),
    st.integers(0, 3),
    st.integers(1, 8),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(moe_specs)
def test_active_is_at_most_total_and_equal_when_every_expert_is_used(spec):
    assert (
        P.active_params(spec, input_embedding=False)
        <= P.active_params(spec)
        <= P.total_params(spec)
    )
    everyone = spec.with_(moe=MoESpec(**(asdict(spec.moe) | {"top_k": spec.moe.experts})))
    assert P.active_params(everyone) == P.total_params(everyone)


@settings(max_examples=60, deadline=None)
@given(moe_specs, st.integers(1, 4))
def test_more_experts_grow_the_total_not_the_active_count(spec, more):
    bigger = spec.with_(moe=MoESpec(**(asdict(spec.moe) | {"experts": spec.moe.experts + more})))
    per_expert = P.ffn_params(spec, spec.moe.expert_ffn) + spec.hidden
    moe_layers = spec.layers - spec.moe.first_dense_layers
    assert P.total_params(bigger) - P.total_params(spec) == moe_layers * more * per_expert
    assert (
        P.active_params(bigger) - P.active_params(spec) == moe_layers * more * spec.hidden
    )  # the router only


@settings(max_examples=40, deadline=None)
@given(moe_specs, st.integers(1, 4), st.integers(1, 8))
def test_rank_params_add_up_to_the_model_over_any_split(spec, pp, first):
    """Pipeline ranks holding the blocks in order: the first rank's leading blocks are the dense ones
    (rank_params' premise: the first rank holds at least the dense blocks)."""
    blocks = spec.layers
    pp = min(pp, blocks)
    first = max(min(first, blocks - pp + 1), spec.moe.first_dense_layers)
    pp = min(pp, blocks - first + 1)
    rest = blocks - first
    counts = (
        [first] + [rest // (pp - 1) + (1 if i < rest % (pp - 1) else 0) for i in range(pp - 1)]
        if pp > 1
        else [blocks]
    )
    total = sum(float(P.rank_params(spec, 1, n, i == 0, i == pp - 1)) for i, n in enumerate(counts))
    assert total == pytest.approx(
        P.total_params(spec)
        + P.mtp_params(spec)
        + (spec.vocab * spec.hidden if spec.tied_embeddings and pp > 1 else 0)
    )


def test_rank_params_put_the_dense_blocks_and_mtp_where_they_run():
    ds = catalog.get("deepseek-v3")
    moe_block, dense_block = P.block_params(ds), P.block_params(ds.with_(moe=None))
    middle = P.rank_params(ds, 1, 4, False, False)
    first = P.rank_params(ds, 1, 4, True, False)
    last = P.rank_params(ds, 1, 4, False, True)
    assert middle == 4 * moe_block
    assert first == 3 * dense_block + moe_block + P.embedding_params(ds)
    assert last == 4 * moe_block + P.head_params(ds) + P.final_norm_params(ds) + P.mtp_params(ds)
    assert float(P.rank_params(ds, 1, 61, True, True)) == P.total_params(ds) + P.mtp_params(ds)


def test_small_fixtures_count_what_they_are():
    """The small instances of the torch tests: hand-count one MoE block of each."""
    h, f, e = 64, 96, 4
    attention = 2 * h * 64 + 2 * h * 32  # wq, wo 64 x 64; wk, wv 64 x 32 (2 KV heads of 16)
    assert P.block_params(SMALL_MIXTRAL) == attention + e * 3 * h * f + e * h + 2 * h
    m = SMALL_DEEPSEEK.mla
    mla = h * 32 + 32 + 32 * 4 * 16 + h * (16 + 8) + 16 + 16 * 4 * (8 + 16) + 4 * 16 * h
    moe = 8 * 3 * h * 24 + 3 * h * 24 + 8 * h
    assert m.qk_head_dim == 16 and P.attention_params(SMALL_DEEPSEEK) == mla
    assert P.block_params(SMALL_DEEPSEEK) == mla + moe + 2 * h


def test_moe_plans_export_or_are_refused_in_one_line(tmp_path):
    """An estimate's plan carries the MoE shape (model.arch.moe): Megatron-LM gets Mixtral's expert
    arguments, and DeepSeek-V3's MLA, MTP and router arguments."""
    args = ["--hardware", "dgx-h100", "--zero", "1", "--json"]
    for name, degrees, gpus in (
        ("mixtral-8x7b", ["--dp", "8", "--tp", "2", "--pp", "4"], "64"),
        ("deepseek-v3", ["--dp", "8", "--tp", "8", "--pp", "16"], "1024"),
    ):
        plan = tmp_path / f"{name}.json"
        result = runner.invoke(
            app, ["estimate", name, "--gpus", gpus, "--global-batch", "256", *degrees, *args]
        )
        assert result.exit_code == 0, result.output
        plan.write_text(result.stdout)
        assert (
            json.loads(result.stdout)["model"]["arch"]["moe"]["experts"]
            == catalog.get(name).moe.experts
        )
        exported = runner.invoke(app, ["export", str(plan), "--format", "megatron"])
        if name == "mixtral-8x7b":
            assert exported.exit_code == 0, exported.output
            assert "--num-experts 8" in exported.stdout and "--moe-router-topk 2" in exported.stdout
        else:  # DeepSeek-V3's MLA, MTP and sigmoid group-limited router have Megatron-LM arguments (docs/exports.md)
            assert exported.exit_code == 0, exported.output
            for flag in (
                "--multi-latent-attention",
                "--kv-lora-rank 512",
                "--mtp-num-layers 1",
                "--moe-router-score-function sigmoid",
                "--moe-router-enable-expert-bias",
            ):
                assert flag in exported.stdout
