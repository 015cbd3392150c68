"""One object owns the parallel degrees and their knobs, validated once (torchtitan's ParallelDims).

Every later step (cost, search, plan file, executor) takes a `ParallelConfig`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from planner.errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "activations", "optimizer+activations")
"""What lives in host memory: the optimizer (fp32 master + states, the step on the CPU: ZeRO-Offload), the
saved activations, or both (DeepSpeed's offload_optimizer with activation_checkpointing.cpu_checkpointing, the
configuration of its 1T/2T runs on Azure, 2022)."""


def offload_kinds(offload: str) -> tuple[str, ...]:
    """The kinds of state an OFFLOAD value moves to the host ('optimizer', 'activations')."""
    return () if offload == "none" else tuple(offload.split("+"))


def offloads(offload: str, kind: str) -> bool:
    """Whether the OFFLOAD value `offload` moves `kind` ('optimizer' or 'activations') to the host."""
    return kind in offload_kinds(offload)


def offload_indices(kind: str) -> tuple[int, ...]:
    """Indices into OFFLOAD of the values that move `kind` to the host (the candidate arrays' encoding)."""
    return tuple(i for i, o in enumerate(OFFLOAD) if offloads(o, kind))


PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "bf16", "fp8")
"""fp8: FP8 GEMMs (Transformer Engine / torchao float8 recipes) with bf16 everywhere else and fp32
master weights and optimizer states."""
FRAMEWORK_FILES = Path(__file__).resolve().parents[1] / "frameworks"
FRAMEWORKS = tuple(sorted(path.stem for path in FRAMEWORK_FILES.glob("*.json")))
"""Software stacks a plan can target: one data file each in frameworks/, named after the stack (a
new file is a new stack; frameworks.loader checks that its name is its file's)."""
CP_COMMS = ("p2p", "all_gather", "a2a")
"""How context parallelism exchanges keys and values: p2p (ring attention, KV blocks passed around
the group), all_gather (every rank gathers the whole sequence's KV), a2a (Ulysses all-to-all over heads)."""
PLACEMENT_LETTERS = ("D", "P", "T", "C", "E")
"""Mesh axes of a placement string: data, pipeline, tensor, context, expert parallel."""

LOOPED_SCHEDULES = ("interleaved-1f1b", "zero-bubble")
"""Schedules torch.distributed.pipelining runs in rounds of pp micro-batches."""


