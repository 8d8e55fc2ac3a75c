"""Which ops the rounding-noise model (:mod:`shardfuzz.verdict.noise`) perturbs, and how.

Op names are aten overload packets without a trailing ``_`` (in-place variants share the rule).
A rule of :data:`SPECIAL` gets the mode, the op's arguments bound by name and its result, and
returns the result with noise added; it reads ``mode.u`` (one rounding), ``mode.reduction_u`` (a
sum whose partial sums a sharded implementation may round in another order) and ``mode.case_u``
(the case dtype's unit roundoff, where what a rounding can do depends on the dtype, not only on
its size: GELU's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from shardfuzz.spec.tolerance import UNIT_ROUNDOFF

#: exact ops (data movement, selection, constants): never perturbed
EXACT = frozenset(
    """copy clone detach alias lift_fresh lift_fresh_copy _to_copy to contiguous cat stack index
    index_select gather scatter masked_fill where zeros zeros_like ones ones_like full full_like empty
    empty_like empty_strided new_zeros new_ones new_full new_empty new_empty_strided fill zero neg abs
    relu threshold_backward maximum minimum clamp clamp_min clamp_max sign sgn floor ceil round trunc
    max min amax amin sort topk kthvalue argmax argmin embedding constant_pad_nd repeat flip roll tril
    triu masked_select nonzero slice_backward select_backward slice_scatter select_scatter
    diagonal_scatter as_strided_scatter _unsafe_view arange linspace scalar_tensor eq ne lt le gt ge
    isnan isinf isfinite logical_and logical_or logical_not _local_scalar_dense equal rand randn
    rand_like randn_like normal uniform bernoulli randint randperm resize set nan_to_num
    repeat_interleave index_fill masked_scatter take expand_copy view_copy permute_copy
    split_with_sizes_copy unbind_copy squeeze unsqueeze transpose t swapdims swapaxes as_strided""".split()
)

#: ops whose terms' magnitude is the op itself on the operands' absolute values
SUM_LIKE = frozenset(
    """add sub rsub sum mean nansum mm bmm addmm addmv addr mv dot vdot baddbmm addbmm cumsum index_add
    scatter_add embedding_dense_backward convolution convolution_backward _convolution nll_loss_forward
    nll_loss2d_forward addcmul addcdiv _foreach_add _foreach_sub _foreach_addcmul _foreach_addcdiv
    trace index_put _index_put_impl _unsafe_index_put""".split()
)

#: sums over many terms: a sharded implementation rounds W partial sums and an all-reduce
REDUCTIONS = frozenset(
    """sum mean nansum mm bmm addmm addmv mv dot vdot baddbmm addbmm cumsum index_add scatter_add
    embedding_dense_backward convolution convolution_backward _convolution nll_loss_forward
    nll_loss2d_forward trace linalg_vector_norm norm prod index_put _index_put_impl _unsafe_index_put""".split()
)


def _fin(t: torch.Tensor) -> torch.Tensor:
    return t.nan_to_num(0.0, 0.0, 0.0)


def _bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _dims(x: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return list(range(x.dim()))
    return [dim] if isinstance(dim, int) else list(dim)


# -- softmax family -------------------------------------------------------------------------------
def _softmax(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    x, dim = b["self"], b["dim"]
    m = x.amax(dim, keepdim=True)
    # exp(x - max) errs by |x - max| roundings; an implementation that takes exp(x - lse) from a
    # stored logsumexp also errs by that statistic's rounding (_stat_error)
    row = _stat_error(mode, m)  # one error for the whole row: correlated
    return out + mode.noise(out * (1 + _fin((x - m).abs())), mode.reduction_u) + out * mode.noise(row)


def _stat_error(mode: Any, m: torch.Tensor) -> torch.Tensor:
    """The error, in roundings of the case dtype, of ``exp(x - lse)`` from a stored logsumexp:
    ``lse`` (kept in float32 or wider) rounds on the scale of ``|max|``. Also where one term
    dominates (``lse`` is then the max itself): a flash kernel's backward recomputes the scores by
    other arithmetic (the scale folded into ``q``), so ``x - lse`` of the dominant term is a
    rounding of ``|max|``, not 0 (torch's context-parallel ring, in float32 at logits of 30-100)."""
    return _fin(m.abs()) * mode.stat_ratio


def _log_softmax(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:

    x, dim = b["self"], b["dim"]
    m = x.amax(dim, keepdim=True)
    # out = (x - max) - log(sum): those roundings, plus a stored logsumexp's (_stat_error)
    shifted = _fin((x - m).abs()) + _fin((x - out - m).abs()) + _fin(out.abs())
    row = _stat_error(mode, m)  # one lse error per row
    return out + mode.noise(shifted, mode.reduction_u) + mode.noise(row)


def _logsumexp(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    x, dims, keep = b["self"], _dims(b["self"], b["dim"]), b.get("keepdim", False)
    m = x.amax(dims, keepdim=True)
    yk = torch.logsumexp(x, dims, keepdim=True)
    p = _fin(torch.exp(x - yk))
    terms = (p * (1 + _fin((x - m).abs()))).sum(dims, keepdim=True) + _fin((yk - m).abs()) + _fin(yk.abs())
    if not keep:
        terms = terms.squeeze(dims) if hasattr(terms, "squeeze") else terms
        for d in sorted((d % x.dim() for d in dims), reverse=True):
            terms = terms.squeeze(d) if terms.dim() > out.dim() else terms
    return out + mode.noise(terms.reshape(out.shape), mode.reduction_u)


def _softmax_backward(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    g, y, dim = b["grad_output"], b["output"], b["dim"]
    scale = y.abs() * (g.abs() + (g * y).abs().sum(dim, keepdim=True))
    # out = y * (g - delta), delta = rowsum(g * y). A flash-style backward takes delta as
    # rowsum(dO * O) from the stored forward output: its error is on the scale of the terms behind
    # g (|dO| @ |V|, which can dwarf |g| where dO . v cancels), and one error serves the whole row
    terms = mode.terms_of(g)
    row = (y.abs() * (g.abs() if terms is None else terms)).sum(dim, keepdim=True)
    return out + mode.noise(scale, mode.reduction_u) + y * mode.noise(row, mode.reduction_u)


def _log_softmax_backward(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    g, y, dim = b["grad_output"], b["output"], b["dim"]
    scale = g.abs() + torch.exp(y) * g.abs().sum(dim, keepdim=True)
    return out + mode.noise(_fin(scale), mode.reduction_u)


# -- variance and layer norm ----------------------------------------------------------------------
#: in 16-bit dtypes a one-pass variance is covered while it still has digits: up to a mean^2 of
#: this many variances (its relative error then up to about 16 u, 6% in bf16)
ONE_PASS_SPREAD = 16.0


def _cancelling(mode: Any, x: torch.Tensor, dims: list[int], keep: bool) -> torch.Tensor:
    """What a variance's roundings are taken on: ``var + mean^2`` (``E[x^2]``, what a one-pass
    ``E[x^2] - mean^2`` cancels against) in float32 and float64, as before. In 16-bit dtypes the
    ``mean^2`` beyond :data:`ONE_PASS_SPREAD` variances is charged at the precision torch's
    kernels keep statistics in, float32 (``stat_ratio``), plus a two-pass variance's rounded mean
    squared, ``(u * mean)^2``. ``E[x^2]`` whole allowed a bf16 SyncBatchNorm at a mean of 100 an
    error 60x its output (a new user's forward bug, 23% off, passed at 0.001x; torch's kernel is
    0.0076 off there): a one-pass variance of bf16 tensors has no digit left there."""
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).pow(2).mean(dims, keepdim=keep)
    m2 = (mean if keep else mean.squeeze(tuple(dims))).pow(2)
    r = mode.stat_ratio
    return var + (1 - r) * torch.minimum(m2, ONE_PASS_SPREAD * var) + (r + mode.case_u) * m2


def _moments(mode: Any, b: dict, out: Any, name: str) -> Any:
    x = b["self"]
    dims, keep = _dims(x, b.get("dim")), b.get("keepdim", False)
    ms = _cancelling(mode, x, dims, keep)
    outs = list(out) if isinstance(out, tuple) else [out]
    spread = outs[0]
    if name.startswith("std"):
        scale = ms / (2 * spread).clamp_min(math.sqrt(mode.u) * ms.sqrt().clamp_min(1e-300))
    else:
        scale = ms
    outs[0] = spread + mode.noise(_fin(scale), mode.reduction_u)
    if len(outs) > 1:
        outs[1] = outs[1] + mode.noise(x.abs().mean(dims, keepdim=keep), mode.reduction_u)
    return tuple(outs) if isinstance(out, tuple) else outs[0]


def _norm_parts(mode: Any, x: torch.Tensor, shape: Any, mean: torch.Tensor, rstd: torch.Tensor) -> tuple:
    dims = list(range(x.dim() - len(shape), x.dim()))
    rel = 1 + _cancelling(mode, x, dims, True) * rstd.pow(2)  # the variance's cancellation
    return dims, (x - mean) * rstd, rel


def _layer_norm(mode: Any, b: dict, out: tuple) -> tuple:
    """``(x - mean) * rstd * w + bias``: each element's own roundings, and the mean's rounding,
    one per row, shared by every element of the row (``w * rstd`` times it): drawn once per row,
    not per element. A new user's correct two-pass LayerNorm on constant rows (``x - mean`` is
    its rounding alone, times ``rstd = 1/sqrt(eps)``) fed a linear layer that sums the row's
    elements: the same error d times, where independent draws grew as sqrt(d) (1.78x, float32)."""
    x, shape, w, bias = b["input"], b["normalized_shape"], b["weight"], b["bias"]
    y, mean, rstd = out
    dims, xhat, rel = _norm_parts(mode, x, shape, mean, rstd)
    mabs = x.abs().mean(dims, keepdim=True)
    scale = xhat.abs() * rel
    scale = scale * w.abs() if w is not None else scale
    scale = scale + bias.abs() if bias is not None else scale
    ru = mode.reduction_u
    shift = mode.noise(mabs, ru)  # the mean's rounding: one per row
    shared = shift * rstd * (w if w is not None else 1.0)
    return (
        y + mode.noise(scale, ru) - shared,
        mean + shift.reshape(mean.shape),
        rstd + mode.noise(rstd * rel, ru),
    )


def _layer_norm_backward(mode: Any, b: dict, out: tuple) -> tuple:
    g, x, shape, w = b["grad_out"], b["input"], b["normalized_shape"], b["weight"]
    dims, xhat, rel = _norm_parts(mode, x, shape, b["mean"], b["rstd"])
    gw = g * w if w is not None else g
    batch = list(range(x.dim() - len(shape)))
    dx_scale = (
        b["rstd"]
        * (
            gw.abs()
            + gw.abs().mean(dims, keepdim=True)
            + xhat.abs() * (gw * xhat).abs().mean(dims, keepdim=True)
        )
        * rel
    )
    scales = [dx_scale, ((g * xhat).abs() * rel).sum(batch), g.abs().sum(batch)]
    ru = mode.reduction_u
    return tuple(None if t is None else t + mode.noise(s.reshape(t.shape), ru) for t, s in zip(out, scales))


# -- scaled-dot-product attention (the fused CPU kernels) ---------------------------------------
def _attention_parts(b: dict, q: torch.Tensor, k: torch.Tensor) -> tuple:
    """Probabilities ``P``, the |q|.|k| terms ``M`` of each score, ``|score - row max|``, ``scale``,
    the row max."""
    scale = b.get("scale") or q.shape[-1] ** -0.5
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) * scale
    mterms = q.abs() @ k.abs().transpose(-1, -2) * abs(scale)
    visible = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device)
    if b.get("is_causal"):
        visible = visible.tril()
    mask = b.get("attn_mask")
    if mask is not None and mask.dtype == torch.bool:
        visible = visible & mask
    elif mask is not None:
        s = s + mask
    s = s.masked_fill(~visible, -math.inf)
    p = _fin(torch.softmax(s, -1))
    m = s.amax(-1, keepdim=True)
    z = _fin((s - m).abs())
    return p, mterms.masked_fill(~visible, 0.0), z.masked_fill(~visible, 0.0), scale, m


def _heads_back(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Sum grouped-query heads back onto the key/value heads they share."""
    if t.shape[1] == heads:
        return t
    return t.unflatten(1, (heads, t.shape[1] // heads)).sum(2)


def _sdpa(mode: Any, b: dict, out: tuple) -> tuple:
    q, k, v = b["query"], b["key"], b["value"]
    p, mterms, z, _, m = _attention_parts(b, q, k)
    if v.shape[1] != q.shape[1]:
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    ds = mode.noise(mterms, mode.reduction_u) + mode.noise(1 + z)  # score rounding, exp rounding
    shift = (p * ds).sum(-1, keepdim=True)
    dout = (p * (ds - shift)) @ v + mode.noise(p @ v.abs(), mode.reduction_u)
    # an implementation that keeps a logsumexp (split-K decoding, ring attention merging partial
    # results) takes exp(s - lse) with lse rounded on the scale of |max|: one relative error per
    # row, as softmax's rule has (_stat_error). Without it, a new user's correct flash-decoding
    # merge was reported at 2.79x (float64) and 2.49x (float32) against SDPA, where one score
    # dominated (64 against -17 and 32), and passed against torch.softmax
    dout = dout + out[0] * mode.noise(_stat_error(mode, m))
    dlse = shift.squeeze(-1) + mode.noise(out[1])
    return (out[0] + dout, out[1] + dlse.reshape(out[1].shape), *out[2:])


def _sdpa_backward(mode: Any, b: dict, out: tuple) -> tuple:
    dout, q, k, v, o = b["grad_out"], b["query"], b["key"], b["value"], b["out"]
    p, mterms, z, scale, _ = _attention_parts(b, q, k)
    kk, vv = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    dp = dout @ vv.transpose(-1, -2)
    d = (dout * o).sum(-1, keepdim=True)
    terms = dout.abs() @ vv.abs().transpose(-1, -2) + (dout * o).abs().sum(-1, keepdim=True)
    ds_scale = p * (terms + (dp - d).abs() * (1 + mterms + z))  # rounding, and P's own error
    scales = [
        ds_scale @ kk.abs() * abs(scale),
        _heads_back(ds_scale.transpose(-1, -2) @ q.abs() * abs(scale), k.shape[1]),
        _heads_back(p.transpose(-1, -2) @ dout.abs(), v.shape[1]),
    ]
    ru = mode.reduction_u
    return tuple(t + mode.noise(s.reshape(t.shape), ru) for t, s in zip(out, scales))


#: the tanh approximation's constants: ``Phi(x) ~ (1 + tanh(c (x + k x^3))) / 2``
_TANH_C, _TANH_K = math.sqrt(2 / math.pi), 0.044715


def _gelu(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    """``x * Phi(x)``, ``Phi = (1 + erf(x / sqrt 2)) / 2`` (or its tanh or sigmoid form): ``Phi``'s
    own rounding (at most ``u`` of its O(1) value, cancelling in the negative tail) times ``|x| / 2``,
    and the result's rounding. Over every bf16 and float16 value with 1e-3 <= |x| <= 12, the forms
    written by hand and torch's kernels (which compute in float32 and round once) err by at most 1.34
    of these units (``tests/test_noise_rules.py``); ``|x|`` in place of ``|x| / 2`` was twice that and
    hid a quick GELU's 0.02 in bf16. In float32 and float64 it stays ``|x|``: torch's float32 CPU
    kernel errs by up to 10 of the ``|x| / 2`` units, and by a different amount a few ulps away, so
    the oracle's rerun in the case dtype does not hold it where the implementation's input differs."""
    x = b["self"]
    half = 0.5 if mode.case_u > UNIT_ROUNDOFF["float32"] else 1.0  # a 16-bit case dtype
    return out + mode.noise(half * x.abs() + out.abs())


def _gelu_backward(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    """``g * (Phi(x) + x phi(x))``: ``Phi``'s rounding, on the scale of ``|g| / 2`` (cancelling in the
    negative tail), the ``x phi(x)`` path's roundings, and the result's. The tanh form's derivative
    has ``1 - tanh^2`` computed from a rounded ``tanh`` (autograd's): it errs by up to ``2 u tanh^2``,
    or by all of it where ``tanh`` rounds to 1, times ``x c (1 + 3 k x^2) / 2``; the term is twice
    that, for the sigmoid form, which rounds ``s`` and ``1 - s`` both (2.4 units in float32 with the
    term as derived). Without the term a hand-written tanh GELU's gradient (GPT-2's ``NewGELU``)
    came to 4.0 units in float16, the sigmoid form's to 5.8, over the 2.3 that a bound of 4 noises
    allows one rounding. The old ``|g| (1 + ...)`` was twice the erf forms' error in the negative tail."""
    g, x = b["grad_output"].abs(), b["self"]
    # 0 past |x| = 40 (exp(-800) is 0 already), not 0 * inf from x * x overflowing float64
    phi_path = torch.where(x.abs() < 40, x.abs() * (-0.5 * x * x).exp() * (1 + x * x), 0.0)
    scale = g * (0.5 + 0.5 * phi_path) + out.abs()  # |out| = |g| |GELU'(x)|
    if b.get("approximate") == "tanh":
        t = torch.tanh(_TANH_C * (x + _TANH_K * x**3))
        cancel = torch.minimum(t * t, (1 - t * t) / (2 * mode.case_u))
        term = 2 * g * x.abs() * _TANH_C * (1 + 3 * _TANH_K * x * x) * cancel
        # where tanh is exactly +-1 there is nothing to cancel: 0, not inf * 0 (|x| past 1e102)
        scale = scale + torch.where(cancel > 0, term, 0.0)
    return out + mode.noise(scale)


def _lerp(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    """``a + w (end - a)``: terms ``|1 - w| |a| + |w| |end|``, at most ``|out| + 2 |w| |end|`` (the
    bound it was written with, when the in-place form's rule saw ``a`` overwritten; the mode now
    hands a rule the operand as it was, and this bound, at most 3x the terms, stays)."""
    end, w = b["end"], b["weight"]
    w = w.abs() if isinstance(w, torch.Tensor) else abs(w)
    return out + mode.noise(out.abs() + 2 * w * end.abs())


# -- embedding bags ---------------------------------------------------------------------------
def _abs_terms(func: Any, args: tuple, kwargs: dict, names: tuple[str, ...]) -> Any:
    """``func`` again with its tensor arguments named ``names`` in absolute value: the |terms| of
    the sums it makes (each bag's rows, each row's gradient, each dot product)."""
    pos, named = list(args), dict(kwargs)
    for i, a in enumerate(func._schema.arguments):
        if a.name not in names:
            continue
        if i < len(pos) and not a.kwarg_only:
            pos[i] = pos[i].abs() if isinstance(pos[i], torch.Tensor) else pos[i]
        elif isinstance(named.get(a.name), torch.Tensor):
            named[a.name] = named[a.name].abs()
    return func(*pos, **named)


def _embedding_bag(mode: Any, func: Any, args: tuple, kwargs: dict, out: tuple) -> tuple:
    """Each bag's sum or mean of (weighted) rows rounds on the scale of its |terms|, not of the
    result: a new user's correct sharded EmbeddingBag, whose weighted rows cancelled (-0.909 and
    1.006), was 1.23x and 1.8x its float32 bound when the op got one rounding of its result. A max
    bag is a selection: exact."""
    if _bind(func, args, kwargs).get("mode", 0) == 2:
        return out
    terms = _abs_terms(func, args, kwargs, ("weight", "per_sample_weights"))[0]
    return (out[0] + mode.noise(_fin(terms), mode.reduction_u), *out[1:])


def _embedding_bag_grad(names: tuple[str, ...]) -> Callable[..., Any]:
    """The backward ops' sums: each row's gradient over the bags that hold it (``grad``, times
    ``per_sample_weights``), or each per-sample weight's dot product of a bag's gradient and a row."""

    def rule(mode: Any, func: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> torch.Tensor:
        return out + mode.noise(_fin(_abs_terms(func, args, kwargs, names)), mode.reduction_u)

    return rule


# -- FFTs -----------------------------------------------------------------------------------------
def _fft(mode: Any, func: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> torch.Tensor:
    """Each output element of a DFT is a sum over the transformed dims of every input element times
    a root of unity: it rounds on the scale of those |terms|, the sum of ``|x|`` (scaled as the op
    normalises), which is the transform of ``|x|`` at frequency 0; real and imaginary parts each.
    An FFT's error grows as ``log n`` times the norm, within that sum for the sizes drawn. One
    rounding of the result undercounts where frequencies cancel (a new user's correct
    distributed rfft2/irfft2 was 1.1x past its bound, when complex results got no noise at all)."""
    b = _bind(func, args, kwargs)
    x, dims = b["self"], b["dim"]
    magnitude = x.abs()
    if func.overloadpacket.__name__ != "_fft_r2c":  # c2c and c2r take complex input
        magnitude = magnitude.to(x.dtype if x.is_complex() else torch.complex128)
    at_zero = func(magnitude, *args[1:], **kwargs)
    index = [slice(None)] * at_zero.dim()
    for d in dims:
        index[d] = slice(0, 1)
    terms = _fin(at_zero[tuple(index)].abs())  # broadcast along the transformed dims
    noise = mode.noise(terms.expand(out.shape), mode.reduction_u)
    if out.is_complex():
        noise = torch.complex(noise, mode.noise(terms.expand(out.shape), mode.reduction_u))
    return out + noise


# -- scans -----------------------------------------------------------------------------------------
def _walk(mode: Any, like: torch.Tensor, dim: int) -> torch.Tensor:
    """One rounding's draw at every step of a scan along ``dim``, summed up to each step: the
    relative error of a running product, or the absolute one of a running log-sum-exp."""
    return mode.noise(torch.ones_like(like)).cumsum(dim)


def _cumprod(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    """A running product rounds at every step: its relative error walks, ``out * sum of the steps'
    roundings`` (one rounding of the result undercounted a long product's)."""
    return out + out * _walk(mode, out, b["dim"])


def _logcumsumexp(mode: Any, b: dict, out: torch.Tensor) -> torch.Tensor:
    """Each running sum of exps rounds at every step, a relative error that its log turns absolute,
    and the log rounds its result."""
    return out + _walk(mode, out, b["dim"]) + mode.noise(out.abs())


# -- dense linear algebra ------------------------------------------------------------------------
def _backward_stable(matrix: str, symmetric: bool = False) -> Callable[..., Any]:
    """A backward-stable factorisation or solve (Householder QR, Cholesky, an LU inverse, a
    triangular solve) computes the exact result of a nearby input: ``matrix`` off by about ``u``
    times its norm. Its rounding is the op rerun on such an input, which an ill
    conditioned one amplifies as any correct implementation's would (a new user's correct TSQR was
    1.07x-2.03x past a bound of one rounding of ``linalg_qr``'s results, and of Householder's steps
    written out: a different algorithm's error, amplified along other directions). A symmetric
    input (Cholesky's) gets a symmetric nudge."""

    def rule(mode: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:  # noqa: ARG001 (rerun, not perturbed)
        b = _bind(func, args, kwargs)
        a = b[matrix]
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 2 and a.numel()):
            raise ValueError("no matrix to perturb")  # RULE_DOES_NOT_APPLY: one rounding instead
        # normwise: a blocked or tree algorithm (TSQR) is stable in the matrix's norm, not column
        # by column (per column, R's small columns were 1.12x past it in float64)
        norm = torch.linalg.matrix_norm(a, keepdim=True).expand(a.shape)
        nudge = mode.noise(_fin(norm))
        if symmetric:
            nudge = (nudge + nudge.mT) / 2
        pos, named = list(args), dict(kwargs)
        names = [x.name for x in func._schema.arguments]
        i = names.index(matrix)
        if i < len(pos):
            pos[i] = a + nudge
        else:
            named[matrix] = a + nudge
        return func(*pos, **named)

    return rule


Rule = Callable[[Any, dict, Any], Any]


def _named(rule: Rule) -> Callable[..., Any]:
    def apply(mode: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        return rule(mode, _bind(func, args, kwargs), out)

    return apply


#: op name -> rule(mode, func, args, kwargs, result) -> result with noise
SPECIAL: dict[str, Callable[..., Any]] = {
    "_softmax": _named(_softmax),
    "_log_softmax": _named(_log_softmax),
    "logsumexp": _named(_logsumexp),
    "_softmax_backward_data": _named(_softmax_backward),
    "_log_softmax_backward_data": _named(_log_softmax_backward),
    "lerp": _named(_lerp),
    "gelu": _named(_gelu),
    "gelu_backward": _named(_gelu_backward),
    "native_layer_norm": _named(_layer_norm),
    "native_layer_norm_backward": _named(_layer_norm_backward),
    "_scaled_dot_product_flash_attention_for_cpu": _named(_sdpa),
    "_scaled_dot_product_flash_attention_for_cpu_backward": _named(_sdpa_backward),
}
SPECIAL["_embedding_bag"] = SPECIAL["_embedding_bag_forward_only"] = _embedding_bag
SPECIAL["_fft_r2c"] = SPECIAL["_fft_c2r"] = SPECIAL["_fft_c2c"] = _fft
SPECIAL["cumprod"] = _named(_cumprod)
SPECIAL["logcumsumexp"] = _named(_logcumsumexp)
SPECIAL["linalg_qr"] = _backward_stable("A")
SPECIAL["linalg_inv_ex"] = _backward_stable("A")
SPECIAL["linalg_cholesky_ex"] = _backward_stable("self", symmetric=True)
SPECIAL["linalg_solve_triangular"] = _backward_stable("self")
SPECIAL["_embedding_bag_backward"] = _embedding_bag_grad(("grad", "per_sample_weights"))
SPECIAL["_embedding_bag_per_sample_weights_backward"] = _embedding_bag_grad(("grad", "weight"))
for _name in ("var", "std", "var_mean", "std_mean"):
    SPECIAL[_name] = (lambda n: lambda mode, f, a, k, o: _moments(mode, _bind(f, a, k), o, n))(_name)
