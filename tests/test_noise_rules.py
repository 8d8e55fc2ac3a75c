"""Every fused-op rule of :mod:`shardfuzz.verdict.noise_rules` runs: called once on the very aten call
torch makes for it, it returns its result with noise added, not an exception (the mode falls back
to the elementwise rule when a rule raises, so a rule that always raises was silent: issue 22's
``lerp``)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from shardfuzz.verdict.noise import rounding_noise
from shardfuzz.verdict.noise_rules import SPECIAL


class _Record(TorchDispatchMode):
    """Records the first aten call of every op that has a rule (func, args, kwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
        if base in SPECIAL and base not in self.calls:
            self.calls[base] = (func, args, kwargs)
        return func(*args, **kwargs)


def _every_rule_op() -> dict[str, tuple]:
    torch.manual_seed(0)
    t = lambda *shape: torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    x, w, b = t(3, 4), t(4), t(4)
    q, k, v = t(1, 2, 3, 4), t(1, 2, 3, 4), t(1, 2, 3, 4)
    with _Record() as rec:
        loss = x.softmax(-1).sum() + x.log_softmax(-1).sum() + torch.logsumexp(x, -1).sum()
        loss = loss + F.gelu(x).sum() + F.layer_norm(x, (4,), w, b).sum()
        loss = loss + F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
        idx, offsets, psw = torch.tensor([0, 2, 2, 1]), torch.tensor([0, 1]), t(4)
        loss = loss + F.embedding_bag(idx, x, offsets, mode="sum", per_sample_weights=psw).sum()
        loss.backward()
        F.embedding_bag(idx, x.detach(), offsets, mode="mean")  # no gradient: the forward-only op
        y = x.detach().clone()
        torch.lerp(y, torch.ones_like(y), 0.3)
        y.lerp_(torch.zeros_like(y), torch.full_like(y, 0.25))  # the in-place Tensor-weight form
        x.detach().var(-1), x.detach().std(-1), torch.var_mean(x.detach(), -1), torch.std_mean(x.detach(), -1)
        torch.fft.ifft(torch.fft.irfft2(torch.fft.rfft2(x.detach()), s=(3, 4)).to(torch.complex128))
        x.detach().abs().cumprod(-1), torch.logcumsumexp(x.detach(), -1)
        a = x.detach().T @ x.detach() + torch.eye(4, dtype=torch.float64)  # positive definite
        torch.linalg.qr(x.detach()), torch.linalg.inv(a)
        torch.linalg.solve_triangular(torch.linalg.cholesky(a), x.detach().T, upper=False)
    return rec.calls


def _tensors(out):
    return [t for t in (out if isinstance(out, tuple | list) else [out]) if isinstance(t, torch.Tensor)]


def test_every_noise_rule_runs_and_adds_noise():
    calls = _every_rule_op()
    assert set(calls) == set(SPECIAL), f"no example op for the rules {sorted(set(SPECIAL) - set(calls))}"
    mode = rounding_noise()(2.0**-8, 0, 2)
    for name, (func, args, kwargs) in sorted(calls.items()):
        args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
        out = func(*args, **kwargs)
        clean = [t.clone() for t in _tensors(out)]
        result = SPECIAL[name](mode, func, args, kwargs, out)  # raises if the rule is broken
        got = _tensors(result)
        assert [g.shape for g in got] == [c.shape for c in clean], name
        assert any(not torch.equal(g, c) for g, c in zip(got, clean)), f"rule {name!r} added no noise"


def test_lerp_gets_its_own_rule_not_the_elementwise_one():
    # lerp's error is a rounding of its terms |1 - w| |a| + |w| |end|, not of the result: where
    # a and end cancel to 0 the elementwise rule (one rounding of |result|) gives no noise at all
    a = torch.full((64,), 1.0, dtype=torch.float64)
    with rounding_noise()(2.0**-8, 0, 2):
        out = torch.lerp(a, -a, 0.5)  # exactly 0
    assert float(out.abs().max()) > 0


def test_a_rule_that_does_not_apply_falls_back_and_a_broken_rule_raises():
    import pytest

    from shardfuzz.verdict.noise import _by_rule, _kind, _terms_scales

    mode = rounding_noise()(2.0**-8, 0, 2)
    x = torch.randn(3, dtype=torch.float64)
    func = torch.ops.aten.lerp.Scalar

    def does_not_apply(*_):
        raise KeyError("weight")  # an overload without the argument the rule reads

    def broken(*_):
        raise NameError("torch")  # the lerp bug: must not pass for "does not apply"

    assert _by_rule(mode, does_not_apply, func, (x, x, 0.5), {}, x, []) is None
    with pytest.raises(NameError):
        _by_rule(mode, broken, func, (x, x, 0.5), {}, x, [])
    add = torch.ops.aten.add.Tensor
    refused = ((torch.zeros(3, dtype=torch.long), x.abs()), {})  # an in-place-like refusal by torch
    assert _terms_scales(_kind(add), torch.ops.aten.add_.Tensor, refused, []) is None
    assert _terms_scales(_kind(add), add, ((x.abs(), x.abs()), {}), [])[0].shape == x.shape


def _gelu_forms():
    """GELU as users and libraries write it: (name, approximate, fn). The tanh forms are GPT-2's
    ``NewGELU`` and Megatron's ``bias_gelu``; the sigmoid form is ``x * sigmoid(2 c (x + k x^3))``."""
    import math

    c, k = math.sqrt(2 / math.pi), 0.044715
    return [
        ("erf", "none", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
        ("ndtr", "none", lambda x: x * torch.special.ndtr(x)),
        ("erfc", "none", lambda x: 0.5 * x * torch.erfc(-x / math.sqrt(2))),
        ("F.gelu", "none", F.gelu),
        ("NewGELU", "tanh", lambda x: 0.5 * x * (1.0 + torch.tanh(c * (x + k * torch.pow(x, 3.0))))),
        ("bias_gelu", "tanh", lambda x: x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + k * x * x)))),
        ("sigmoid", "tanh", lambda x: x * torch.sigmoid(2 * c * (x + k * x**3))),
        ("F.gelu tanh", "tanh", lambda x: F.gelu(x, approximate="tanh")),
    ]


