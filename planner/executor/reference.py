"""The single-process reference and the pieces every run shares: data, loss, optimizer, rounding model.

A parallel run is correct when every step of it is a step of one process: from the same parameters,
on the same global batch (synthetic tokens seeded by (seed, step)), the mean next-token loss over the
whole global batch gives the same gradient, and the same optimizer turns that gradient into the same
update. `AnchoredReference` checks exactly that, one step at a time: at step k it computes the
single-process gradient at the parallel run's own parameters, then advances with the run's gradient
(verify.py compares). Anchoring each step at the run's parameters keeps the comparison a pure
rounding question: two independent fp32 trajectories drift apart by much more than rounding once
AdamW's normalized update (g / (sqrt(v) + eps)) turns rounding-sized gradient differences of near-zero
elements into moves of up to lr, and later steps carry those moves into every gradient.

Micro-batching, data, tensor and pipeline parallelism only change the order of floating-point sums;
`RoundingModel` bounds what that order can change (Higham & Mary 2019, see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.executor.runspec import RunSpec
from planner.models.transformer import build_model, lm_loss
from planner.models.transformer import Attention, rope_cos_sin


def synthetic_tokens(spec: RunSpec, step: int) -> torch.Tensor:
    """Global batch of step `step`: (global_batch, seq + 1) token ids from a generator seeded by
    (seed, step), so any rank, the reference and a resumed run draw identical data."""
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
    cfg = spec.config
    return torch.randint(0, spec.model.vocab, (cfg.global_batch, cfg.seq + 1), generator=gen)


def dp_shard(tokens: torch.Tensor, dp: int, dp_rank: int) -> torch.Tensor:
    """Rows of the global batch one data-parallel replica trains on (contiguous blocks)."""
    rows = tokens.shape[0] // dp
    return tokens[dp_rank * rows : (dp_rank + 1) * rows]


def make_optimizer(params, spec: RunSpec) -> torch.optim.Optimizer:
    """AdamW (lr, weight decay 0.01) or SGD (10 x lr, momentum 0.9), per the plan's optimizer, with
    torch's default implementation: on CPU tensors the per-tensor loop, the same elementwise
    arithmetic on a whole tensor (the reference) as on a shard of it (FSDP2, tensor parallelism), so
    verify.py's replay reproduces a CPU run's update to the bit; on GPUs the multi-tensor kernels
    (their different rounding stays inside the replay's bound)."""
    params = list(params)
    if spec.config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=10 * spec.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.01)


UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
"""Unit roundoff u of round-to-nearest arithmetic: 2^-p for a p-bit significand (IEEE 754 binary32:
p = 24; bfloat16: 8; binary16: 11)."""

CONFIDENCE_LAMBDA = 10.0
"""lambda of Higham & Mary's probabilistic bound (below): it fails with probability at most
2 n exp(-lambda^2 (1-u)^2 / 2) per computed value, 2n x 2e-22 at lambda = 10, so even 1e9 checked
values of chains n ~ 1e6 long give a false alarm with probability below 1e-6."""


