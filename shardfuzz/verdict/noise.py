"""The rounding-noise model: how far a correct implementation in the case dtype may land from the
float64 oracle, per output element, estimated by Monte Carlo arithmetic on the oracle itself.

The oracle runs ``samples`` more times in float64 under :class:`RoundingNoise`, a
``TorchDispatchMode`` that adds to each floating result a random error of the size a rounding in the
case dtype could make there, ``u * (scale + tiny) * xi`` with ``xi`` uniform in [-1, 1] and
``tiny`` the case dtype's smallest normal (a result that underflows into the subnormals errs by up
to ``u * tiny`` whatever its size: a float16 partial sum that rounds to 0):

* an elementwise op: ``scale = |result|`` (one rounding);
* a sum-like op (sum, mean, matmul, add, sub, addcmul, ...): ``scale`` is the op on the absolute
  values of its operands, i.e. the sum of the |terms|, not of the result. A sharded implementation
  rounds partial sums, each bounded by that, in another order, so cancellation is covered. Real
  reductions (sum, mean, matmul, ...) are scaled by ``sqrt(W + 1)`` more: ``W`` partial sums and an
  all-reduce may each round;
* fused ops (softmax, log-softmax, logsumexp, var/std, layer norm and its backward, scaled-dot-
  product attention and its backward) have rules of their own in :mod:`shardfuzz.verdict.noise_rules`;
  a rule may ask for the |terms| behind an operand (``terms_of``: kept, weakly, for the results of
  sum-like ops and their views), e.g. softmax's backward, whose row sum a flash-style
  implementation forms from the forward output;
* data movement and exact ops (views, copies, indexing, max, where, collectives, ...) are left alone;
* any other op that is not elementwise (torch does not tag it ``pointwise``: batch norm and its
  backward, group norm's backward, ``mse_loss``, ...) runs as torch's own decomposition
  (``torch._decomp``) under the mode, so that each op it is made of gets its rounding (and its rule):
  one rounding of the whole result would miss a cancellation inside it. Only an op with no
  decomposition either is taken as one rounding of its result, as an elementwise op is.

The perturbations propagate through the rest of the computation, backward included, so the
spread of the ``samples`` results around the unperturbed float64 result (their root mean square)
estimates the noise of each output element. Every draw is seeded from the case, so a verdict is
the same on every run and on replay. The perturbations are applied at ``PERTURBATION_UNIT``
(2^-30) and the spread is scaled back to the case dtype's unit roundoff, valid to first order:
2^-53 would round away in float64 arithmetic, and a bf16-sized kick can overflow an ``exp``. Where
it can be wrong: an implementation that rounds far more often than the oracle's ops (e.g. a long
sequential sum in low precision, or a blockwise algorithm whose intermediates dwarf the result) --
the tolerance's floor (:class:`shardfuzz.Tolerance`) and the case-dtype rerun cover part of that.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

from shardfuzz.errors import NoiseModelRefusal, TargetCodeError
from shardfuzz.spec.decisions import inside_decision
from shardfuzz.spec.tolerance import TINY, UNIT_ROUNDOFF
from shardfuzz.verdict.noise_rules import EXACT, REDUCTIONS, SPECIAL, SUM_LIKE

#: every case perturbs at this unit and scales the spread back to its dtype's (first order): small
#: enough to stay linear (a bf16-sized kick to a log-probability of -1e8 could overflow exp),
#: large enough that float64 arithmetic does not round it away (2^-53 would)
PERTURBATION_UNIT = 2.0**-30
#: full-scale samples draw from seeds this far from the first-order ones
FULL_SCALE_SEEDS = 1_000


@dataclasses.dataclass(frozen=True)
class OpKind:
    """What the mode does with one aten overload (worked out once per overload)."""

    base: str  # the packet name without a trailing "_"
    skip: bool  # exact, a view, or not an aten op
    written: tuple[tuple[int, str], ...]  # (position, name) of the arguments written in place
    sum_like: bool
    reduction: bool
    rule: Callable[..., Any] | None
    #: torch's own decomposition of an op with no rule here that is not elementwise (batch norm and
    #: its backward, group norm's backward, mse_loss, ...): run in its place under the mode, so each
    #: op inside gets its own rounding (one rounding of the whole result would miss a cancellation
    #: inside it: a correct SyncBatchNorm's grad_x, whose terms cancel, was reported at 3.6x)
    decompose: Callable[..., Any] | None = None
    #: neither exact, elementwise, a sum nor ruled: it gets one rounding of its result unless
    #: its decomposition runs, which underrates a cancellation inside it (reports name such ops)
    unmodelled: bool = False


_KINDS: dict[Any, OpKind] = {}


def _kind(func: Any) -> OpKind:
    kind = _KINDS.get(func)
    if kind is None:
        schema = getattr(func, "_schema", None)
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
        base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
        view = schema is None or any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        written = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments if schema is not None else ())
            if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
        ) + tuple(
            (-1, a.name)
            for a in (schema.arguments if schema is not None else ())
            if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only
        )
        # a collective is data movement (a self-oracle runs one rank), and an async one writes later
        comm = "c10d" in getattr(func, "namespace", "")
        skip, rule = base in EXACT or view or comm, SPECIAL.get(base)
        known = skip or rule is not None or base in SUM_LIKE or base in REDUCTIONS
        elementwise = torch.Tag.pointwise in getattr(func, "tags", ())
        kind = OpKind(
            base,
            skip,
            written,
            base in SUM_LIKE,
            base in REDUCTIONS,
            rule,
            None if known or elementwise else decomposition_table.get(func),
            not (known or elementwise),
        )
        _KINDS[func] = kind
    return kind


class NoiseDraws:
    """The draws of :class:`RoundingNoise`: its units, its seeded generator, the |terms| it keeps
    for the rules, and the noise it adds."""

    def __init__(
        self,
        u: float,
        seed: int,
        group_size: int,
        case_u: float | None = None,
        extreme: float = 0.0,
        case_tiny: float = 0.0,
    ) -> None:
        super().__init__()
        self.u = u
        #: the case dtype's smallest normal: a rounding there errs by up to ``u * (|x| + tiny)``,
        #: the second term where a result underflows into the subnormals (a float16 gradient's
        #: per-rank partial that rounds to 0 where the whole sum does not)
        self.tiny = case_tiny
        #: 0: xi uniform in [-1, 1]; +1 or -1: xi = +-1 (a full-scale sample, see :func:`estimate`),
        #: the signs of the draws multiplied by ``extreme``, so a pair of samples with the same seed
        #: and opposite ``extreme`` pushes every rounding both ways
        self.extreme = extreme
        self.reduction_u = u * math.sqrt(group_size + 1)
        #: the case dtype's unit roundoff (``u`` is the perturbation unit, scaled back later)
        self.case_u = case_u or u
        #: softmax statistics (max, logsumexp) are kept in float32 at least, as every fused
        #: attention and cross-entropy kernel does: their rounding over a rounding in the case dtype
        self.stat_ratio = min(1.0, UNIT_ROUNDOFF["float32"] / self.case_u)
        self.gen = torch.Generator().manual_seed(seed)
        #: the ops of this run that got one rounding of their result (:attr:`OpKind.unmodelled`)
        self.unmodelled: set[str] = set()
        #: id -> (weak reference, |terms|) of matmul-like results and their views, for rules
        #: that need the terms behind an operand (:meth:`terms_of`); nothing keeps a result alive
        self._terms: dict[int, tuple[Any, torch.Tensor]] = {}
        #: a softmax written by hand (:meth:`normalized`): id -> (weak reference, |terms| of its
        #: argument) of ``exp`` results, and id -> (weak reference, weak reference to that ``exp``
        #: result) of their sums and of what is computed from a sum alone (a clamp, an epsilon)
        self._exps: dict[int, tuple[Any, torch.Tensor]] = {}
        self._sums: dict[int, tuple[Any, Any]] = {}
        #: max/amax results (and their views) that gradients flow through, the differences taken
        #: from one, and the exps of those: a hand-written softmax whose max is not detached
        #: (:meth:`normalized` refuses it, see :data:`LIVE_MAX_SOFTMAX`)
        self._maxes: dict[int, tuple[Any, None]] = {}
        self._live_shifts: dict[int, tuple[Any, None]] = {}
        #: only in a sample run again after the oracle raised under the perturbation
        #: (:func:`estimate`): id -> (weak reference, its unperturbed value) of every result, which
        #: the integer conversions (:func:`_to_integer`) read instead (:meth:`RoundingNoise.shadowed`)
        self.shadow: dict[int, tuple[Any, Any]] | None = None

    def terms_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The |terms| behind ``t`` if a sum-like op (or a view of one) made it, else None."""
        entry = self._terms.get(id(t))
        if entry is None or entry[0]() is not t or entry[1].shape != t.shape:
            return None
        return entry[1]

    def remember(self, t: Any, terms: Any) -> None:
        """Keep ``terms`` as the |terms| behind ``t`` while ``t`` lives (see :meth:`terms_of`)."""
        if isinstance(t, torch.Tensor) and isinstance(terms, torch.Tensor) and terms.shape == t.shape:
            self._keep(self._terms, t, terms)

    def _keep(self, table: dict[int, tuple[Any, Any]], t: torch.Tensor, value: Any) -> None:
        """``table[id(t)] = (a weak reference to t, value)``, dropped when ``t`` dies."""
        key = id(t)

        def forget(_: Any, k: int = key) -> None:
            table.pop(k, None)

        table[key] = (weakref.ref(t, forget), value)

    def note_hand_softmax(self, base: str, args: tuple, result: Any) -> None:
        """Follow a softmax written by hand: ``exp`` of a difference with |terms|, its sum, and what
        is computed from that sum alone, elementwise (``clamp_min``, ``+ eps``) or as a view."""
        if not (args and isinstance(args[0], torch.Tensor) and isinstance(result, torch.Tensor)):
            return
        first = args[0]
        if base == "exp":
            terms = self.terms_of(first)
            if terms is not None:
                self._keep(self._exps, result, terms)
            if self._held(self._live_shifts, first):
                self._keep(self._live_shifts, result, None)
            return
        entry = self._exps.get(id(first))
        if base == "sum" and entry is not None and entry[0]() is first:
            self._keep(self._sums, result, weakref.ref(first))
            return
        entry = self._sums.get(id(first))
        if entry is not None and entry[0]() is first and base != "div":
            others = [a for a in args[1:] if isinstance(a, torch.Tensor) and a.dim() > 0]
            if not others and (base in _SHAPE_OPS or result.dim() == first.dim()):  # of the sum alone
                self._keep(self._sums, result, entry[1])

    def _held(self, table: dict[int, tuple[Any, Any]], t: Any) -> bool:
        entry = table.get(id(t))
        return entry is not None and entry[0]() is t

    def note_max(self, args: tuple, out: Any) -> None:
        """Keep a max/amax of a tensor that gradients flow through (its values, for ``max.dim``;
        below autograd the result itself does not require grad yet)."""
        values = out[0] if isinstance(out, (tuple, list)) and out else out
        if args and getattr(args[0], "requires_grad", False) and isinstance(values, torch.Tensor):
            self._keep(self._maxes, values, None)

    def note_view(self, base: str, arg: Any, out: Any) -> None:
        """A view of a kept max is one too (``values[..., None]``); a detached one is not."""
        if base != "detach" and isinstance(out, torch.Tensor) and self._held(self._maxes, arg):
            self._keep(self._maxes, out, None)

    def note_shift(self, args: tuple, result: Any) -> None:
        """``x - m`` (or ``x + (-m)``, in place too) with ``m`` a kept max still attached to the
        graph: the difference a hand-written softmax takes exp of."""
        if len(args) < 2 or not isinstance(result, torch.Tensor):
            return
        if any(self._held(self._maxes, m) and getattr(m, "requires_grad", False) for m in args[:2]):
            self._keep(self._live_shifts, result, None)

    def normalized(self, args: tuple, result: Any) -> Any:
        """``e / sum(e)`` after ``e = exp(x - m)``: a softmax written by hand. Its rows cancel the
        roundings of ``e``'s leading term (``e_k / sum`` stays 1 where one term dominates), where
        an implementation that takes ``exp(x - lse)`` from a stored logsumexp does not (a flash
        kernel's backward recomputes the scores): the row error of :func:`torch.softmax`'s rule,
        on the scale of ``|m|`` (here the least |terms| of the row's finite ``x - m``, between
        ``|m|`` and ``2 |m|``), so the oracle's own softmax is judged as ``torch.softmax`` is."""
        if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
            return result
        num, den = args[0], args[1]
        entry = self._sums.get(id(den))
        if (
            entry is None
            or entry[0]() is not den
            or entry[1]() is not num
            or not isinstance(result, torch.Tensor)
        ):
            return result
        if self._held(self._live_shifts, num):
            raise NoiseModelRefusal(LIVE_MAX_SOFTMAX)
        if not _perturbable(result):  # empty: its exp was never tagged (an empty op keeps no terms)
            return result
        terms = self._exps[id(num)][1]
        lead = num.dim() - den.dim()
        dims = [d for d in range(num.dim()) if d < lead or (den.shape[d - lead] == 1 and num.shape[d] > 1)]
        finite = torch.where(torch.isfinite(terms), terms, torch.full_like(terms, math.inf))
        row = finite.amin(dims, keepdim=True).nan_to_num(0.0, 0.0, 0.0) if dims else terms
        return result + result * self.noise(torch.nan_to_num(row, 0.0, 0.0, 0.0) * self.stat_ratio)

    def xi(self, like: torch.Tensor, u: float) -> torch.Tensor:
        """Uniform in [-u, u] (or +-u, see ``extreme``), shaped like ``like`` (drawn on the CPU
        generator)."""
        r = torch.empty(like.shape, dtype=torch.float64).uniform_(-u, u, generator=self.gen)
        if self.extreme:
            r = torch.where(r >= 0, u * self.extreme, -u * self.extreme)
        return r if like.device.type == "cpu" else r.to(like.device)

    def noise(self, scale: torch.Tensor, u: float | None = None) -> torch.Tensor:
        """``u * (|scale| + tiny) * xi``, xi uniform in [-1, 1] (symmetric: the sign of ``scale``
        does not matter); no noise where the scale is not finite (an infinite term: the result is
        infinite too, and inf - inf would make a NaN)."""
        scale = torch.nan_to_num(scale.double(), 0.0, 0.0, 0.0)
        xi = self.xi(scale, self.u if u is None else u)
        if not self.tiny:
            return scale * xi
        return (scale.abs() * xi).add_(xi * (scale != 0), alpha=self.tiny)  # see perturb

    def perturb(self, t: torch.Tensor, scale: torch.Tensor | None, u: float) -> torch.Tensor:
        """``t`` plus noise of ``scale`` and of an underflow where it is not 0 (``None``: one
        rounding of ``t`` itself, ``t * (1 + xi) + tiny * xi``, which keeps an infinity infinite)."""
        xi = self.xi(t, u)
        if t.is_complex():  # its real and imaginary parts round each on their own
            xi = torch.complex(xi, self.xi(t, u))
        if scale is None:
            out, nonzero = t * (1 + xi), t
        else:
            scale = torch.nan_to_num(scale, 0.0, 0.0, 0.0)
            out, nonzero = torch.addcmul(t, scale, xi), scale
        # an exact 0 (a product by 0, a sum over no terms) is computed exactly in any dtype: no
        # underflow to model, and a kick there flipped a relu'(0) downstream into a huge spread
        return out.add_(xi * (nonzero != 0), alpha=self.tiny) if self.tiny else out


