"""Every fused-op rule of :mod:`shardfuzz.verdict.noise_rules` runs: called once on the very aten call
torch makes for it, it returns its result with noise added, not an exception (the mode falls back
to the elementwise rule when a rule raises, so a rule that always raises was silent: issue 22's
``lerp``)."""

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
        loss.backward()
        y = x.detach().clone()
        torch.lerp(y, torch.ones_like(y), 0.3)
        y.lerp_(torch.zeros_like(y), torch.full_like(y, 0.25))  # the in-place Tensor-weight form
        x.detach().var(-1), x.detach().std(-1), torch.var_mean(x.detach(), -1), torch.std_mean(x.detach(), -1)
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