def run_unit_roundoff(dtype: str) -> float:
    """u of the arithmetic a run's matmuls use: fp32, or the 16-bit type of amp-*/bf16 runs."""
    if dtype in ("amp-bf16", "bf16"):
        return UNIT_ROUNDOFF["bf16"]
    if dtype == "amp-fp16":
        return UNIT_ROUNDOFF["fp16"]
    return UNIT_ROUNDOFF["fp32"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundingModel:
    """How far two evaluations of the same step in different summation orders can differ.

    Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput.
    41(5), 2019, Thm. 2.4 and sec. 3: with rounding errors modelled as independent mean-zero random
    variables, a sum or inner product of n terms computed in any order has error at most
    lambda sqrt(n) u x (sum of |terms|), except with probability 2 n exp(-lambda^2 (1-u)^2 / 2)
    (the worst case is n u instead of sqrt(n) u). A gradient element of a parameter is a sum over the
    global batch's tokens of per-token terms (for a linear layer dW_ij = sum_t dy_ti x_tj), each term
    the end of a chain of inner products through the forward and backward pass; so

        |g_run - g_ref| <= lambda (u_run + u_ref) sqrt(n_chain + tokens) x sum_t |term_t|

    element by element (both evaluations round: u_run + u_ref), n_chain being the summed lengths of
    the inner products on the forward and backward path (`chain_lengths`). The loss, a mean of
    per-token losses lse_t - z_t (log-sum-exp minus the target's logit), likewise:
        |L_run - L_ref| <= lambda (u_run + u_ref) sqrt(n_forward + tokens) x mean_t (|lse_t| + |z_t|).
    """

    u_run: float
    u_ref: float
    n_forward: int
    """Summed inner-product lengths of one forward pass (see chain_lengths)."""
    n_chain: int
    """Forward plus backward (the backward's transposed products have the same lengths)."""
    tokens: int
    """Tokens of the global batch: the length of the final sum of each gradient element."""
    lam: float = CONFIDENCE_LAMBDA

    @property
    def gradient_factor(self) -> float:
        """c in |g_run - g_ref| <= c x sum_t |term_t|."""
        return self.lam * (self.u_run + self.u_ref) * math.sqrt(self.n_chain + self.tokens)

    @property
    def loss_factor(self) -> float:
        """c in |L_run - L_ref| <= c x mean_t (|lse_t| + |z_t|)."""
        return self.lam * (self.u_run + self.u_ref) * math.sqrt(self.n_forward + self.tokens)


def chain_lengths(model_spec, seq: int) -> tuple[int, int]:
    """(n_forward, n_chain): summed lengths of the inner products (and normalization sums) a value
    passes through in one forward pass, and forward + backward (twice that).

    Per block: the q/k/v projections (hidden), the scores QK^T (d_head), the attention-weighted sum
    (seq), the output projection (heads x d_head), the MLP's first (hidden) and second (ffn)
    products, and two norms (mean and variance: 2 x hidden each); then the final norm, the output
    head (hidden) and the loss's log-sum-exp over the vocabulary.
    """
    s = model_spec
    block = s.hidden + s.d_head + seq + s.heads * s.d_head + s.hidden + s.d_ffn + 4 * s.hidden
    n_forward = s.total_blocks * block + 2 * s.hidden + s.hidden + s.vocab
    return n_forward, 2 * n_forward


def rounding_model(spec: RunSpec) -> RoundingModel:
    n_forward, n_chain = chain_lengths(spec.model, spec.config.seq)
    return RoundingModel(
        u_run=run_unit_roundoff(spec.dtype),
        u_ref=UNIT_ROUNDOFF["fp32"],
        n_forward=n_forward,
        n_chain=n_chain,
        tokens=spec.config.global_batch * spec.config.seq,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class StepGradient:
    """The single-process evaluation of one step at given parameters."""

    loss: float
    """Mean next-token loss over the global batch."""
    loss_bound: float
    """Rounding bound on |L_run - loss| (RoundingModel.loss_factor x mean(|lse| + |z|))."""
    grads: dict
    """Parameter name -> gradient."""
    grad_bounds: dict
    """Parameter name -> bound on ||g_run - g||_2: gradient_factor x (an upper bound of) ||T||_2,
    T the elementwise sum over tokens of |per-token term| (_AbsoluteTerms)."""


class _AbsoluteTerms:
    """Forward hooks that bound, for every parameter, ||T||_2 where T is the elementwise sum over the
    global batch's tokens t of the absolute per-token gradient terms (the 'sum of |terms|'):
    linear weight   dW = sum_t dy_t x_t^T: ||T|| = ||sum_t |dy_t| |x_t|^T|| <= sum_t ||dy_t|| ||x_t||
                    (triangle inequality over the rank-1 terms; with nonnegative vectors of similar
                    profile it is tight within the cosine between them, and it costs no matrix product);
    linear bias     sum_t |dy_t| (exact);
    norm weight     sum_t |dy_t xhat_t|, norm bias sum_t |dy_t| (exact);
    token embedding row v: sum over tokens t with id v of |dy_t| (exact);
    learned positions row p: sum over sequences b of |dy_bp| (exact: the gradient reaching the token
    embedding's output is the one reaching the position table before autograd sums over b).
    A tied weight adds the bounds of both uses (triangle inequality).

    For the query/key/value projections |dy_t| is replaced by the absolute-value evaluation of the
    attention backward that produced dy_t (`_attention_terms`): there dq_t = sum_s dS_ts k_s / sqrt(d)
    with sum_s dS_ts = 0 cancels, and more so as training gives the keys a common component, so
    rounding inside the attention backward is relative to |dS| |K|, not to |dq| (the forward error
    of an expression is bounded through the same expression in absolute values: Higham, Accuracy
    and Stability of Numerical Algorithms, 2nd ed. 2002, sec. 3.1 and 3.5)."""

    def __init__(self, model: nn.Module):
        self.norms: dict[int, float] = {}
        self.handles = []
        self.positions = getattr(model, "pos_embeddings", None)
        self.rope = getattr(model.spec, "position", "") == "rope"
        self.attention_abs: dict[int, torch.Tensor] = {}
        """id(q/k/v Linear) -> |gradient| bound of its output from the attention backward, (b, s, width)."""
        self.role: dict[int, tuple] = {}
        self.patched = []
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm, nn.RMSNorm)) or module is getattr(
                model, "tok_embeddings", None
            ):
                self.handles.append(module.register_forward_hook(self._forward))
            if isinstance(module, Attention):
                module._core = self._patched_core(module)
                self.patched.append(module)

    def _patched_core(self, attention):
        def core(q, k, v):
            out = Attention._core(attention, q, k, v)
            if out.requires_grad:
                qd, kd, vd = q.detach(), k.detach(), v.detach()
                out.register_hook(
                    lambda grad: self._attention_terms(attention, qd, kd, vd, grad.detach())
                )
            return out

        return core

    def _attention_terms(self, attention, q, k, v, dout) -> None:
        """Absolute-value backward of softmax(q k^T / sqrt(d)) v: |dP| = |dO| |V|^T,
        |dS| = P (|dP| + rowsum(P |dP|)), |dq| = |dS| |K| / sqrt(d), |dk| = |dS|^T |Q| / sqrt(d),
        |dv| = P^T |dO|, mapped back through rotary positions (|cos| and |sin| with the halves swapped)."""
        rep = attention.rep
        kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = (q.float() @ kk.float().transpose(-1, -2)) * scale
        if attention.causal:
            s_q, s_k = scores.shape[-2:]
            mask = torch.ones(s_q, s_k, dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        prob = torch.softmax(scores, dim=-1)
        d_out = dout.float().abs()
        d_p = d_out @ vv.float().abs().transpose(-1, -2)
        d_s = prob * (d_p + (prob * d_p).sum(-1, keepdim=True))
        dq = (d_s @ kk.float().abs()) * scale
        dk = (d_s.transpose(-1, -2) @ q.float().abs()) * scale
        dv = prob.transpose(-1, -2) @ d_out
        if rep > 1:
            b, h, s, d = dk.shape
            dk = dk.view(b, h // rep, rep, s, d).sum(2)
            dv = dv.view(b, h // rep, rep, s, d).sum(2)
        if self.rope:
            dq, dk = self._unrotate(dq), self._unrotate(dk)
        for linear, grad in ((attention.wq, dq), (attention.wk, dk), (attention.wv, dv)):
            b, h, s, d = grad.shape
            self.attention_abs[id(linear)] = grad.transpose(1, 2).reshape(b, s, h * d)

    @staticmethod
    def _unrotate(g: torch.Tensor) -> torch.Tensor:
        s, d = g.shape[-2:]
        cos, sin = rope_cos_sin(s, d)
        half = d // 2
        swapped = torch.cat([g[..., half:], g[..., :half]], dim=-1)
        return g * cos.abs() + swapped * sin.abs()

    def _add(self, param, norm: torch.Tensor | float) -> None:
        if param is not None:
            self.norms[id(param)] = self.norms.get(id(param), 0.0) + float(norm)

    def _forward(self, module, inputs, output) -> None:
        if not output.requires_grad:
            return
        x = inputs[0].detach()

        def on_grad(grad: torch.Tensor) -> None:
            full = grad.detach().float()
            dy = full.flatten(0, -2).abs()
            vec = torch.linalg.vector_norm
            if isinstance(module, nn.Linear):
                upstream = self.attention_abs.pop(id(module), None)
                if upstream is not None and upstream.numel() == dy.numel():
                    dy = torch.maximum(dy, upstream.reshape(dy.shape))
                self._add(
                    module.weight, (vec(dy, dim=1) * vec(x.flatten(0, -2).float(), dim=1)).sum()
                )
                if module.bias is not None:
                    self._add(module.bias, vec(dy.sum(0)))
            elif isinstance(module, nn.Embedding):
                ids, where = torch.unique(x.reshape(-1), return_inverse=True)
                rows = torch.zeros(ids.numel(), dy.shape[1]).index_add_(0, where, dy)
                self._add(module.weight, vec(rows))
                if self.positions is not None:
                    self._add(self.positions.weight, vec(full.abs().sum(0)))
            else:
                if isinstance(module, nn.LayerNorm):
                    xhat = F.layer_norm(x.float(), module.normalized_shape, eps=module.eps)
                else:
                    xhat = F.rms_norm(x.float(), module.normalized_shape, eps=module.eps)
                self._add(module.weight, vec((dy * xhat.abs().flatten(0, -2)).sum(0)))
                if getattr(module, "bias", None) is not None:
                    self._add(module.bias, vec(dy.sum(0)))

        output.register_hook(on_grad)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        for attention in self.patched:
            del attention._core
        self.attention_abs.clear()


class AnchoredReference:
    """The single-process model that follows a parallel run step by step (module docstring).

    `gradient(step)` evaluates the step at the current parameters; `apply(grads)` then takes the
    optimizer step with the run's own gradients. A correct run computes the same elementwise update
    on its shards, so the replay's parameters are the run's (to the bit, as measured): each next
    gradient is evaluated where the run evaluated it, and the run's parameters are checked against
    the replay's (verify.py)."""

    def __init__(self, spec: RunSpec, model: nn.Module | None = None):
        self.spec = spec
        self.rounding = rounding_model(spec)
        self.model = model if model is not None else build_model(spec.model, seed=spec.seed)
        self.params = dict(self.model.named_parameters())
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self.bounds: dict[str, torch.Tensor] | None = None
        """Elementwise bound on |run - replay| accumulated over the steps applied (None before any)."""

    def gradient(self, step: int) -> StepGradient:
        tokens = synthetic_tokens(self.spec, step)
        x, y = tokens[:, :-1], tokens[:, 1:]
        terms = _AbsoluteTerms(self.model)
        try:
            logits = self.model(x)
            loss = lm_loss(logits, y)
            with torch.no_grad():
                flat = logits.detach().float().flatten(0, 1)
                lse = torch.logsumexp(flat, dim=-1)
                target = flat.gather(1, y.reshape(-1, 1)).squeeze(1)
                loss_scale = (lse.abs() + target.abs()).mean().item()
            del logits, flat
            for p in self.params.values():
                p.grad = None
            loss.backward()
        finally:
            terms.remove()
        factor = self.rounding.gradient_factor
        grads, bounds = {}, {}
        for name, p in self.params.items():
            grads[name] = p.grad if p.grad is not None else torch.zeros_like(p)
            bounds[name] = factor * terms.norms.get(id(p), 0.0)
            p.grad = None
        return StepGradient(
            loss=loss.item(),
            loss_bound=self.rounding.loss_factor * loss_scale,
            grads=grads,
            grad_bounds=bounds,
        )

    @torch.no_grad()
    def apply(self, grads: dict) -> dict:
        """One optimizer step with the run's gradients; returns the elementwise bound on |run - replay|
        after it: the previous one plus this update's rounding, u (2 |theta_new| + 8 |delta theta|):
        two roundings at the parameter's scale (decoupled weight decay's product, the final addition),
        at most eight at the update's (moment updates, square root, epsilon, quotient, step size). It
        allows another order of the same elementwise operations; the measured difference is zero."""
        u = self.rounding.u_run + self.rounding.u_ref
        before = {}
        for name, p in self.params.items():
            g = grads.get(name)
            p.grad = (
                g.to(p.dtype).reshape(p.shape).clone() if g is not None else torch.zeros_like(p)
            )
            before[name] = p.detach().clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        bounds = self.bounds or {}
        for name, p in self.params.items():
            step = before.pop(name).sub_(p).abs_().mul_(8).add_(p.abs(), alpha=2).mul_(u)
            bounds[name] = bounds[name].add_(step) if name in bounds else step
        self.bounds = bounds
        return bounds

    @torch.no_grad()
    def load_state(self, params: dict, state: dict) -> None:
        """Resume: the parameters and optimizer state (name -> {key: tensor}) a resumed run started from."""
        for name, p in self.params.items():
            p.copy_(params[name].reshape(p.shape))
            saved = state.get(name)
            if saved:
                self.optimizer.state[p] = {
                    k: (
                        v.reshape(p.shape).clone()
                        if torch.is_tensor(v) and v.dim()
                        else v.clone()
                        if torch.is_tensor(v)
                        else v
                    )
                    for k, v in saved.items()
                }
