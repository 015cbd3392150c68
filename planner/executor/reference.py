"""The single-process reference run and the pieces every run shares: data, loss, optimizer.

A parallel run is correct when it equals this run (verify.py): same init (Transformer.init_weights
with the run's seed), the same synthetic global batch per step, the mean next-token loss over the
whole global batch, and the same optimizer. Micro-batching and data parallelism only change the
order of floating-point sums.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from planner.executor.runspec import RunSpec
from planner.models.transformer import build_model, lm_loss


def synthetic_tokens(spec: RunSpec, step: int) -> torch.Tensor:
    """Global batch of step `step`: (global_batch, seq + 1) token ids from a generator seeded by
    (seed, step), so any rank, the reference and a resumed run draw identical data."""
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
    cfg = spec.config
    return torch.randint(0, spec.model.vocab, (cfg.global_batch, cfg.seq + 1), generator=gen)


def dp_shard(tokens: torch.Tensor, dp: int, dp_rank: int) -> torch.Tensor:
    """Rows of the global batch one data-parallel replica trains on (contiguous blocks)."""
    rows = tokens.shape[0] // dp
    return tokens[dp_rank * rows:(dp_rank + 1) * rows]


def make_optimizer(params, spec: RunSpec) -> torch.optim.Optimizer:
    """AdamW (lr, weight decay 0.01) or SGD (10 x lr, momentum 0.9), per the plan's optimizer."""
    params = list(params)
    if spec.config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=10 * spec.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.01)


EPS_SENSITIVE_FACTOR = 100.0
"""|grad| < 100 eps (1e-6 with AdamW's default eps 1e-8) marks an element whose update the rounding
of the gradient can move: at |g| = 100 eps a gradient error d changes the update by about
lr d / (1e4 eps), below 1e-5 lr for the d ~ 1e-9 of fp32 sums in different order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReferenceResult:
    losses: tuple[float, ...]
    """Mean next-token loss of each step, before that step's update."""
    params: dict
    """Parameter name -> fp32 tensor after the last step."""
    step_times_s: tuple[float, ...]
    """Wall time of each step in this process."""
    zero_grad_params: tuple[str, ...] = ()
    """Parameters whose gradient was zero up to rounding at every step (relative to the whole
    gradient, < 1e-7): e.g. a key-projection bias, which softmax's shift invariance cancels
    exactly. Optimizers that normalize the update (AdamW) turn their rounding noise into moves of
    up to lr per step, so verify.py bounds them absolutely."""
    eps_sensitive: dict = field(default_factory=dict)
    """AdamW only: parameter name -> bool mask of the elements whose gradient came within
    EPS_SENSITIVE_FACTOR x eps of zero at some step. Adam's update g / (|g| + eps) has slope
    eps / (|g| + eps)^2 there, so the rounding of a differently ordered sum (micro-batches, shards,
    all-reduces) moves such an element by up to lr per step; verify.py bounds them absolutely."""


def run_reference(spec: RunSpec) -> ReferenceResult:
    """Train `spec.steps` steps in one process on the whole global batch at once."""
    import time

    torch.manual_seed(spec.seed)
    model = build_model(spec.model, seed=spec.seed)
    optimizer = make_optimizer(model.parameters(), spec)
    losses, times = [], []
    zero_grad = {name for name, _ in model.named_parameters()}
    adam_eps = optimizer.defaults.get("eps") if spec.config.optimizer != "sgd" else None
    sensitive: dict[str, torch.Tensor] = {}
    for step in range(spec.steps):
        t0 = time.perf_counter()
        tokens = synthetic_tokens(spec, step)
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        total = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None))
        zero_grad -= {name for name, p in model.named_parameters()
                      if p.grad is not None and p.grad.norm() > 1e-7 * total}
        if adam_eps:
            for name, p in model.named_parameters():
                if p.grad is not None:
                    near = p.grad.abs() < EPS_SENSITIVE_FACTOR * adam_eps
                    sensitive[name] = sensitive[name] | near if name in sensitive else near
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return ReferenceResult(losses=tuple(losses), params=params, step_times_s=tuple(times),
                           zero_grad_params=tuple(sorted(zero_grad)),
                           eps_sensitive={n: m for n, m in sensitive.items() if m.any() and n not in zero_grad})
