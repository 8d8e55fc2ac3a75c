"""Magnitude helpers for user targets: elementwise bounds on the sum of absolute values of the
terms behind an output (``Target(magnitude=...)``).

A target rarely needs one: the noise model (:mod:`shardfuzz.verdict.noise`) estimates each output's
rounding noise from the oracle itself. A magnitude given replaces the output's scale in the
tolerance's floor (``floor_factor * u * magnitude``), which helps where an implementation's
intermediates are far larger than the result and the oracle never sees them.

A rounding error of a sum is bounded by the unit roundoff times the sum of the absolute values of
its terms, not of its result: where terms cancel, the result is small and its error is not. These
helpers compute such bounds for common pieces, from float64 values and absolute-value bounds of
the operands.
"""

from __future__ import annotations

from typing import Any

import torch


def matmul_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a| @ |b|``: the bound behind ``a @ b``."""
    return a.abs() @ b.abs()


def attention_magnitude(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,  # noqa: ARG001 (the signature mirrors attention; only v's bound av enters)
    aq: torch.Tensor,
    ak: torch.Tensor,
    av: torch.Tensor,
    adout: torch.Tensor | None,
    mask: torch.Tensor | None,
    *,
    adlse: torch.Tensor | None = None,
    merge: bool = False,
) -> Any:
    """Elementwise bounds on the sum of |terms| behind attention's outputs and gradients.

    ``q``/``k``/``v`` ``[b, s, h, d]`` (float64, same heads) give the true probabilities ``P``;
    ``aq``/``ak``/``av``/``adout`` are bounds on the absolute values of the operands; ``mask``
    ``[nq, nk]`` (True: visible) or None. A rounding error in a score moves ``P`` by about
    ``P * (score error - mean score error)``, so ``P``'s relative error scales with the largest
    ``|q|.|k|`` term of the row (``E``); with ``merge`` (blockwise LSE merges), also with ``|lse|``.
    Returns bounds for ``out``, ``lse`` (``[b, h, s]``), ``dq``, ``dk`` and ``dv`` (per head of ``q``).
    """
    scale = q.shape[-1] ** -0.5
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    a = torch.einsum("bqhd,bkhd->bhqk", aq, ak) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -torch.inf)
        a = a.masked_fill(~mask, 0.0)
    lse = torch.logsumexp(s, dim=-1).nan_to_num(0.0, 0.0, 0.0)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    smax = a.amax(-1) if a.shape[-1] else torch.zeros_like(lse)
    e = 1.0 + 2.0 * smax + (2.0 * lse.abs() if merge else 0.0)  # [b, h, q]
    pe = p * e[..., None]
    out = torch.einsum("bhqk,bkhd->bqhd", pe, av)
    b_ = torch.einsum("bqhd,bkhd->bhqk", adout, av)  # |dout_i| . |v_j|
    dmag = (p * b_).sum(-1)
    if adlse is not None:
        dmag = dmag + adlse
    ds = pe * (b_ + dmag[..., None]) * 2.0
    return {
        "out": out,
        "lse": smax + lse.abs() + 1.0,
        "dq": torch.einsum("bhqk,bkhd->bqhd", ds, ak) * scale,
        "dk": torch.einsum("bhqk,bqhd->bkhd", ds, aq) * scale,
        "dv": torch.einsum("bhqk,bqhd->bkhd", pe, adout),
    }


def rope_abs(a: torch.Tensor) -> torch.Tensor:
    """A bound on ``|rope(x)|`` (and on ``|rope^T(g)|``) from ``a >= |x|``: each rotated pair gets
    ``|x1| + |x2|``."""
    half = a.shape[-1] // 2
    if half == 0:
        return a
    pair = a[..., :half] + a[..., half : 2 * half]
    return torch.cat([pair, pair, a[..., 2 * half :]], dim=-1)


def softmax_magnitude(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """A bound behind ``softmax(x, dim)``: ``p * (1 + |x - max|)`` (``exp`` of a rounded difference)."""
    p = torch.softmax(x, dim).nan_to_num(0.0)
    return p * (1 + (x - x.amax(dim, keepdim=True)).abs().nan_to_num(0.0, 0.0, 0.0))


def layer_norm_magnitude(
    x: torch.Tensor,
    n_dims: int = 1,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """A bound behind ``layer_norm`` over the last ``n_dims`` dims: ``(|xhat| * E[x^2]/var + E|x|/std) |w| + |b|``
    (a one-pass variance cancels against ``E[x^2]``; the mean's rounding scales with ``E|x|``)."""
    dims = list(range(x.dim() - n_dims, x.dim()))
    var = x.var(dims, unbiased=False, keepdim=True)
    rstd = (var + eps).rsqrt()
    rel = 1 + x.pow(2).mean(dims, keepdim=True) * rstd.pow(2)
    out = ((x - x.mean(dims, keepdim=True)) * rstd).abs() * rel + x.abs().mean(dims, keepdim=True) * rstd
    out = out * weight.abs() if weight is not None else out
    return out + bias.abs() if bias is not None else out


def rms_norm_magnitude(
    x: torch.Tensor, n_dims: int = 1, weight: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """A bound behind ``rms_norm`` over the last ``n_dims`` dims: ``|x| / rms(x) * |w|`` (a sum of squares
    does not cancel, so its relative error is small)."""
    dims = list(range(x.dim() - n_dims, x.dim()))
    out = x.abs() * (x.pow(2).mean(dims, keepdim=True) + eps).rsqrt()
    return out * weight.abs() if weight is not None else out


def cross_entropy_magnitude(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, ignore_index: int = -100
) -> dict[str, torch.Tensor]:
    """Bounds behind the mean ``cross_entropy(logits [N, C], target [N])`` (``loss``) and its logits
    gradient (``grad``): the loss sums ``|logsumexp| + |logit of the target|`` per row; the gradient
    ``p - onehot`` cancels where ``p`` is near 1."""
    valid = target != ignore_index
    w = weight[target.clamp_min(0)] if weight is not None else torch.ones_like(logits[:, 0])
    w = w * valid
    lse = torch.logsumexp(logits, -1)
    picked = logits.gather(1, target.clamp_min(0)[:, None])[:, 0]
    denom = w.sum().clamp_min(torch.finfo(logits.dtype).tiny)
    row = (lse.abs() + picked.abs() + 1 + logits.abs().amax(-1)) * w
    p = torch.softmax(logits, -1) * (1 + (logits - logits.amax(-1, keepdim=True)).abs())
    grad = (p + torch.nn.functional.one_hot(target.clamp_min(0), logits.shape[-1])) * (w / denom)[:, None]
    return {"loss": row.sum() / denom, "grad": grad}


def adam_update_magnitude(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    step: int = 1,
) -> dict[str, torch.Tensor]:
    """Bounds behind one (decoupled-weight-decay) Adam step from float64 state: the new ``param``
    sums ``|param|`` and ``lr * |update|``; ``exp_avg`` and ``exp_avg_sq`` sum their two terms."""
    b1, b2 = betas
    m = b1 * exp_avg.abs() + (1 - b1) * grad.abs()
    v = b2 * exp_avg_sq.abs() + (1 - b2) * grad.pow(2)
    denom = (v / (1 - b2**step)).sqrt() + eps
    update = m / (1 - b1**step) / denom
    # the update divides by sqrt(v) + eps: where v is tiny, its own rounding moves the step by up to 100%
    p = param.abs() * (1 + lr * weight_decay) + lr * update * (2 + (v.sqrt() / denom))
    return {"param": p, "exp_avg": m, "exp_avg_sq": v}