#: a hand-written softmax in the oracle whose max gradients flow through: autograd sends each row's
#: gradient back through the max too, which cancels the row's sum exactly in every noise sample,
#: where a softmax kernel's backward rounds it (``y * (g - dot)``): the bound of a gradient that
#: depends on that sum (a key bias's: 1.1x to 3,400x for torch.softmax in float32, a new user's
#: attention) is then too tight for a correct implementation. Detached, the gradients are the same
LIVE_MAX_SOFTMAX = (
    "the oracle computes a softmax by hand, exp(x - m) / sum, with a max m that gradients flow "
    "through: each row's gradient then also flows back through m, which cancels its sum exactly, "
    "where torch.softmax's (and every softmax kernel's) backward rounds it, so the bound on a "
    "correct implementation's gradients would be too tight (a false finding). Detach the max, "
    "x - x.amax(dim, keepdim=True).detach() (the gradients are the same: softmax does not change "
    "when m does), or call torch.softmax in the oracle"
)


class RoundingNoise(NoiseDraws, TorchDispatchMode):
    """Adds a case-dtype-sized random rounding error to every float64 op result (see the module)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # no torch.compile runs under this mode: without this, torch wraps __torch_dispatch__
        # in its dynamo ``disable`` wrapper, paid on every op of every noise sample
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if inside_decision():  # the oracle's and the ranks' one decision function: exact on both sides
            return func(*args, **kwargs)
        if self.shadow is not None:
            return self.shadowed(func, args, kwargs)
        return self.perturbed(func, args, kwargs)

    def shadowed(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The op as :meth:`perturbed` runs it, and again on the unperturbed values of its operands
        (kept in :attr:`shadow`); an integer conversion (a ``ceil``, a cast to ``long``) gives the
        unperturbed one's result: the noise model leaves discrete decisions alone, and a position
        ``q * (n - 1)`` pushed past ``n - 1`` indexed out of range (``torch.quantile`` at q = 1)."""
        clean_args, clean_kwargs = self._clean(args), self._clean(kwargs)
        kind = _kind(func)
        for i, _ in kind.written:  # the unperturbed run writes into copies of its own
            if 0 <= i < len(clean_args) and clean_args[i] is args[i] and isinstance(args[i], torch.Tensor):
                clean_args = (*clean_args[:i], args[i].clone(), *clean_args[i + 1 :])
        clean = func(*clean_args, **clean_kwargs)
        if _to_integer(kind, args, kwargs):
            for t, c in zip(_written(kind, args, kwargs), _flat(clean)):  # in place: what it wrote
                t.copy_(c)
            out = args[0] if kind.written else clean
        else:
            out = self.perturbed(func, args, kwargs)
        for t, c in zip(_flat(out), _flat(clean)):
            if isinstance(t, torch.Tensor) and isinstance(c, torch.Tensor):
                self.shadow[id(t)] = (weakref.ref(t), c)  # type: ignore[index]
        return out

    def _clean(self, x: Any) -> Any:
        """``x`` with each tensor the mode has an unperturbed value of replaced by that value."""
        if isinstance(x, torch.Tensor):
            entry = self.shadow.get(id(x)) if self.shadow is not None else None
            return entry[1] if entry is not None and entry[0]() is x else x
        if isinstance(x, (tuple, list)):
            return type(x)(self._clean(v) for v in x)
        if isinstance(x, dict):
            return {k: self._clean(v) for k, v in x.items()}
        return x

    def perturbed(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The op with its rounding (see the module)."""
        kind = _kind(func)
        if kind.skip or not _has_float64(args, kwargs):
            return _exact_op(self, kind, func, args, kwargs)
        if kind.decompose is not None:
            with self:  # the ops it is made of come back through this mode, each with its rounding
                decomposed = kind.decompose(*args, **kwargs)
            # a decomposition declines some calls (NotImplemented, as FakeTensor reads it): the op
            # then runs whole below, with one rounding
            if decomposed is not NotImplemented:
                return decomposed
        if kind.unmodelled:  # no decomposition, or it declined the call: one rounding below
            self.unmodelled.add(kind.base)
        absolute = _absolute(kind.base, args, kwargs) if kind.sum_like else None  # copies: before the op
        written = _written(kind, args, kwargs)
        rule_args = _before_written(written, args) if kind.rule is not None and written else args
        out = func(*args, **kwargs)
        u = self.reduction_u if kind.reduction else self.u
        if kind.rule is not None:
            result = _by_rule(self, kind.rule, func, rule_args, kwargs, out, written)
            if result is not None:
                return result
        scales = _terms_scales(kind, func, absolute, written)
        carried = _carried_terms(self, func, kind.base, args, kwargs) if kind.base in _CARRY_OPS else None
        if written:  # in place: perturb what was written (the result aliases it)
            for t in written:  # its old |terms| are stale now
                self._terms.pop(id(t), None)
            _perturb_written(self, written, scales, u)
            self._follow(kind.base, args, written[0], list(zip(written, scales or ())), carried)
            return out
        result = _perturb_result(self, out, scales, u)
        self._follow(kind.base, args, result, [], carried)
        if kind.base in _HAND_SOFTMAX_OPS or (self._sums and args and id(args[0]) in self._sums):
            if kind.base == "div":
                result = self.normalized(args, result)
            self.note_hand_softmax(kind.base, args, result)
        return result

    def _follow(self, base: str, args: tuple, result: Any, kept: list, carried: Any) -> None:
        """What rules and checks read later: the |terms| of what an in-place op wrote (``kept``),
        those an operand carried through (``carried``), and a shift by a live max (``t.sub_(m)``,
        ``x + (-m)``, ``(x - m) / temperature``)."""
        for t, terms in kept:
            self.remember(t, terms)
        if carried is not None:
            self.remember(result, carried)
        if base in ("sub", "add") and self._maxes:
            self.note_shift(args, result)
        elif base in ("mul", "div") and args and self._held(self._live_shifts, args[0]):
            self._keep(self._live_shifts, result, None)


#: ops that turn a float into an integer (or an integer-valued float): discrete decisions
_ROUNDING = frozenset({"floor", "ceil", "round", "trunc"})


def _to_integer(kind: OpKind, args: tuple, kwargs: dict) -> bool:
    """Whether the op turns floats into integers: a rounding, or a cast to an integer dtype."""
    if kind.base in _ROUNDING:
        return True
    if kind.base in ("_to_copy", "to"):
        dtype = kwargs.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
        return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)
    return False


def rounding_noise() -> type[RoundingNoise]:
    """The ``TorchDispatchMode`` class of the noise model (:class:`RoundingNoise`)."""
    return RoundingNoise


#: what a rule of :data:`~shardfuzz.verdict.noise_rules.SPECIAL` raises on a call it was not written for:
#: an argument the overload does not have (KeyError), an operand of another rank or shape than the
#: rule expects (IndexError, RuntimeError: torch's shape errors), None where it expects a tensor
#: (TypeError), a dim it cannot take (ValueError). Anything else (NameError, AttributeError, ...)
#: is a bug in the rule and propagates: a blind ``except`` here hid the ``lerp`` rule's NameError.
RULE_DOES_NOT_APPLY = (KeyError, IndexError, TypeError, ValueError, RuntimeError)
#: what the |terms| run of a sum-like op raises where it is not defined (torch refuses the
#: absolute operands, e.g. an in-place op whose result type cannot hold them): one rounding instead
TERMS_UNDEFINED = (RuntimeError, TypeError)


def _exact_op(mode: Any, kind: OpKind, func: Any, args: tuple, kwargs: dict) -> Any:
    """An op left alone; a view or copy of a result with |terms| keeps them (``terms_of``), and
    of a hand-written softmax's sum stays one (:meth:`NoiseDraws.note_hand_softmax`)."""
    if kind.written and mode._terms:  # an in-place copy or fill: the old |terms| are stale
        for t in _written(kind, args, kwargs):
            mode._terms.pop(id(t), None)
    out = func(*args, **kwargs)
    if kind.base in _SAME_TERMS and args and not kind.written and mode.terms_of(args[0]) is not None:
        mode.remember(out, mode.terms_of(args[0]))  # -(a @ b): a sub's backward negates
    if kind.base in ("max", "amax"):
        mode.note_max(args, out)
    elif kind.base in _MAX_VIEWS and args and mode._maxes:
        mode.note_view(kind.base, args[0], out)
    if kind.base in _SHAPE_OPS and args and mode._held(mode._live_shifts, args[0]):
        mode._keep(mode._live_shifts, out, None)  # (x - m).reshape(...), a shift on a transposed view
    if kind.base in _SHAPE_OPS and args and mode.terms_of(args[0]) is not None:
        mode.remember(out, func(mode.terms_of(args[0]), *args[1:], **kwargs))
    elif kind.base in _MOVE_OPS and mode._terms:
        carried = _carried_terms(mode, func, kind.base, args, kwargs)
        if carried is not None:
            mode.remember(out, carried)
    if mode._sums and args and id(args[0]) in mode._sums:
        mode.note_hand_softmax(kind.base, args, out)
    return out


#: the ops a softmax written by hand is made of (:meth:`NoiseDraws.note_hand_softmax`)
_HAND_SOFTMAX_OPS = frozenset({"exp", "sum", "div"})


def _by_rule(
    mode: Any, rule: Callable[..., Any], func: Any, args: tuple, kwargs: dict, out: Any, written: list
) -> Any:
    """The result with the rule's noise (written back for an in-place op), or None where the rule
    does not apply (the elementwise rule follows)."""
    try:
        result = rule(mode, func, args, kwargs, out)
    except RULE_DOES_NOT_APPLY:  # a call the rule does not know: fall back to the elementwise rule
        return None
    if result is None:
        return None
    for t, r in zip(written, _flat(result)):  # in place: write the noise back
        t.copy_(r)
    return out if written else result


def _terms_scales(
    kind: OpKind, func: Any, absolute: tuple[tuple, dict] | None, written: list
) -> list[Any] | None:
    """The |terms| of each result of a sum-like op (the op on absolute operands), or None."""
    if absolute is None:
        return None
    abs_args, abs_kwargs = absolute
    try:
        abs_out = _op_for_abs(func, kind.base)(*abs_args, **abs_kwargs)
    except TERMS_UNDEFINED:  # the |terms| run is not defined here: one rounding of the result
        return None
    return _written(kind, abs_args, abs_kwargs) if written else _flat(abs_out)


def _perturb_written(mode: Any, written: list[Any], scales: list[Any] | None, u: float) -> None:
    """Perturb in place what an in-place or ``out=`` op wrote."""
    for i, t in enumerate(written):
        if _perturbable(t):
            t.copy_(mode.perturb(t, scales[i] if scales is not None else None, u))


def _perturb_result(mode: Any, out: Any, scales: list[Any] | None, u: float) -> Any:
    """``out`` (a tensor, or a tuple or list of them) with a rounding of each floating result."""
    if isinstance(out, torch.Tensor):
        if not _perturbable(out):
            return out
        result = mode.perturb(out, scales[0] if scales else None, u)
        if scales:
            mode.remember(result, scales[0])
        return result
    if not isinstance(out, (tuple, list)):
        return out
    flat = list(out)
    for i, t in enumerate(flat):
        if _perturbable(t):
            flat[i] = mode.perturb(t, scales[i] if scales is not None and i < len(scales) else None, u)
    return type(out)(flat) if isinstance(out, list) else tuple(flat)


#: views and copies that keep each element's |terms| where they are (followed by ``terms_of``)
_SHAPE_OPS = frozenset(
    """view _unsafe_view reshape permute transpose t expand squeeze unsqueeze clone contiguous alias
    detach slice select unflatten flatten""".split()
)


#: elementwise ops that keep each element's |terms| as they are (a sign, a copy in another dtype)
_SAME_TERMS = frozenset({"neg", "abs", "_to_copy"})
#: views of a max (and its negation, ``x + (-m)``) that are the max for :meth:`NoiseDraws.note_shift`
_MAX_VIEWS = _SHAPE_OPS | {"neg"}
#: data movement and selection: each element's |terms| go where the element goes
_MOVE_OPS = frozenset(
    """gather scatter index_select index cat stack select_backward slice_backward slice_scatter
    select_scatter where masked_fill constant_pad_nd repeat flip roll""".split()
)
#: sums into places (a gather's backward is a scatter_add into zeros), and products and quotients:
#: the |terms| an operand carries go with it, scaled. Where a gradient cancels before a gather's
#: backward (top-k gates renormalised: ``g / g.sum()``), the softmax backward behind it otherwise
#: saw only the small result, where a softmax over the chosen logits alone (Megatron's form)
#: cancels inside its own backward and rounds on the scale of the terms (a false finding of 2.99x)
_CARRY_OPS = frozenset("scatter_add index_add index_put _index_put_impl _unsafe_index_put mul div".split())


def _carried_terms(mode: Any, func: Any, base: str, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The op run on each floating operand's |terms| where it has them (else its absolute value),
    or None where no operand has any (a divisor's own terms do not count: they would shrink it)."""
    carriers = args[:1] if base == "div" else (*args, *kwargs.values())
    if not any(isinstance(t, torch.Tensor) and mode.terms_of(t) is not None for t in _flat(carriers)):
        return None  # the common case, before any copy is made
    scaling = base in ("mul", "div")  # every number is a factor there (elsewhere an int is a dim)

    def terms(x: Any, divisor: bool = False) -> Any:
        if isinstance(x, torch.Tensor):
            if not x.is_floating_point():
                return x.abs() if scaling and x.dtype != torch.bool else x
            t = None if divisor else mode.terms_of(x)
            if t is None:
                return x.abs()
            return t.clone()  # an in-place op writes into its first operand
        if isinstance(x, float) or (scaling and isinstance(x, int) and not isinstance(x, bool)):
            return abs(x)
        if isinstance(x, (list, tuple)):
            return type(x)(terms(v) for v in x)
        return x

    new_args = tuple(terms(a, divisor=base == "div" and i > 0) for i, a in enumerate(args))
    new_kwargs = {k: terms(v) for k, v in kwargs.items()}
    inplace = func.overloadpacket.__name__.endswith("_")
    # what the op writes is a copy, never the oracle's own tensor (an integer one is passed as is)
    if inplace and new_args and new_args[0] is args[0] and isinstance(args[0], torch.Tensor):
        new_args = (args[0].clone(), *new_args[1:])
    new_kwargs = {
        k: v.clone() if v is kwargs[k] and isinstance(v, torch.Tensor) else v for k, v in new_kwargs.items()
    }
    try:
        out = func(*new_args, **new_kwargs)
    except TERMS_UNDEFINED:  # not defined on the absolute operands: the terms stop here
        return None
    out = new_args[0] if inplace else out
    # a negative int operand (a fill value, an alpha) passes through as it is: |terms| are >= 0
    return out.abs() if isinstance(out, torch.Tensor) and out.is_floating_point() else None


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in (_flat(item) if isinstance(item, (tuple, list)) else [item])]
    return [x]


#: the oracle's dtypes whose op results the mode perturbs: float64 and the complex numbers made of it
#: (an FFT's: without them a new user's correct distributed FFT was 1.1x past a bound of 0 noise)
_PERTURBED = (torch.float64, torch.complex128)


def _perturbable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in _PERTURBED and t.numel() > 0


def _has_float64(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.dtype in _PERTURBED:
                return True
        elif isinstance(a, (tuple, list)) and any(
            isinstance(t, torch.Tensor) and t.dtype in _PERTURBED for t in a
        ):
            return True
    return False


def _before_written(written: list[Any], args: tuple) -> tuple:
    """``args`` with copies, taken before the op, of every tensor operand that shares storage with
    ``written``, what the op writes (``gelu_``'s x, ``gelu.out(x, out=x)``'s, ``x.lerp_(x, w)``'s end): its rule
    reads the operand as it was (``gelu_``'s rule read the overwritten x: 250 times too little noise
    at x = -3). Copies have new ids, so a rule that looks an operand's |terms| up (``terms_of``)
    finds none for them: no in-place rule does; ``lerp_`` pays a copy its rule does not read."""
    storages = {t.untyped_storage().data_ptr() for t in written}
    return tuple(
        a.clone() if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in storages else a
        for a in args
    )


def _written(kind: OpKind, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors an in-place or ``out=`` op writes to (flattened)."""
    found: list[Any] = []
    for i, name in kind.written:
        value = args[i] if 0 <= i < len(args) else kwargs.get(name)
        found.extend(t for t in _flat(value) if isinstance(t, torch.Tensor))
    return found


def _absolute(base: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Operands for the |terms| run: floating tensors and numeric scalars by absolute value (copies)."""

    def a(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.abs() if x.is_floating_point() else x
        if isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool) and base in _SCALED):
            return abs(x)  # alpha, beta, value (int dims, e.g. -1, stay as they are)
        if isinstance(x, (list, tuple)):
            return type(x)(a(v) for v in x)
        return x

    new_args = tuple(a(v) for v in args)
    # a scale factor passed by name is one whatever the op (index_add's alpha=-1)
    new_kwargs = {
        k: abs(v) if k in _FACTORS and isinstance(v, (int, float)) else a(v) for k, v in kwargs.items()
    }
    if base == "rsub" and len(new_args) >= 2:  # other - alpha * self: the same terms as add
        new_args = (new_args[1], new_args[0], *new_args[2:])
    return tuple(new_args), dict(new_kwargs)


#: keyword arguments that are scale factors in every op that takes them
_FACTORS = frozenset({"alpha", "beta", "value"})
#: sum-like ops whose int arguments are all scale factors (alpha, beta, value), none a dim
_SCALED = frozenset(
    """add sub rsub addcmul addcdiv addmm addmv addr baddbmm addbmm _foreach_add _foreach_sub
    _foreach_addcmul _foreach_addcdiv""".split()
)


def _op_for_abs(func: Any, base: str) -> Callable[..., Any]:
    """``sub`` and ``rsub`` add their |terms|; every other sum-like op is its own |terms| op."""
    if base not in ("sub", "rsub"):
        return func
    inplace = func.overloadpacket.__name__.endswith("_")
    packet = getattr(torch.ops.aten, "add_" if inplace else "add")
    overload = func._overloadname if func._overloadname in packet.overloads() else "Tensor"
    return getattr(packet, overload)


# -- the estimate ---------------------------------------------------------------------------------
def unit_for(dtype: str) -> tuple[float, float]:
    """(perturbation unit, factor back to the case dtype's unit roundoff): every dtype perturbs at
    ``PERTURBATION_UNIT`` and scales the spread back (first order)."""
    return PERTURBATION_UNIT, UNIT_ROUNDOFF[dtype] / PERTURBATION_UNIT


def sample_seed(case_seed: int, sample: int) -> int:
    return (int(case_seed) * 1_000_003 + 7919 * (sample + 1)) % (2**63 - 1)


def estimate(
    run_oracle: Callable[[], dict[str, Any]],
    ref: dict[str, Any],
    dtype: str,
    seed: int,
    group_size: int,
    samples: int,
    first: int = 0,
    full_scale: bool = False,
    seen: set[str] | None = None,
    flips: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Per floating output of ``ref``: the root mean square over ``samples`` perturbed float64
    runs of ``run_oracle()`` (fresh inputs each time) of their distance to ``ref``, in the case
    dtype's units. A non-finite sample element (an overflow the perturbation caused) counts 0.
    ``first``: the index of the first sample (its seed); ``full_scale``: perturb at the case
    dtype's own unit, not to first order, to see a rounding that flips a sign or a branch (an
    AdamW update is ``lr * sign(g)`` where g cancels). Full-scale samples come in antithetic pairs
    of extreme draws: one seed, every xi = +-1 and then its negation, so each rounding is pushed
    as far as it goes both ways, and a flip within reach is seen by one of the pair (uniform draws
    missed one in 6 samples out of 4: 53 of 200 reached it). Their spread is scaled by 1/sqrt(3),
    the RMS of a uniform xi, so where the output is linear it matches the uniform estimate.
    ``seen``: gets the names of the ops that got one rounding of their result (no rule, no
    decomposition). ``flips``: per integer (or boolean) output, where some sample's value differs
    from ``ref``'s: decisions within rounding of a tie (a report names them; never a bound)."""
    u, back = (UNIT_ROUNDOFF[dtype], 1 / math.sqrt(3)) if full_scale else unit_for(dtype)
    tiny = TINY[dtype] if dtype != "float64" else 0.0  # a float64 underflow is 2^-1075: none to model
    dists: dict[str, list[torch.Tensor]] = {}
    for k in range(first, first + samples):
        if full_scale:  # antithetic pairs: samples 2j and 2j + 1 share a seed, with opposite signs
            draw, extreme = sample_seed(seed, FULL_SCALE_SEEDS + k - k % 2), (1.0, -1.0)[k % 2]
        else:
            draw, extreme = sample_seed(seed, k), 0.0
        try:
            with rounding_noise()(u, draw, group_size, UNIT_ROUNDOFF[dtype], extreme, tiny) as mode:
                got = run_oracle()
        except TargetCodeError:  # it ran clean without noise: a perturbed float became an index
            mode = rounding_noise()(u, draw, group_size, UNIT_ROUNDOFF[dtype], extreme, tiny)
            mode.shadow = {}  # integer conversions read the unperturbed values: see shadowed
            try:
                with mode:
                    got = run_oracle()
            except TargetCodeError as e:
                raise NoiseModelRefusal(f"{e}\n{PERTURBED_ORACLE}") from e
        if seen is not None:
            seen |= mode.unmodelled
        for name, r in ref.items():
            g = got.get(name) if isinstance(got, dict) else None
            if not (isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor)) or g.shape != r.shape:
                continue
            if not (r.is_floating_point() or r.is_complex()):
                if flips is not None:
                    moved = g.detach().cpu().to(r.dtype) != r.cpu()
                    flips[name] = flips[name] | moved if name in flips else moved
                continue
            if not r.is_floating_point():
                continue
            d = (g.detach().double() - r.double()).abs()
            dists.setdefault(name, []).append(torch.where(torch.isfinite(d), d, torch.zeros_like(d)))
    return {name: _rms(ds) * back for name, ds in dists.items()}


#: what a refusal adds where the oracle raised only under the noise model's perturbation
PERTURBED_ORACLE = (
    "The oracle ran clean without noise, and raised under the noise model's perturbation of its "
    "float64 results (each is moved by a rounding of the case dtype), even with its roundings and "
    "casts to integers taken from the unperturbed values: something it computes in floats decides a "
    "size, an index or a branch that fails when moved. Compute that from Python numbers or integer "
    "tensors (docs/explanation/noise-model.md)"
)


def _rms(dists: list[torch.Tensor]) -> torch.Tensor:
    """The root mean square of finite distances, scaled by their largest so that squaring never
    overflows: a distance of 5.7e187 (a LayerNorm backward over one element, its rstd 316 on values
    of 1e3) squared to inf, which counted 0, and the bound collapsed to nothing."""
    stacked = torch.stack(dists)
    top = stacked.amax(0)
    safe = torch.where(top > 0, top, torch.ones_like(top))
    return top * (stacked / safe).pow(2).mean(0).sqrt()
