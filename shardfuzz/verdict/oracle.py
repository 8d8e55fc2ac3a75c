"""The oracle of one case: the single-process result in float64 (the reference) and once more in
the case dtype (to measure that dtype's rounding noise on this very case), plus the target's
magnitude estimate when it gives one.

The target's own code runs here, so this is also where a spec is held to its word: every key of
``input_layouts`` must name an input, every declared output must come back from the oracle, and a
key of ``magnitude`` that names no output is an error when a floating output is left without one
(a misspelling; a shared magnitude may cover more outputs). Each is a usage error naming the key,
the target and the allowed names. When the target's ``inputs``, ``oracle`` or ``magnitude``
raises, that is the target's error (:class:`~shardfuzz.errors.TargetCodeError`, with its
traceback), not a finding and not shardfuzz's. :func:`check_case` checks a hand-made case against
what the target's strategy draws. The oracle may return more than the declared outputs: the others
are not compared.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import math
import os
import re
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from hypothesis import currently_in_test_context
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from shardfuzz.case import PROFILE_PARAM_NAMES, PROFILE_PARAMS, Case, profile_param_problem
from shardfuzz.errors import TargetCodeError, TargetError, Unsupported
from shardfuzz.limits import check_world_size
from shardfuzz.protocol import dense
from shardfuzz.spec.inputs import RandomState, float64, seed_all
from shardfuzz.spec.sampling import draw_pool, simplest_case, stable_seed
from shardfuzz.spec.target import SELF
from shardfuzz.spec.tolerance import floored_noise
from shardfuzz.verdict.noise import estimate


@dataclasses.dataclass
class Expected:
    """What the oracle says a case must give."""

    ref: dict[str, Any]  # float64 on the rounded inputs
    low: dict[str, Any]  # in the case dtype
    mag: dict[str, Any]  # the target's magnitudes (empty without one)
    inputs: dict[str, Any]  # the full inputs as built (failure files hash them)
    noise: dict[str, Any] = dataclasses.field(default_factory=dict)  # Monte-Carlo spread per output
    case_scale: Any = 0.0  # the largest rms of the case's floating inputs and outputs (callable: lazy)
    rng: RandomState | None = None  # the random states the reference run started from (noise samples too)
    source: Any = None  # a self-oracle (shardfuzz.engine.selforacle): fills ref/low, draws noise on a rank
    #: the oracle's ops that its noise samples gave one rounding of their result (no rule or decomposition)
    unmodelled: set[str] = dataclasses.field(default_factory=set)
    #: per integer or boolean output: the elements some noise sample gave another value (a decision
    #: within rounding of a tie; a mismatch's report names them)
    flipped: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the dtype whose rounding the noise samples charge (``Tolerance.judged_dtype``; None: the case's)
    unit_dtype: str | None = None


#: the reason a case whose oracle leaves the case dtype's finite range is counted under
ORACLE_OVERFLOWS = "the oracle overflows the case dtype"
#: the reason a case whose edge value takes the oracle out of the finite range is counted under
EDGE_OVERFLOWS = "edge value overflows the oracle"


class CppWarningsOnce:
    """fd 2 on a file while the target's code runs in the driver, then what it wrote: a C++
    warning line once per process, named as torch's warning from the target's code, every other
    line as it came. ``torch.ops`` calls print their
    C++ warnings straight to fd 2 in torch 2.13, past Python's warnings (pytorch/pytorch#193451
    routes them to Python): a ``dtensor_ops`` campaign on ``var`` printed `var(): degrees of
    freedom is <= 0` for every case (2,567 lines), the README's first command 3 times."""

    #: c10's warning line: ``[W1205 17:17:50.050508762 ReduceOps.cpp:1861] Warning: ...``
    LINE = re.compile(rb"^\[W\d{4} [\d:.]+ [^\]]+\] (Warning: .*)$")

    def __init__(self) -> None:
        self.sink: Any = None
        self.seen: set[bytes] = set()
        self.depth = 0

    @contextlib.contextmanager
    def captured(self) -> Iterator[None]:
        if self.depth:  # target code inside target code: the outer call captures
            yield
            return
        if self.sink is None:
            self.sink = tempfile.TemporaryFile()
            atexit.register(self.sink.close)  # else "ResourceWarning: unclosed file" at every exit
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(self.sink.fileno(), 2)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            self._emit()

    def _emit(self) -> None:
        fd = self.sink.fileno()
        size = os.fstat(fd).st_size
        if not size:
            return
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, size)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        kept = []
        for line in data.splitlines(keepends=True):
            m = self.LINE.match(line.rstrip(b"\n"))
            if m is not None:
                if m.group(1) in self.seen:
                    continue
                self.seen.add(m.group(1))
                # said as what it is: torch's, from the target's code (a new user's first run
                # showed two bare "[W1205 ...] Warning:" lines and read them as shardfuzz's)
                line = b"shardfuzz: torch warned in the target's code (said once): " + m.group(1) + b"\n"
            kept.append(line)
        if kept:
            os.write(2, b"".join(kept))


