"""The per-block terms evaluated once per distinct row (planner.score.block_terms, cost_models.step.Step.block_rows):
the same numbers as once per candidate, and read from no column the key leaves out.

Every call the searches below make is checked twice: block_terms with and without the distinct rows (every field of
every term equal), and a recording Step that lists what the terms read (no step-level field: dp, pp, m, ZeRO's shard
group, offload, the data-parallel and pipeline links). The searches cover the paths that read different fields:
Megatron dense (GPT-3), the FSDP eager stack whose 16-bit table differs per candidate under ZeRO >= 2 (Llama 3 8B, with
the recompute_layers refinement), torchtitan's per-operator selective recomputation with context parallelism, and
MoE with expert parallelism and MLA (Mixtral, DeepSeek-V3)."""

from dataclasses import fields, is_dataclass

import numpy as np
import pytest

import planner.score as S
from cost_models.step import Step
from planner.search import recommend

SEARCHES = [
    dict(model="gpt3-175b", hardware="p4d.24xlarge", gpus=128, global_batch=256),
    dict(model="llama3-8b", hardware="p4d.24xlarge", gpus=8, framework="fsdp"),
    dict(
        model="llama3-70b",
        hardware="p5.48xlarge",
        gpus=64,
        framework="torchtitan",
        seq=32768,
        global_batch=64,
    ),
    dict(model="mixtral-8x7b", hardware="p5.48xlarge", gpus=64),
    dict(model="deepseek-v3", hardware="p6e-gb200.36xlarge", gpus=288),
]

STEP_LEVEL = {
    "dp",
    "pp",
    "m",
    "zero",
    "offload",
    "shard",
    "v",
    "blocks_second",
    "rank_recomputed",
    "grad_group",
    "shard_group",
    "expert_dp",
    "expert_shard_group",
    "is_offload",
    "single_stage",
}
"""Step fields (and properties over them) that only the step-level terms may read: block_rows does not key them."""


def _leaves(value, prefix=""):
    """(name, array) of every array and number inside a term's result (records, tuples, arrays)."""
    if is_dataclass(value):
        for f in fields(value):
            yield from _leaves(getattr(value, f.name), f"{prefix}.{f.name}")
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{prefix}[{i}]")
    elif isinstance(value, (np.ndarray, float, int)):
        yield prefix, np.asarray(value, dtype=float)


class _Recording(Step):
    """A Step that records the names of the fields and properties read from it (and of the locality links). What
    full_share reads inside (blocks, recompute_layers, v) is not recorded: block_rows keys full_share's value."""

    __slots__ = ()
    read: set = set()
    paused = False

    def __getattribute__(self, name):
        if name.startswith("__") or _Recording.paused:
            return object.__getattribute__(self, name)
        _Recording.read.add(name)
        if name not in ("full_share", "a2a_overlap"):  # both keyed themselves (distinct_block_rows)
            return object.__getattribute__(self, name)
        _Recording.paused = True
        try:
            return object.__getattribute__(self, name)
        finally:
            _Recording.paused = False


class _Links(dict):
    def __getitem__(self, key):
        _Recording.read.add("local." + key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        _Recording.read.add("local." + key)
        return dict.get(self, key, default)


@pytest.mark.parametrize(
    "search", SEARCHES, ids=[s["model"] + "-" + s.get("framework", "megatron") for s in SEARCHES]
)
def test_block_terms_once_per_distinct_row_equal_once_per_candidate(search, monkeypatch):
    original, label = S.block_terms, search["model"]
    checked = {"deduped": 0, "calls": 0}

    def both(x, rows="auto"):
        distinct = x.distinct_block_rows()
        mine, plain = original(x, rows=distinct), original(x, rows=None)
        n = np.size(x.dp)
        for (name, a), (_, b) in zip(_leaves(mine), _leaves(plain), strict=True):
            np.testing.assert_allclose(
                np.broadcast_to(a, (n,)),
                np.broadcast_to(b, (n,)),
                rtol=1e-12,
                atol=0,
                err_msg=f"{label}: block term {name}",
            )
        checked["calls"] += 1
        checked["deduped"] += len(distinct[0]) < np.size(x.dp)
        # what the terms read: nothing the key leaves out
        _Recording.read = set()
        spy = _Recording(**{f.name: getattr(x, f.name) for f in fields(Step)})
        object.__setattr__(spy, "local", _Links(x.local))
        original(spy, rows=None)
        links = {k.split(".", 1)[1] for k in _Recording.read if k.startswith("local.")}
        assert not (_Recording.read & STEP_LEVEL), (label, sorted(_Recording.read & STEP_LEVEL))
        assert links <= set(Step.BLOCK_LOCALITY), (label, sorted(links))
        return mine

    monkeypatch.setattr(S, "block_terms", both)
    kw = {k: v for k, v in search.items() if k not in ("model", "hardware")}
    rec = recommend(search["model"], search["hardware"], **kw)
    assert rec.best is not None
    assert (
        checked["deduped"] >= 1 and checked["calls"] > checked["deduped"]
    )  # shared rows and one-row estimates


def test_block_rows_keys_what_differs_per_candidate():
    """Two candidates that differ only in a keyed column (here cp_comm, tp's link or the table's ZeRO) are two rows;
    candidates that differ only in dp, ZeRO (one table for all) or offload are one."""
    from planner.catalog import get
    from planner.software import software_for
    from hardware_profiles import load_profile
    from planner.score import CandidateArrays

    n = 512
    base = dict(
        dp=np.full(n, 8),
        tp=np.full(n, 8),
        pp=np.full(n, 4),
        micro_batch=np.ones(n, int),
        virtual_stages=np.ones(n, int),
        zero=np.tile([0, 1], n // 2),
        recompute=np.zeros(n, int),
        offload=np.zeros(n, int),
        sequence_parallel=np.ones(n, bool),
        schedule=np.zeros(n, int),
        placement=np.zeros(n, int),
        cp=np.full(n, 2),
        cp_comm=np.zeros(n, int),
    )
    model, hw = get("llama3-70b"), load_profile("p5.48xlarge")

    def rows(sw, **change):
        c = CandidateArrays(**{**base, **change})
        x = Step.of(
            model, hw, sw, c, global_batch=256, seq=8192, precision="amp-bf16", optimizer="adamw"
        )
        r = x.block_rows()
        return None if r is None else len(r[0])

    megatron = software_for("megatron")
    assert rows(megatron, dp=np.tile([8, 16], n // 2)) == 1  # dp and ZeRO: step-level only
    assert rows(megatron, cp_comm=np.tile([0, 1], n // 2)) == 2
    assert rows(megatron, placement=np.tile([0, 3], n // 2)) in (
        1,
        2,
    )  # 2 where the order moves tp's link
    fsdp = software_for("fsdp")
    if Step.of(
        model,
        hw,
        fsdp,
        CandidateArrays(**{**base, "zero": np.tile([1, 3], n // 2)}),
        global_batch=256,
        seq=8192,
        precision="amp-bf16",
        optimizer="adamw",
    ).table.saved.rep.ndim:
        assert rows(fsdp, zero=np.tile([1, 3], n // 2)) == 2  # the 16-bit table under ZeRO 3
    assert (
        rows(megatron, micro_batch=np.arange(n) % 300 + 1) is None
    )  # mostly distinct: not worth a key