def looped_rounds(m, pp):
    """Rounds a looped schedule splits m micro-batches into: max(1, m // pp); m must be a multiple
    (ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble raise otherwise; Megatron's stricter
    m % pp == 0 is a special case). Works on ints and numpy arrays."""
    return np.maximum(1, m // pp)


def looped_rounds_ok(m, pp):
    """m micro-batches run as whole rounds of a looped schedule with pp stages (ints or arrays)."""
    return m % looped_rounds(m, pp) == 0


OPTIMIZERS = ("adamw", "sgd")


class MeshAxis(str, Enum):
    """Mesh axis names, the vocabulary of placement strings and DeviceMesh dims."""

    DP = "dp"
    PP = "pp"
    TP = "tp"
    CP = "cp"
    EP = "ep"


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    """How one training step is split over `world_size` devices."""

    dp: int = 1
    """Data-parallel degree (replicas, or ZeRO shards)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row split inside each block)."""
    pp: int = 1
    """Pipeline-parallel degree (stages)."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    global_batch: int = 1
    """Sequences per optimizer step over all replicas."""
    schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b, interleaved-1f1b, zero-bubble."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved-1f1b); 1 means not interleaved."""
    zero: int = 0
    """ZeRO stage: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters sharded over dp."""
    recompute: str = "none"
    """Activation recomputation: none, selective (attention core), full (whole block)."""
    recompute_layers: int | None = None
    """With recompute full: blocks fully recomputed in each pipeline chunk (its first ones; the others keep every
    activation: Megatron-Core's --recompute-method block --recompute-num-layers); None recomputes every block."""
    offload: str = "none"
    """What lives in host memory: none, optimizer (states + step on CPU), activations, or both (OFFLOAD)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism of norms/dropout over the tp group (needs tp > 1 to matter)."""
    placement: str = "DPT"
    """Order of the mesh axes from outermost to innermost, letters D, P, T and, when used, C (context)
    and E (expert); the right-most letter gets adjacent ranks. C may be left out when cp = 1, E when ep = 1."""
    precision: str = "amp-bf16"
    """fp32, amp-bf16 (fp32 master + bf16 autocast), amp-fp16, bf16 (pure bf16)."""
    optimizer: str = "adamw"
    """adamw or sgd (momentum)."""
    seq: int = 2048
    """Sequence length in tokens."""
    stages: tuple[int, ...] = ()
    """Blocks per pipeline stage (pp * virtual_stages entries); empty means as even as possible."""
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks (world = dp x tp x pp x cp)."""
    cp_comm: str = "p2p"
    """How the cp ranks exchange keys/values: p2p (ring), all_gather or a2a (CP_COMMS)."""
    ep: int = 1
    """Expert-parallel degree (mixture-of-experts): experts sharded over ep ranks carved from dp x cp
    (Megatron-Core's expert-model-parallel group); 1 for dense models."""
    expert_tp: int = 1
    """Tensor-parallel degree inside each expert (Megatron-Core's expert tensor parallelism); 1 = none."""
    dp_shard: int = 0
    """ZeRO/FSDP shard group: states sharded over dp_shard ranks and replicated over dp / dp_shard
    groups (hybrid sharding, HSDP / MiCS / hpZ); 0 means all dp ranks (plain ZeRO/FSDP)."""
    framework: str = "megatron"
    """Software stack the plan runs on (FRAMEWORKS); sets stack-dependent costs and allowed knobs."""

    def __post_init__(self) -> None:
        """Every field checked at construction: one ConfigError naming the first bad one."""
        self._check_degrees()
        self._check_expert_parallel()
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError("zero", self.zero, "one of 0, 1, 2, 3")
        self._check_recompute_layers()
        check_placement(self.placement, cp=self.cp, ep=self.ep)
        self._check_schedule()

    def _check_degrees(self) -> None:
        """Degrees, batch and sequence positive integers; the choices among their values; dp_shard
        0 or a divisor of dp."""
        for name in ("dp", "tp", "pp", "micro_batch", "global_batch", "virtual_stages", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, value, "a positive integer")
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("recompute", self.recompute, RECOMPUTE)
        _choice("offload", self.offload, OFFLOAD)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("framework", self.framework, FRAMEWORKS)
        _choice("cp_comm", self.cp_comm, CP_COMMS)
        for name in ("cp", "ep", "expert_tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, value, "a positive integer")
        if (
            not isinstance(self.dp_shard, int)
            or isinstance(self.dp_shard, bool)
            or self.dp_shard < 0
            or (self.dp_shard and self.dp % self.dp_shard)
        ):
            raise ConfigError(
                "dp_shard", self.dp_shard, f"0 (all dp ranks) or a divisor of dp({self.dp})"
            )

    def _check_expert_parallel(self) -> None:
        """ep*expert_tp dividing tp*cp*dp (Megatron-Core MoE parallel folding)."""
        if not expert_parallel_ok(
            dp=self.dp, tp=self.tp, cp=self.cp, ep=self.ep, expert_tp=self.expert_tp
        ):
            n = self.tp * self.cp * self.dp
            raise ConfigError(
                "ep",
                self.ep,
                f"ep*expert_tp ({self.ep}*{self.expert_tp}) dividing tp*cp*dp = "
                f"{self.tp}*{self.cp}*{self.dp} = {n}",
                message=(
                    f"ep={self.ep} with expert_tp={self.expert_tp}: ep*expert_tp = {self.ep * self.expert_tp} must divide "
                    f"tp*cp*dp = {n} (the expert layers regroup a pipeline stage's ranks as expert_tp x ep x expert_dp, "
                    f"Megatron-Core MoE parallel folding); allowed ep here: "
                    + ", ".join(
                        map(
                            str,
                            expert_parallel_degrees(
                                dp=self.dp, tp=self.tp, cp=self.cp, expert_tp=self.expert_tp
                            ),
                        )
                    )
                ),
            )

    def _check_recompute_layers(self) -> None:
        """recompute_layers: none, or a positive block count with recompute=full."""
        if self.recompute_layers is None:
            return
        value = self.recompute_layers
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                "recompute_layers",
                value,
                "a positive integer (blocks per pipeline chunk) or none",
            )
        if self.recompute != "full":
            raise ConfigError(
                "recompute_layers",
                value,
                "none unless recompute is full",
                message=(
                    f"recompute_layers={value} with recompute={self.recompute}: it counts the blocks that full "
                    "recomputation re-runs in each pipeline chunk; set recompute=full or leave it out"
                ),
            )

    def _check_schedule(self) -> None:
        """Virtual stages only for interleaved-1f1b, global batch a multiple of dp*micro_batch,
        looped schedules' rounds, one stages entry per stage."""
        if self.virtual_stages > 1 and self.schedule != "interleaved-1f1b":
            raise ConfigError(
                "virtual_stages",
                self.virtual_stages,
                f"1 with schedule {self.schedule!r}; virtual stages need interleaved-1f1b",
            )
        per_step = self.dp * self.micro_batch
        if self.global_batch % per_step:
            raise ConfigError(
                "global_batch",
                self.global_batch,
                f"a multiple of dp({self.dp})*micro_batch({self.micro_batch})={per_step}",
            )
        if self.schedule in LOOPED_SCHEDULES and not looped_rounds_ok(
            self.num_microbatches, self.pp
        ):
            m = self.num_microbatches
            rounds = int(looped_rounds(m, self.pp))
            ok = [k for k in range(1, 4 * m + 1) if looped_rounds_ok(k, self.pp)]
            near = sorted(ok, key=lambda k: (abs(k - m), k))[:2]
            raise ConfigError(
                "num_microbatches",
                m,
                f"a multiple of {rounds}",
                message=(
                    f"num_microbatches=global_batch/(dp*micro_batch)={m} with schedule {self.schedule} and "
                    f"pp={self.pp}: must be a multiple of max(1, m // pp)={rounds} (torch.distributed.pipelining "
                    f"runs rounds of pp micro-batches); nearest allowed m: {', '.join(map(str, sorted(near)))} "
                    f"(global_batch {', '.join(str(k * per_step) for k in sorted(near))})"
                ),
            )
        if self.stages and len(self.stages) != self.pp * self.virtual_stages:
            raise ConfigError(
                "stages",
                list(self.stages),
                f"{self.pp * self.virtual_stages} entries (pp*virtual_stages), one per stage",
            )

    def offloads(self, kind: str) -> bool:
        """Whether the plan keeps `kind` ('optimizer' or 'activations') in host memory."""
        return offloads(self.offload, kind)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same expert shard (Megatron-Core's expert data-parallel group):
        tp cp dp / (ep expert_tp)."""
        return expert_data_parallel(
            dp=self.dp, tp=self.tp, cp=self.cp, ep=self.ep, expert_tp=self.expert_tp
        )

    @property
    def shard_group(self) -> int:
        """Ranks a ZeRO stage >= 1 shards its states over (dp_shard, or dp when 0)."""
        return self.dp_shard or self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per pipeline (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    def check_world_size(self, world_size: int) -> None:
        if self.world_size != world_size:
            fix, other = "", self.tp * self.pp * self.cp
            if world_size % other == 0:
                fix = f"; set dp={world_size // other}"
            cp = f"*cp({self.cp})" if self.cp > 1 else ""
            raise ConfigError(
                "dp*tp*pp*cp",
                self.world_size,
                f"world_size({world_size})",
                message=(
                    f"tp({self.tp})*pp({self.pp})*dp({self.dp}){cp}={self.world_size} != world_size({world_size}){fix}"
                ),
            )

    def check_model(self, *, heads: int, kv_heads: int, blocks: int) -> None:
        """Degrees the model shape allows: tp divides the heads, pp*v stages no more than blocks (plus an
        empty first or last chunk of an explicit layout)."""
        if heads % self.tp or kv_heads % self.tp:
            # whole heads and whole K/V groups per rank (Megatron-LM asserts both); K/V replication is not costed
            divisors = [d for d in range(1, heads + 1) if heads % d == 0 and kv_heads % d == 0]
            what = (
                f"heads({heads})"
                if kv_heads == heads
                else f"heads({heads}) and kv_heads({kv_heads})"
            )
            raise ConfigError(
                "tp", self.tp, f"a divisor of {what}: {', '.join(map(str, divisors))}"
            )
        chunks = self.pp * self.virtual_stages
        # an explicit layout may give the first and the last chunk no block (the embedding or the loss
        # alone: Megatron's --account-for-embedding/loss-in-pipeline-split, pipeline_model_parallel_layout)
        empty_ends = (
            sum(1 for i in (0, -1) if self.stages and self.stages[i] == 0) if chunks > 1 else 0
        )
        if chunks > blocks + empty_ends:
            raise ConfigError(
                "pp",
                self.pp,
                f"pp*virtual_stages <= layers({blocks}); got {self.pp}*{self.virtual_stages}={chunks}",
            )
        self.check_recompute_layers(blocks)
        if self.stages and sum(self.stages) != blocks:
            raise ConfigError(
                "stages", list(self.stages), f"blocks per stage summing to layers({blocks})"
            )

    def check_against(self, model, seq: int | None = None) -> None:
        """Every degree rule of a model shape (`model`, a planner.spec.TransformerSpec; `seq`,
        default the model's): check_model, check_experts and check_sequence. The one call of
        estimate and of the plan reader (planner.plan.check_against_model)."""
        self.check_model(heads=model.heads, kv_heads=model.n_kv_heads, blocks=model.total_blocks)
        self.check_experts(model.moe)
        self.check_sequence(
            model.seq if seq is None else seq, heads=model.heads, kv_heads=model.n_kv_heads
        )

    def largest_chunk(self, blocks: int) -> int:
        """Blocks of the largest pipeline chunk: the explicit stages' largest, else ceil(blocks / (pp v))."""
        return max(self.stages) if self.stages else -(-blocks // (self.pp * self.virtual_stages))

    def check_recompute_layers(self, blocks: int, field: str = "recompute_layers") -> None:
        """recompute_layers counts blocks of one chunk: at most the largest chunk's (largest_chunk)."""
        if self.recompute_layers is not None and self.recompute_layers > (
            most := self.largest_chunk(blocks)
        ):
            raise ConfigError(
                field,
                self.recompute_layers,
                f"at most {most}, the blocks of the largest pipeline chunk (layers({blocks}) over "
                f"pp*virtual_stages={self.pp * self.virtual_stages})",
            )

    def check_experts(self, moe) -> None:
        """Expert degrees the model allows: ep > 1 or expert_tp > 1 needs a mixture-of-experts model
        (`moe`, a planner.spec.MoESpec, or None); ep divides the routed experts (whole experts per rank,
        Megatron-Core asserts num_experts % ep == 0) and expert_tp the expert width."""
        if moe is None:
            for name in ("ep", "expert_tp"):
                if getattr(self, name) > 1:
                    raise ConfigError(
                        name,
                        getattr(self, name),
                        "1 for a dense model (expert parallelism needs a mixture-of-experts model)",
                    )
            return
        if moe.experts % self.ep:
            divisors = [d for d in range(1, moe.experts + 1) if moe.experts % d == 0]
            raise ConfigError(
                "ep",
                self.ep,
                f"a divisor of experts({moe.experts}): {', '.join(map(str, divisors))}",
            )
        if moe.expert_ffn % self.expert_tp:
            raise ConfigError(
                "expert_tp", self.expert_tp, f"a divisor of expert_ffn({moe.expert_ffn})"
            )

    def check_sequence(self, seq: int, *, heads: int, kv_heads: int) -> None:
        """Context parallelism's rules: the load-balanced causal split cuts each sequence into 2 cp
        chunks (Megatron-Core / Transformer Engine require seq % (2 cp) == 0); Ulysses (a2a) also
        splits the heads of each tp rank over cp."""
        if self.cp == 1:
            return
        if seq % (2 * self.cp):
            raise ConfigError(
                "cp",
                self.cp,
                f"a degree with seq({seq}) divisible by 2*cp (the load-balanced causal "
                f"split into 2*cp chunks)",
            )
        if self.cp_comm == "a2a" and (
            heads % (self.tp * self.cp) or kv_heads % (self.tp * self.cp)
        ):
            raise ConfigError(
                "cp",
                self.cp,
                f"a divisor of heads({heads}) and kv_heads({kv_heads}) / tp({self.tp}) "
                "with cp_comm a2a (Ulysses splits the heads over cp)",
            )

    def to_dict(self) -> dict:
        d = asdict(self)
        if (
            self.recompute_layers is None
        ):  # the plan files of every other recomputation stay as they were
            del d["recompute_layers"]
        d["stages"] = list(self.stages)
        d["num_microbatches"] = self.num_microbatches
        return d


def expert_parallel_ok(*, dp, tp, cp=1, ep=1, expert_tp=1):
    """The expert-parallel rule (ints or numpy arrays): ep x expert_tp divides tp x cp x dp.

    Megatron-Core's MoE parallel folding (Liu et al. 2025, "MoE Parallel Folding", arXiv 2504.14960,
    Sec. 3; megatron/core/parallel_state.py builds a second rank generator for the expert layers) gives
    the expert layers of a pipeline stage the same tp x cp x dp ranks as attention, regrouped as
    expert_tp x ep x expert_dp: ep may exceed dp x cp when expert_tp < tp (e.g. tp 2, dp 16, ep 32,
    expert_tp 1). With expert_tp = tp and cp = 1 this is the older rule "ep divides dp". The one owner
    of the rule: ParallelConfig validates with it and the search filters its ep dimension with it."""
    dp, tp, cp, ep, expert_tp = (np.asarray(v) for v in (dp, tp, cp, ep, expert_tp))
    ok = (ep >= 1) & (expert_tp >= 1) & ((tp * cp * dp) % np.maximum(ep * expert_tp, 1) == 0)
    return bool(ok) if ok.ndim == 0 else ok


def expert_data_parallel(*, dp, tp, cp=1, ep=1, expert_tp=1):
    """Expert data-parallel degree: tp cp dp / (ep expert_tp) ranks hold the same expert shard and reduce
    its gradients together (Megatron-Core's expert data-parallel group; expert_parallel_ok must hold)."""
    n = np.asarray(tp) * np.asarray(cp) * np.asarray(dp) // (np.asarray(ep) * np.asarray(expert_tp))
    return int(n) if np.ndim(n) == 0 else n


def ep_allowed(ep, *, dp, cp=1, tp=1, expert_tp=1, experts=None):
    """The one expert-parallel rule with the model (ParallelConfig validates its degrees with
    expert_parallel_ok; the search enumerates through here): expert_parallel_ok, and for a mixture-of-experts
    model whole experts per rank (Megatron-Core asserts num_moe_experts % expert_model_parallel_size == 0).
    Ints or numpy arrays."""
    ok = np.asarray(expert_parallel_ok(dp=dp, tp=tp, cp=cp, ep=ep, expert_tp=expert_tp))
    if experts is not None:
        ok = ok & (np.asarray(experts) % np.asarray(ep) == 0)
    return bool(ok) if np.ndim(ok) == 0 else ok


def expert_parallel_degrees(
    *, dp: int, tp: int = 1, cp: int = 1, expert_tp: int = 1, experts: int | None = 0
) -> list[int]:
    """Every ep ep_allowed admits for these degrees (ascending): for a model with `experts` routed experts
    the divisors of the experts it allows; [1] for a dense model (experts None); experts 0: every degree
    the parallel-folding rule allows, whatever the model."""
    if experts is None:
        return [1]
    n = tp * cp * dp
    degrees = np.arange(1, (experts or n) + 1)
    ok = ep_allowed(degrees, dp=dp, cp=cp, tp=tp, expert_tp=expert_tp, experts=experts or None)
    return [int(e) for e in degrees[ok]]


def default_placement(cp: int = 1, ep: int = 1) -> str:
    """DPT, with C just before T when cp > 1; with ep > 1 Megatron-Core's default rank order
    tp-cp-ep-dp-pp, PDECT: the pipeline outermost, so that a stage's ranks are adjacent and an expert
    group of up to a node's ranks stays on NVLink (planner.placement.stage_group_locality)."""
    if ep > 1:
        return "PDE" + ("C" if cp > 1 else "") + "T"
    return "DP" + ("C" if cp > 1 else "") + "T"


def check_placement(placement: str, *, cp: int = 1, ep: int = 1) -> None:
    """A placement is D, P and T in some order plus C (needed when cp > 1) and E (needed when ep > 1),
    each letter once: the order of the mesh axes from outermost to innermost."""
    letters = list(placement) if isinstance(placement, str) else []
    needed = {"D", "P", "T"} | ({"C"} if cp > 1 else set()) | ({"E"} if ep > 1 else set())
    ok = (
        len(letters) == len(set(letters))
        and set(letters) <= set(PLACEMENT_LETTERS)
        and needed <= set(letters)
    )
    if ok and "C" in letters:
        # context parallelism sits just outside tensor parallelism (Megatron's tp-cp-... rank order,
        # torchtitan's ..., cp, tp mesh): the cost model lays ranks out that way (planner.placement)
        ok = letters.index("C") == letters.index("T") - 1
    if not ok:
        extra = (", plus C" if cp > 1 else "") + (", plus E" if ep > 1 else "")
        raise ConfigError(
            "placement",
            placement,
            f"each of the letters D, P, T once{extra} (optional C, E "
            "when cp, ep = 1; C right before T), outermost first, e.g. DPT or DPCT",
        )


def _choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(field, value, "one of " + ", ".join(allowed))