CPP_WARNINGS = CppWarningsOnce()


def supports(target: Any, case: Case) -> Any:
    """``target.supports(case)`` (why the target cannot run ``case``, or a false value) with its
    C++ warnings once (``dtensor_ops`` runs the op on zeros to see whether it refuses)."""
    with CPP_WARNINGS.captured():
        return target.supports(case)


#: the end of every error of the target's own code: how to leave out a case it cannot handle
REFUSE_A_CASE = (
    "If the target cannot handle such a case, keep it out of the strategy (e.g. sst.Split(min_size=2);"
    " a condition on several sizes, a .map over the cases: docs/reference/strategies.md)"
    " or raise shardfuzz.Unsupported('why', reason='key') there: the case is then rejected and counted"
)


def call_target_code(target: Any, piece: str, case: Case, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a piece of the target's code; what it raises becomes the target's error."""
    try:
        with CPP_WARNINGS.captured():
            return fn(*args)
    except Unsupported:
        raise
    except Exception as e:
        if type(e).__module__.startswith("hypothesis"):  # assume(), reject(): Hypothesis' business
            raise
        # a reference op that refuses a drawn case (F.batch_norm with one value per channel) is a
        # cause new users met: the error ends with the two ways out
        raise TargetCodeError.of(target.name, piece, case, e, case_hint(target, case), REFUSE_A_CASE) from e


def _check_names(target: Any, field: str, keys: Any, allowed: Any, what: str) -> None:
    unknown = sorted(set(keys) - set(allowed))
    if unknown:
        raise TargetError(
            f"Target {target.name!r}: {field} key {unknown[0]!r} is not {what}; "
            f"{what.split()[-1]}s are {sorted(allowed)}"
        )


def case_inputs(target: Any, case: Case) -> dict[str, Any]:
    """The case's full inputs, checked: built from its seed, a dict, names the layouts know."""
    seed_all(case.seed)  # the oracle runs on the driver's CPU, seeded as the ranks are
    inputs = call_target_code(target, "inputs(case)", case, target.inputs, case)
    if not isinstance(inputs, dict):
        raise TargetError(
            f"Target {target.name!r}: inputs(case) returned {type(inputs).__name__}, not a dict"
        )
    _check_names(target, "input_layouts", target.input_layouts, inputs, "an input")
    _check_names(target, "layout_free", target.layout_free, inputs, "an input")
    return inputs


def evaluate_oracle(
    target: Any, case: Case, outputs: dict[str, Any] | None = None, noise_samples: int = 0
) -> Expected:
    """Run ``target``'s oracle on ``case``; ``outputs`` (name -> layout) defaults to the case's.
    ``noise_samples`` > 0: also estimate each output's rounding noise (:mod:`shardfuzz.verdict.noise`)."""
    if target.oracle == SELF:
        raise TargetError(
            f"Target {target.name!r} has oracle={SELF!r}: there is no oracle function to run here; "
            "a self-oracle runs the implementation at world size 1 on a pool (shardfuzz.run, Runner)"
        )
    inputs = case_inputs(target, case)
    inputs64 = {k: float64(v) for k, v in inputs.items()}
    rng = RandomState.now()  # every run of the oracle draws what the ranks drew
    with torch.enable_grad():
        ref = call_target_code(target, "oracle(inputs, case)", case, target.oracle, _fresh(inputs64), case)
        rng.restore()
        low = call_target_code(target, "oracle(inputs, case)", case, target.oracle, _fresh(inputs), case)
        rng.restore()
        mag = (
            call_target_code(target, "magnitude(inputs, case)", case, target.magnitude, inputs64, case)
            if target.magnitude
            else {}
        )
    wanted = outputs if outputs is not None else target.outputs_for(case)
    for name, got in (("oracle", ref), ("magnitude", mag)):
        if not isinstance(got, dict):
            raise TargetError(f"Target {target.name!r}: its {name} returned {type(got).__name__}, not a dict")
    missing = sorted(set(wanted) - set(ref))
    if missing:
        raise TargetError(
            f"Target {target.name!r}: declared output {missing[0]!r} is not returned by the oracle; "
            f"it returns {sorted(ref)}"
        )
    unknown = sorted(set(mag) - set(wanted))
    lacking = [
        o for o in wanted if o not in mag and isinstance(ref[o], torch.Tensor) and ref[o].is_floating_point()
    ]
    if unknown and lacking:  # a shared magnitude may cover more outputs; a misspelt one leaves one bare
        raise TargetError(
            f"Target {target.name!r}: magnitude key {unknown[0]!r} is not an output, and output {lacking[0]!r} "
            f"has no magnitude; outputs are {sorted(wanted)}"
        )

    def detach(d: dict[str, Any]) -> dict[str, Any]:
        return {k: (dense(v.detach()) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}

    ref = detach(ref)
    if case.profile == "edge":
        check_edge_range(target, case, ref, low, lambda: detach(_oracle64_without_edge(target, case, rng)))
    check_case_dtype_range(target, case, ref, low)
    check_case_dtype_collapse(
        target, case, ref, low, lambda off: _first_overflow(target, case, inputs, rng, off)
    )
    scale = functools.partial(case_scale_of, inputs64, ref)  # needed only for an output that is 0 everywhere
    expected = Expected(ref, detach(low), detach(mag), inputs, {}, functools.cache(scale), rng)
    if noise_samples:
        estimate_noise(target, case, expected, noise_samples, wanted)
    return expected


def check_edge_range(
    target: Any,
    case: Case,
    ref: dict[str, Any],
    low: dict[str, Any],
    without_edge: Callable[[], dict[str, Any]],
) -> None:
    """Unsupported when an ``edge`` case's values leave the finite range in the oracle itself: in
    float64 (``ref``), or in the case dtype (``low``). A correct implementation cannot carry such a
    case either, so it is not one; counted, never judged. An element that is not finite in the
    float64 oracle of the same case without its edge value (``without_edge``, run only when some
    element is not finite) is the target's own (a loss of 0 / 0 where every label is ignored),
    judged as in any other case."""
    own: dict[str, Any] | None = None
    for name, r in ref.items():
        if not (isinstance(r, torch.Tensor) and r.is_floating_point()):
            continue
        lo = low.get(name)
        bad = ~torch.isfinite(r)
        if isinstance(lo, torch.Tensor) and lo.is_floating_point() and lo.shape == r.shape:
            bad |= ~torch.isfinite(lo.detach())
        if not bool(bad.any()):
            continue
        own = without_edge() if own is None else own
        base = own.get(name)
        if isinstance(base, torch.Tensor) and base.shape == r.shape:
            bad &= torch.isfinite(base)
        if bool(bad.any()):
            edge = case.options.get("edge")
            raise Unsupported(
                f"target {target.name!r}: output {name!r} of the oracle is not finite with edge={edge!r} "
                f"in {case.dtype}",
                reason=EDGE_OVERFLOWS,
            )


def _oracle64_without_edge(target: Any, case: Case, rng: RandomState) -> dict[str, Any]:
    """The float64 oracle of ``case`` with the ``normal`` profile: the same seed, so the same values
    but the edge one, on the random state the case's own oracle started from."""
    plain = dataclasses.replace(
        case,
        profile="normal",
        options={k: v for k, v in case.options.items() if k not in PROFILE_PARAMS["edge"]},
    )
    state = RandomState.now()  # before case_inputs, which seeds the global generators
    try:
        inputs64 = {k: float64(v) for k, v in case_inputs(target, plain).items()}
        rng.restore()
        with torch.enable_grad():
            return call_target_code(target, "oracle(inputs, case)", plain, target.oracle, inputs64, plain)
    finally:
        state.restore()


def check_case_dtype_range(target: Any, case: Case, ref: dict[str, Any], low: dict[str, Any]) -> None:
    """Unsupported when the oracle itself, run in the case dtype, leaves the finite range where its
    float64 run does not (``exp2`` of 150 in float32): the oracle has no value in that dtype to hold
    an implementation to, so the case is counted, never judged."""
    for name, r in ref.items():
        lo = low.get(name)
        if not (isinstance(r, torch.Tensor) and r.is_floating_point() and isinstance(lo, torch.Tensor)):
            continue
        if lo.is_floating_point() and bool((torch.isfinite(r) & ~torch.isfinite(lo.detach())).any()):
            raise Unsupported(
                f"target {target.name!r}: output {name!r} of the oracle overflows {case.dtype} where its "
                "float64 value is finite",
                reason=ORACLE_OVERFLOWS,
            )


#: an element of the case-dtype oracle this far off its float64 value (a share of that value), where
#: the value is at least :data:`COLLAPSE_SIGNIFICANT` of the output's largest, lets the bound's
#: ``2 * |oracle_in_case_dtype - oracle64|`` term pass an output of 0 there
COLLAPSE_OFF, COLLAPSE_SIGNIFICANT = 0.5, 2.0**-4


def far_off_outputs(case: Case, ref: dict[str, Any], low: dict[str, Any]) -> list[str]:
    """The outputs whose case-dtype oracle is off by more than half its float64 value at an element
    that matters (see :func:`check_case_dtype_collapse`)."""
    if case.dtype == "float64":  # its rerun is the reference itself
        return []
    off: list[str] = []
    for name, r in ref.items():
        lo = low.get(name)
        if not (isinstance(r, torch.Tensor) and r.is_floating_point() and isinstance(lo, torch.Tensor)):
            continue
        if not lo.is_floating_point() or lo.shape != r.shape or not r.numel():
            continue
        size = r.detach().double().abs()
        top = float(size[torch.isfinite(size)].max()) if bool(torch.isfinite(size).any()) else 0.0
        wrong = ((lo.detach().double() - r.detach().double()).abs() > COLLAPSE_OFF * size) & (
            size >= COLLAPSE_SIGNIFICANT * top
        )
        if top > 0 and bool(wrong.any()):
            off.append(name)
    return off


def check_case_dtype_collapse(
    target: Any,
    case: Case,
    ref: dict[str, Any],
    low: dict[str, Any],
    first_overflow: Callable[[list[str]], str | None],
) -> None:
    """Unsupported when the oracle, run in the case dtype, overflows an intermediate to finite wrong
    outputs (a float16 RMSNorm by hand: ``x * x`` is inf, ``rsqrt`` gives 0, every output a finite
    0). The bound's rerun term then holds twice the true value, so any output within it passes (a
    planted bug passed at 0.498): like a non-finite output, the case is counted, never judged.

    Looked at only where some significant element is off by more than half its value (rare: a sum
    that cancels in the case dtype is too, and is judged as ever when nothing overflowed):
    ``first_overflow`` reruns the oracle in the case dtype and names the first op that made an inf
    or a NaN from finite inputs."""
    off = far_off_outputs(case, ref, low)
    if not off:
        return
    op = first_overflow(off)
    if op is not None:
        raise Unsupported(
            f"target {target.name!r}: the oracle overflows {case.dtype} in {op} (finite inputs, a result "
            f"that is not), and its output {off[0]!r} is off by more than half its float64 value",
            reason=ORACLE_OVERFLOWS,
        )


class OverflowWatch(TorchDispatchMode):
    """Ops that make a non-finite floating result from finite floating inputs, where the same op on
    those inputs in float64 does not (``log(0)`` is -inf there too: a log-space mask, not an
    overflow; a cast down to float16 is rerun as a float64 cast); ``first`` names the first, and
    every tensor computed from one is ``tainted`` (:meth:`tainted`), so that an output far off for
    another reason (a sum that cancels) is not blamed on a float16 mask overflowing to -inf. An op
    that writes (``mul_``, ``out=``) gets its inputs copied first: it overwrites them. A tensor
    subclass (a DTensor) is not looked into: the ops inside it run below this mode, unwatched."""

    def __init__(self) -> None:
        super().__init__()
        self.first: str | None = None
        self._tainted: dict[int, Any] = {}
        #: a Python number or bool was read from a value computed from an overflow (``bool()``,
        #: ``.item()``): the code may have branched on it, and from there no data flow tells which
        #: output it reached (a loss scaler's ``isfinite`` check skips a step: every output moved)
        self.branched = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # no torch.compile under it: without this, every op pays dynamo's wrapper

    def tainted(self, t: Any) -> bool:
        """Whether ``t`` was computed from an overflow."""
        ref = self._tainted.get(id(t))
        return ref is not None and ref() is t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        inputs = tree_leaves(_read_only(func, args, kwargs))
        from_overflow = bool(self._tainted) and any(self.tainted(t) for t in inputs)
        before = None
        # an empty tensor's memory is not a result; a -inf mask value is given, not made
        if "empty" not in name and all(map(_finite, inputs)):
            # an op that writes (in place, out=) overwrites its inputs: copied; the others are kept
            before = _copies((args, kwargs)) if func._schema.is_mutable else (args, kwargs)
        out = func(*args, **kwargs)
        results = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if before is not None and any(
            type(t) is torch.Tensor and t.is_floating_point() and not bool(torch.isfinite(t).all())
            for t in results
        ):
            overflowed = _finite_in_float64(func, *before)
            if overflowed:
                self.first = self.first or name
            from_overflow = from_overflow or overflowed
        if from_overflow:
            for t in results:
                self._tainted[id(t)] = weakref.ref(t)
            if not results:  # a Python number, the input of a branch (is_nonzero, _local_scalar_dense)
                self.branched = True
        return out


def _read_only(func: Any, args: tuple, kwargs: dict) -> tuple:
    """The arguments an op reads: not a keyword-only ``out=``, nor ``copy_``'s destination (a stale
    NaN in a buffer it overwrites is no input)."""
    if func.overloadpacket.__name__ == "copy_":
        return (args[1:], kwargs)
    written = {a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info is not None}
    return (args, {k: v for k, v in kwargs.items() if k not in written})


def _finite(arg: Any) -> bool:
    if isinstance(arg, torch.Tensor):
        return type(arg) is not torch.Tensor or not arg.is_floating_point() or bool(torch.isfinite(arg).all())
    return not isinstance(arg, float) or math.isfinite(arg)


def _copies(tree: Any, dtype: torch.dtype | None = None) -> Any:
    """Floating plain tensors of ``tree`` copied (in ``dtype`` if given, and a floating dtype
    argument, a cast's, made ``dtype`` too), the rest as they are."""

    def one(t: Any) -> Any:
        if type(t) is torch.Tensor and t.is_floating_point():
            return t.to(dtype) if dtype is not None else t.clone()
        if dtype is not None and isinstance(t, torch.dtype) and t.is_floating_point:
            return dtype
        return t

    return tree_map(one, tree)


def _finite_in_float64(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether ``func`` on these inputs in float64 gives finite floating results (a random op is not
    rerun, which would draw more: its non-finite draw counts as the case dtype's overflow)."""
    if torch.Tag.nondeterministic_seeded in func.tags:
        return True
    args64, kwargs64 = _copies((args, kwargs), torch.float64)
    try:
        out = func(*args64, **kwargs64)
    except RuntimeError:  # the op takes no float64 here (a dtype it insists on): count it an overflow
        return True
    outs = [t for t in tree_leaves(out) if type(t) is torch.Tensor and t.is_floating_point()]
    return all(bool(torch.isfinite(t).all()) for t in outs)


def watched_overflow(watch: OverflowWatch, outputs: dict[str, Any], off: list[str]) -> str | None:
    """The first overflow of a watched run, where one of the far-off outputs ``off`` came from an
    overflow, or the run branched on a value that did (else None: they are off for another reason)."""
    if watch.first is None or not (watch.branched or any(watch.tainted(outputs.get(name)) for name in off)):
        return None
    return watch.first


def _first_overflow(
    target: Any, case: Case, inputs: dict[str, Any], rng: RandomState, off: list[str]
) -> str | None:
    """The first op of the oracle, run in the case dtype again, that overflowed where one of the
    far-off outputs ``off`` came from it (None: none did)."""
    state = RandomState.now()
    try:
        rng.restore()
        watch = OverflowWatch()
        with torch.enable_grad(), watch:
            got = call_target_code(target, "oracle(inputs, case)", case, target.oracle, _fresh(inputs), case)
        return watched_overflow(watch, got if isinstance(got, dict) else {}, off)
    finally:
        state.restore()


def estimate_noise(
    target: Any, case: Case, expected: Expected, samples: int, outputs: dict[str, Any] | None = None
) -> None:
    """Fill ``expected.noise``: each output's rounding noise (:mod:`shardfuzz.verdict.noise`), from
    ``samples`` more float64 runs of the oracle that draw what the reference drew."""
    expected.noise = _spread(target, case, expected, outputs, samples)


def confirm_noise(
    target: Any, case: Case, expected: Expected, tolerance: Any, outputs: dict[str, Any] | None = None
) -> None:
    """Widen ``expected.noise`` (from ``tolerance.samples`` runs) before a mismatch is reported:
    the spread over ``confirm_samples`` more first-order runs pooled with the first (a few
    samples can all fall small), or the spread of ``full_scale_samples`` runs perturbed at the
    case dtype's own unit where that is larger (a rounding can flip a sign, which first order
    misses: an AdamW update is ``lr * sign(g)`` where g cancels)."""
    seen, more = tolerance.samples, tolerance.confirm_samples
    first = dict(expected.noise)
    pooled = _spread(target, case, expected, outputs, more, first=seen)
    noise = {}
    for name in set(first) | set(pooled):
        like = next(d[name] for d in (first, pooled) if name in d).double()
        a, b = (d[name].double() if name in d else torch.zeros_like(like) for d in (first, pooled))
        # scaled by the larger before squaring, as the estimate's own mean is: a noise of 1e160
        # squared to inf, and an infinite bound passes an infinite output
        top = torch.maximum(a, b)
        finite = torch.isfinite(top)  # an infinite noise stays infinite (inf / inf is NaN)
        safe = torch.where((top > 0) & finite, top, torch.ones_like(top))
        pooled_rms = (
            top * ((seen * (a / safe).pow(2) + more * (b / safe).pow(2)) / max(seen + more, 1)).sqrt()
        )
        noise[name] = torch.where(finite, pooled_rms, top)
    expected.noise = noise
    widen_full_scale(target, case, expected, tolerance.full_scale_samples, outputs)


def widen_full_scale(
    target: Any, case: Case, expected: Expected, samples: int, outputs: dict[str, Any] | None = None
) -> None:
    """Widen ``expected.noise`` by the spread of ``samples`` runs perturbed at the case dtype's own
    unit (an antithetic pair each two): what first order cannot see, a rounding that flips a sign
    or a branch, whose error can be as large as the output itself."""
    full = _spread(target, case, expected, outputs, samples, full_scale=True)
    for name, c in full.items():
        a = expected.noise.get(name)
        expected.noise[name] = c if a is None else torch.maximum(a.double(), c.double())


#: a full-scale sample this many times past an element's noise is a flip, a sign or a branch that
#: a rounding turned: on smooth outputs (tp_mlp, the non-flipping outputs of a ZeRO AdamW step) the
#: samples beyond the first 6 land at most 3.3 times it away, and the flip that made a false
#: finding of a correct ZeRO step at 29 times
FLIP_JUMP = 10.0


def search_flips(
    target: Any,
    case: Case,
    expected: Expected,
    tolerance: Any,
    outputs: dict[str, Any] | None = None,
    passes: Callable[[], bool] = lambda: False,
) -> None:
    """Up to ``tolerance.flip_samples`` more full-scale runs after the recheck's, a pair at a time
    (:func:`widen_by_flips`), until ``passes()`` (the verdict with the noise widened so far)."""
    done = tolerance.full_scale_samples
    if not done:  # the user turned full-scale samples off
        return
    start = done + done % 2  # a pair shares an even index: never a seed the recheck drew
    for first in range(start, start + tolerance.flip_samples, 2):
        if widen_by_flips(target, case, expected, tolerance, first, outputs) and passes():
            return


def widen_by_flips(
    target: Any,
    case: Case,
    expected: Expected,
    tolerance: Any,
    first: int,
    outputs: dict[str, Any] | None = None,
) -> bool:
    """One more antithetic pair of full-scale runs (samples ``first``, ``first + 1``), for a failure
    the recheck did not pass: each pair reaches a given flip only by chance (three missed one that
    12 of 20 reach: a correct ZeroRedundancyOptimizer bf16 step, 4.4x), so more pairs look for it.
    Where a sample lands more than :data:`FLIP_JUMP` times an element's noise away, that element is
    widened as if the flip had been one of the first ``full_scale_samples`` (the same bound a flip
    seen there gives). Other samples change nothing: they are not pooled, so the verdict on a
    smooth output, a real bug's, does not move with them. Whether any element was widened."""
    widened = False
    spread_of = {name: floored_noise(n) for name, n in expected.noise.items()}
    per_flip = 1 / math.sqrt(max(tolerance.full_scale_samples, 1))
    for k in (first, first + 1):
        sample = _spread(target, case, expected, outputs, 1, first=k, full_scale=True)
        for name, s in sample.items():
            s = torch.nan_to_num(s.double(), 0.0, 0.0, 0.0)
            now = spread_of.get(name, torch.zeros_like(s))
            flip = s > FLIP_JUMP * now
            if bool(flip.any()):
                old = expected.noise.get(name, torch.zeros_like(s)).double()
                expected.noise[name] = torch.where(flip, torch.maximum(old, s * per_flip), old)
                widened = True
    return widened


def _spread(
    target: Any,
    case: Case,
    expected: Expected,
    outputs: dict[str, Any] | None,
    samples: int,
    first: int = 0,
    full_scale: bool = False,
) -> dict[str, Any]:
    """The noise of each output from ``samples`` runs (:func:`shardfuzz.verdict.noise.estimate`); a
    self-oracle draws them on its rank."""
    if expected.source is not None:
        return expected.source.noise(samples, first, full_scale)
    rerun, ref = _noise_runs(target, case, expected, outputs)
    return estimate(
        rerun,
        ref,
        expected.unit_dtype or case.dtype,
        case.seed,
        case.group_size,
        samples,
        first,
        full_scale,
        seen=expected.unmodelled,
        flips=expected.flipped,
    )


def _noise_runs(
    target: Any, case: Case, expected: Expected, outputs: dict[str, Any] | None
) -> tuple[Callable[[], dict[str, Any]], dict[str, Any]]:
    """A float64 rerun of the oracle from the reference's inputs and RNG, and the outputs to judge."""
    inputs64 = {
        k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in expected.inputs.items()
    }

    def rerun() -> dict[str, Any]:
        if expected.rng is not None:
            expected.rng.restore()
        with torch.enable_grad():
            return call_target_code(
                target, "oracle(inputs, case)", case, target.oracle, _fresh(inputs64), case
            )

    wanted = outputs if outputs is not None else target.outputs_for(case)
    return rerun, {k: expected.ref[k] for k in wanted}


def _fresh(inputs: dict[str, Any]) -> dict[str, Any]:
    """Copies, so that one run of the oracle (gradients, in-place ops) cannot reach the next."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def case_scale_of(*dicts: dict[str, Any]) -> float:
    """The largest root mean square over the case's floating inputs and outputs."""
    best = 0.0
    for d in dicts:
        for v in d.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
                finite = v.detach()[torch.isfinite(v.detach())]
                if finite.numel():
                    best = max(best, float(finite.double().pow(2).mean().sqrt()))
    return best


# -- hand-made cases ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DrawnSizes:
    """The size names and smallest sizes a target's strategy draws, from a sample of its cases."""

    required: frozenset[str]  # in every case drawn
    allowed: frozenset[str]  # in some case drawn
    smallest: dict[str, int]
    example: Case  # the first (simplest) case drawn
    options: frozenset[str] = frozenset()  # option names in some case drawn (value-profile ones too)
    required_options: frozenset[str] = frozenset()  # option names in every case drawn


_DRAWN: weakref.WeakKeyDictionary[Any, DrawnSizes | None] = weakref.WeakKeyDictionary()


def drawn_sizes(target: Any, n: int = 30) -> DrawnSizes | None:
    """What ``target``'s strategy draws: its simplest case and ``n`` random ones (the same on every
    machine), sampled once per target. Never call it inside a Hypothesis test."""
    if target in _DRAWN:
        return _DRAWN[target]

    # the simplest case first (its sizes are the smallest the strategy draws), then random ones
    strategy = target.strategy()
    simplest = simplest_case(strategy)
    seen = [] if simplest is None else [simplest[0]]
    seen += [case for case, _ in draw_pool(strategy, stable_seed(f"{target.name}/drawn"), n)]
    drawn = None
    if seen:
        names = [frozenset(c.sizes) for c in seen]
        smallest: dict[str, int] = {}
        for c in seen:
            for k, v in c.sizes.items():
                smallest[k] = min(v, smallest.get(k, v))
        opts = [frozenset(c.options) - PROFILE_PARAM_NAMES for c in seen]
        # the parameters of the profiles it draws (declared, else seen): the opt-in edge profile's
        # were listed as drawn options of every target
        bounds = target.case_bounds()
        params = (
            frozenset(n for b in bounds for n in b.option_names()) & PROFILE_PARAM_NAMES
            if bounds
            else frozenset(p for c in seen for p in PROFILE_PARAMS.get(c.profile, ()))
        )
        drawn = DrawnSizes(
            frozenset.intersection(*names),
            frozenset().union(*names),
            smallest,
            seen[0],
            frozenset().union(*opts) | params,
            frozenset.intersection(*opts),
        )
    _DRAWN[target] = drawn
    return drawn


def check_case(target: Any, case: Any) -> None:
    """TargetError when a hand-made case (``shardfuzz case``, a failure file) cannot be one of
    ``target``'s: another target's name, size names its strategy never draws or always draws, or
    a case its inputs builder cannot build."""
    if not isinstance(case, Case):
        raise TargetError(f"case={case!r}; expected a shardfuzz.Case")
    if case.target != target.name:
        raise TargetError(f"case target={case.target!r}, but the target is {target.name!r}")
    check_world_size(case.world_size, "case world_size")
    drawn = drawn_sizes(target)
    if drawn is not None:
        missing = sorted(drawn.required - set(case.sizes))
        unknown = sorted(set(case.sizes) - drawn.allowed)
        if missing or unknown:
            wrong = [f"lacks {missing}"] if missing else []
            wrong += [f"has {unknown}, which the target does not draw"] if unknown else []
            raise TargetError(
                f"case sizes={case.sizes!r} {' and '.join(wrong)}; target {target.name!r} draws the sizes "
                f"{sorted(drawn.allowed)}, e.g. {drawn.example.sizes!r}"
            )
        missing_opts = sorted(drawn.required_options - set(case.options))
        # its own profile's parameters are the case's (a pinned --option scale=... puts a target
        # that declares no bounds in a profile its draws may not show), checked as a pin is
        unknown_opts = sorted(set(case.options) - drawn.options - set(PROFILE_PARAMS[case.profile]))
        if missing_opts or unknown_opts:
            wrong = [f"lacks {missing_opts}"] if missing_opts else []
            wrong += [f"has {unknown_opts}, which the target does not draw"] if unknown_opts else []
            raise TargetError(
                f"case options={case.options!r} {' and '.join(wrong)}; target {target.name!r} draws the "
                f"options {sorted(drawn.options)}, e.g. {drawn.example.options!r}"
            )
    problem = profile_param_problem(case.profile, case.options)
    if problem:
        raise TargetError(f"case {problem}")
    try:
        call_target_code(target, "inputs(case)", case, target.inputs, case)
    except Unsupported as e:  # a hand-made case the target refuses (a failure file's op changed)
        raise TargetError(
            f"case {case!r} is not one target {target.name!r} can run: {str(e)!r}"  # repr: escaped
        ) from None


def case_hint(target: Any, case: Case) -> str:
    """For an error of the target's code on ``case``: the size names it lacks or has beyond what the
    target's strategy draws, and the sizes below any it draws. Outside a Hypothesis test only (a
    case the strategy drew needs no hint, and no strategy may be drawn from inside a test)."""
    if target not in _DRAWN and currently_in_test_context():
        return ""
    drawn = drawn_sizes(target)
    if drawn is None:
        return ""
    missing = sorted(drawn.required - set(case.sizes))
    unknown = sorted(set(case.sizes) - drawn.allowed)
    hints = [f"the case lacks the sizes {missing}"] if missing else []
    hints += [f"the case has the sizes {unknown}, which the target does not draw"] if unknown else []
    hints += [
        f"sizes[{k!r}]={v!r} is below the smallest value target {target.name!r} draws ({drawn.smallest[k]})"
        for k, v in case.sizes.items()
        if k in drawn.smallest and v < drawn.smallest[k]
    ]
    return "; ".join(hints)
