"""Magnitude helpers for the tolerance: elementwise bounds on the sum of absolute values of the
terms behind an output (``Target(magnitude=...)``).

A rounding error of a sum is bounded by the unit roundoff times the sum of the absolute values of
its terms, not of its result: where terms cancel, the result is small and its error is not. These
helpers compute such bounds for common pieces, from float64 values and absolute-value bounds of
the operands.
"""

from __future__ import annotations

import torch


def matmul_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a| @ |b|``: the bound behind ``a @ b``."""
    return a.abs() @ b.abs()


def attention_magnitude(q, k, v, aq, ak, av, adout, mask, *, adlse=None, merge=False):
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


def rope_abs(a):
    """A bound on ``|rope(x)|`` (and on ``|rope^T(g)|``) from ``a >= |x|``: each rotated pair gets
    ``|x1| + |x2|``."""
    half = a.shape[-1] // 2
    if half == 0:
        return a
    pair = a[..., :half] + a[..., half : 2 * half]
    return torch.cat([pair, pair, a[..., 2 * half :]], dim=-1)