def _every_value(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of a 16-bit dtype with 1e-3 <= |x| <= 12 (GELU's range of interest); in
    float32, 400,001 values evenly spaced and 100,001 of each sign spaced evenly in log."""
    if dtype == torch.float32:
        logs = torch.logspace(-3, 1.08, 100_001, dtype=torch.float64)
        return torch.cat([torch.linspace(-12, 12, 400_001, dtype=torch.float64), logs, -logs]).float()
    x = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(dtype)
    a = x.double().abs()
    return x[torch.isfinite(x) & (a >= 1e-3) & (a <= 12)]


def _gelu_rule_units(dtype, approximate, form):
    """The error of ``form`` in ``dtype`` (forward, and the gradient of a random cotangent through
    autograd) per element, in units of the GELU rules' rounding: ``u * scale``, the scale as the
    noise samples draw it (at the perturbation unit, with ``case_u`` the dtype's, full scale so
    that the noise is +-``PERTURBATION_UNIT * scale``). Returns (x, forward units, backward units)."""
    from shardfuzz.spec.tolerance import TINY, UNIT_ROUNDOFF
    from shardfuzz.verdict.noise import PERTURBATION_UNIT

    u = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
    x = _every_value(dtype).requires_grad_()
    # a cotangent of one exact in every dtype and sign (|g| = 1 made the products exact)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    got = form(x)
    (got_grad,) = torch.autograd.grad(got, x, g)
    x64 = x.detach().double().requires_grad_()
    with _Record() as rec:
        ref = F.gelu(x64, approximate=approximate)
        (ref_grad,) = torch.autograd.grad(ref, x64, g.double())
    name = str(dtype).removeprefix("torch.")
    mode = rounding_noise()(PERTURBATION_UNIT, 0, 1, case_u=u, extreme=1.0, case_tiny=TINY[name])
    units = []
    for name, want, have in (("gelu", ref, got), ("gelu_backward", ref_grad, got_grad)):
        func, args, kwargs = rec.calls[name]
        want = want.detach()
        noise = (SPECIAL[name](mode, func, args, kwargs, want.clone()) - want).detach().abs()
        units.append((have.detach().double() - want).abs() / (u * noise / PERTURBATION_UNIT))
    return x.detach().double(), units[0], units[1]


#: |x| regions of GELU where a rule may be no looser than the worst form needs there (both signs);
#: past 4 the 16-bit forms err by little or nothing (Phi rounds to 1, or 1 + erf to 0 and the
#: result into the subnormals), and the rules claim no power there
_GELU_REGIONS = ((1e-3, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0))


def test_gelu_rules_cover_every_way_users_write_gelu_in_16_bits():
    # 4 / sqrt(3) units: what a bound of 4 noises allows one rounding (xi's RMS is 1 / sqrt(3));
    # a form over it is a false finding wherever its GELU dominates an element's noise (a gradient
    # of one token). Before: NewGELU's gradient 2.61 units in bf16 and 4.01 in float16, the sigmoid
    # form's 2.89 and 5.75
    for dtype in (torch.bfloat16, torch.float16):
        for name, approximate, form in _gelu_forms():
            _, forward, backward = _gelu_rule_units(dtype, approximate, form)
            assert forward.max() <= 1.6 and backward.max() <= 1.6, (
                dtype,
                name,
                forward.max(),
                backward.max(),
            )
    # in float32 (allowed: 8 noises, 4.62 units), the hand-written forms (at most 2.0, the sigmoid
    # form's gradient); torch's own float32 kernels err by more, up to 5.6 units forward, which the
    # forward rule keeps |x| for there
    for name, approximate, form in _gelu_forms():
        if not name.startswith("F."):
            _, forward, backward = _gelu_rule_units(torch.float32, approximate, form)
            assert forward.max() <= 2.5 and backward.max() <= 2.5, (name, forward.max(), backward.max())


#: how close the worst form comes to each rule in every region at least (measured: 0.23 forward at
#: 3 <= x < 4 in bf16, 0.51 for the erf rule's gradient, 0.22 for the tanh term's, at -3 < x <= -2)
_GELU_POWER = {
    ("none", "forward"): 0.2,
    ("none", "backward"): 0.45,
    ("tanh", "forward"): 0.2,
    ("tanh", "backward"): 0.2,
}


def test_gelu_rules_are_no_looser_than_the_forms_need_in_any_region():
    # power: in every |x| region and sign, some correct form comes this close to each rule (a rule
    # loosened there, the tanh term on the erf rule included, fails here)
    for dtype in (torch.bfloat16, torch.float16):
        for approximate in ("none", "tanh"):
            runs = [_gelu_rule_units(dtype, a, form) for _, a, form in _gelu_forms() if a == approximate]
            x = runs[0][0]
            for lo, hi in _GELU_REGIONS:
                for sign in (-1, 1):
                    at = (x * sign >= lo) & (x * sign < hi)
                    for which, label in ((1, "forward"), (2, "backward")):
                        worst = max(float(run[which][at].max()) for run in runs)
                        need = _GELU_POWER[approximate, label]
                        assert worst >= need, (dtype, approximate, label, sign * lo, sign * hi, worst)


def test_the_tanh_terms_cancellation_ends_where_tanh_rounds_to_one():
    # 1 - tanh^2 from a tanh rounded to exactly 1 is exactly 0: the term is capped at what is left
    # to cancel (with the case dtype's unit, not the perturbation unit the samples run at)
    from shardfuzz.spec.tolerance import UNIT_ROUNDOFF
    from shardfuzz.verdict.noise import PERTURBATION_UNIT

    # and past what x * x can hold in float64 (inf * 0 would be NaN: no noise at all there)
    x = torch.tensor([-8.0, -6.0, 6.0, 8.0, -1e200, 1e200], dtype=torch.float64)
    g = torch.ones_like(x)
    func = torch.ops.aten.gelu_backward.default
    for dtype in ("bfloat16", "float16"):
        mode = rounding_noise()(PERTURBATION_UNIT, 0, 1, case_u=UNIT_ROUNDOFF[dtype], extreme=1.0)
        scales = []
        for approximate in ("tanh", "none"):
            # torch's own tanh kernel makes a NaN past 1e102 (its x**3 overflows): the rule is checked
            out = func(g, x, approximate=approximate).nan_to_num(0.0)
            noisy = SPECIAL["gelu_backward"](mode, func, (g, x), {"approximate": approximate}, out.clone())
            scales.append((noisy - out).abs())
        # what is left of the term at |x| = 6 and 8 is at most a thousandth of the rest
        assert torch.all(scales[0] <= scales[1] * 1.001), (dtype, scales)
        assert torch.all(scales[0] > 0) and torch.all(scales[1] > 0), (dtype, scales)  # |g| / 2, everywhere


def test_quick_gelu_stands_out_of_the_gelu_rules_in_bf16():
    # x * sigmoid(1.702 x) is up to 0.02 off GELU: in bf16 a few roundings. Before: 2.43 units forward
    _, forward, backward = _gelu_rule_units(torch.bfloat16, "none", lambda x: x * torch.sigmoid(1.702 * x))
    assert forward.max() > 4 / 3**0.5 * 1.5 and backward.max() > 4 / 3**0.5 * 1.5, (
        forward.max(),
        backward.max(),
    )


def test_an_in_place_op_with_a_rule_is_judged_on_its_operand_as_it_was():
    # gelu_ overwrites x with GELU(x): its rule read the result as x, and at x = -3 gave a noise
    # on the scale of |GELU(-3)| = 0.004 where it is |x| / 2 = 1.5 (a review's finding)
    from shardfuzz.verdict.noise import PERTURBATION_UNIT

    x = torch.full((4,), -3.0, dtype=torch.float64)
    spreads = []
    ops = (
        torch.ops.aten.gelu.default,
        torch.ops.aten.gelu_.default,
        lambda a: torch.ops.aten.gelu.out(a, out=a),  # out= onto its own operand (a review's case)
    )
    for op in ops:
        arg = x.clone()
        with rounding_noise()(PERTURBATION_UNIT, 0, 1, case_u=2.0**-8, extreme=1.0):
            got = op(arg)
        spreads.append(((got - F.gelu(x)).abs() / PERTURBATION_UNIT).max().item())
    assert spreads[1:] == pytest.approx([spreads[0]] * 2) and spreads[0] > 1.5, spreads


def test_a_distributed_fft_is_judged_with_the_noise_of_its_sums():
    """Complex results got no noise at all and FFTs one rounding at most: a new user's correct
    float32 rfft2 -> filter -> irfft2, sharded with an all-to-all transpose, failed at 1.1x against
    torch.fft's own float64 transform. Each DFT rounds on the sum of its |terms|: the error of a
    float32 computation of the same now stays within a few noise estimates, in every element."""
    from shardfuzz.verdict.noise import estimate

    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(12):
        rows, cols = 1 + trial % 5, 2 + trial % 7
        x = torch.randn(rows, cols, dtype=torch.float64, generator=gen)
        w = torch.randn(rows, cols // 2 + 1, dtype=torch.float64, generator=gen)

        def oracle(x=x, w=w):
            return {"y": torch.fft.irfft2(torch.fft.rfft2(x.clone()) * w, s=x.shape)}

        ref = oracle()
        noise = estimate(oracle, ref, "float32", trial, 1, 3)["y"]
        assert (noise > 0).all(), (rows, cols)
        y32 = torch.fft.irfft2(torch.fft.rfft2(x.float()) * w.float(), s=x.shape).double()
        worst = max(worst, float(((y32 - ref["y"]).abs() / noise).max()))
    assert worst < 4.0, worst  # the bound allows several times the noise: 2.1 measured


def test_a_tsqr_is_judged_with_the_noise_of_a_backward_stable_qr():
    """linalg_qr got one rounding of its results: a new user's correct TSQR (local QRs, the stacked
    R factors QR'd again) was 1.07x-2.03x past the bound, an ill-conditioned A amplifying another
    algorithm's roundings along other directions. A backward-stable op's noise is the op rerun on
    an input nudged by u times its norm: the float32 TSQR's error stays within a few noises."""
    from shardfuzz.verdict.noise import estimate

    def signed_qr(a):
        q, r = torch.linalg.qr(a)
        d = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(a.dtype)
        return q * d, r * d[:, None]

    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(24):
        rows, n = 4 + trial % 9, 1 + trial % 4
        u, _ = torch.linalg.qr(torch.randn(rows, n, dtype=torch.float64, generator=gen))
        v, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=gen))
        a = u @ torch.diag(torch.logspace(0, -(trial % 4), n, dtype=torch.float64)) @ v  # cond to 1e3

        def oracle(a=a):
            q, r = signed_qr(a.clone())
            return {"q": q, "r": r}

        ref = oracle()
        noise = estimate(oracle, ref, "float32", trial, 1, 3)
        half = rows // 2  # TSQR on two blocks, in float32
        (q1, r1), (q2, r2) = torch.linalg.qr(a[:half].float()), torch.linalg.qr(a[half:].float())
        q12, r = torch.linalg.qr(torch.cat([r1, r2]))
        q = torch.cat([q1 @ q12[: r1.shape[0]], q2 @ q12[r1.shape[0] :]])
        d = torch.where(torch.diagonal(r) < 0, -1.0, 1.0)
        for name, got in (("q", q * d), ("r", r * d[:, None])):
            floor = 2 * 2.0**-24 * ref[name].pow(2).mean().sqrt()  # the bound's 2 u scale
            worst = max(worst, float(((got.double() - ref[name]).abs() / (noise[name] + floor)).max()))

    assert worst < 8.0, worst  # float32's bound allows 8 noises: 4.8 measured
