"""The self-oracle: ``Target(oracle="self")`` makes the implementation under test its own oracle.

For code whose unsharded form is the spec. Each case's inputs are built as always (in the case
dtype, rounded); then the same implementation runs once more at world size 1 (mesh ``(1,)``,
every input "sharded" over one rank, i.e. whole) in a 1-rank pool, on those inputs upcast to
float64. Its result, assembled through the output layouts, is ``oracle64``; a second run there in
the case dtype is the case-dtype rerun, and the noise samples of :mod:`shardfuzz.verdict.noise` are drawn
on that rank too, under the same ``TorchDispatchMode`` (collectives are left alone: at one rank
they move no data), with the case's group size W. So the tolerance is the one a written oracle
gets, with the world-size-1 implementation in the oracle's place.

It runs after the ranks of the case have answered (for a world size 1 case it is their pool), and
only for an example that completed: a hang or a rank error needs no oracle. It cannot see a bug
that is also there at world size 1, nor one the case dtype shows alike at every world size (the
case-dtype rerun carries it into the bound). When the world-size-1 run itself raises, hangs or
dies, that is a usage error (:class:`~shardfuzz.errors.TargetError`) with its traceback: a
self-oracle needs an implementation that runs on one rank in float64. What the noise model refuses
in it (:class:`~shardfuzz.errors.NoiseModelRefusal`: a hand-written softmax with a live max,
DTensor code) is said as that refusal and its remedy (for a live max, with the implementation's line).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import traceback
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from shardfuzz.case import Case
from shardfuzz.errors import NoiseModelRefusal, TargetError, Unsupported
from shardfuzz.protocol import Completed, Hung, ImplRef, RankDied, RankFailed, Task, UnsupportedReply, decode
from shardfuzz.ranks.pool_cache import discard_pool, get_pool
from shardfuzz.ranks.spawn import hard_cap
from shardfuzz.spec.inputs import float64, seed_global
from shardfuzz.spec.placements import local_input
from shardfuzz.spec.refs import load_ref
from shardfuzz.spec.registry import resolve_worker_target
from shardfuzz.spec.target import SELF
from shardfuzz.verdict.noise import estimate
from shardfuzz.verdict.oracle import (
    Expected,
    OverflowWatch,
    call_target_code,
    case_inputs,
    case_scale_of,
    check_case_dtype_collapse,
    check_case_dtype_range,
    far_off_outputs,
    watched_overflow,
)

__all__ = ["SELF", "SelfSource", "refuse", "run_self", "self_expected"]

#: what the 1-rank pool runs: the implementation under test, wrapped (:func:`run_self`)
RUN_SELF = "shardfuzz.engine.selforacle:run_self"


def refuse(target: Any, what: str) -> None:
    """InvalidArgument (a TargetError) when ``target`` has a self-oracle and ``what`` needs a
    written oracle function."""
    if getattr(target, "oracle", None) == SELF:
        raise TargetError(
            f"{what}: target {target.name!r} has oracle={SELF!r}, which {what} does not support: it "
            "needs an oracle function; allowed: a Target with oracle=callable(inputs, case)"
        )


def self_expected(target: Any, case: Case, impl: ImplRef, config: Any, window: float) -> Expected:
    """The :class:`Expected` of a self-oracle case: the inputs and magnitudes now (failure files
    hash the inputs), the values and noise from a 1-rank pool when asked (:class:`SelfSource`)."""
    inputs = case_inputs(target, case)
    mag = {}
    if target.magnitude:
        inputs64 = {k: float64(v) for k, v in inputs.items()}
        mag = call_target_code(target, "magnitude(inputs, case)", case, target.magnitude, inputs64, case)
    source = SelfSource(
        target, case, impl, config.backend, config.device or "cpu", config.deterministic, window
    )
    return Expected({}, {}, dict(mag), inputs, source=source)


@dataclasses.dataclass
class SelfSource:
    """Runs the world-size-1 implementation of one case in a 1-rank pool, on demand."""

    target: Any
    case: Case
    impl: ImplRef
    backend: str
    device: str
    deterministic: bool
    window: float

    def values(self, expected: Expected) -> None:
        """Fill ``expected.ref`` (float64) and ``expected.low`` (case dtype), once."""
        if expected.ref:
            return
        got = self._run("values")
        missing = sorted(set(self.target.outputs_for(self.case)) - set(got["ref"]))
        if missing:
            raise TargetError(
                f"Target {self.target.name!r} (oracle={SELF!r}): implementation {self.impl} did not return "
                f"output {missing[0]!r} at world size 1; it returns {sorted(got['ref'])}"
            )
        # as for a written oracle: where the implementation alone, in the case dtype, overflows and
        # its float64 run does not, no sharded run can be held to a value (a new user's fp16 step
        # at scale 1e4 was a mismatch that the same code at world size 1 has too)
        check_case_dtype_range(self.target, self.case, got["ref"], got["low"])
        # and where an op overflowed behind finite wrong outputs (the rank watched the run)
        check_case_dtype_collapse(
            self.target, self.case, got["ref"], got["low"], lambda _off: got.get("overflow")
        )
        expected.ref, expected.low = got["ref"], got["low"]
        inputs64 = {k: float64(v) for k, v in expected.inputs.items()}
        expected.case_scale = functools.cache(functools.partial(case_scale_of, inputs64, expected.ref))

    def noise(self, samples: int, first: int = 0, full_scale: bool = False) -> dict[str, Any]:
        """The noise of each floating output (:func:`shardfuzz.verdict.noise.estimate`), drawn on the rank."""
        if samples <= 0:
            return {}
        got = self._run("noise", samples=samples, first=first, full_scale=full_scale)
        if "refused" in got:
            at = f" (at {got['where']})" if got["where"] else ""
            remedy = (
                ". With a self-oracle the oracle is that implementation: the change goes there, or "
                "write an oracle function"
                if got["in_code"]
                else ""
            )
            raise NoiseModelRefusal(
                f"Target {self.target.name!r} (oracle={SELF!r}): the noise model refuses implementation "
                f"{self.impl}{at}, run at world size 1 as the oracle: {got['refused']}{remedy}",
                in_code=got["in_code"],
            )
        return got["noise"]

    def _run(self, mode: str, **extra: Any) -> dict[str, Any]:
        cap = hard_cap(self.window)
        pool = get_pool(self.backend, 1, cap, device=self.device)
        kwargs = {
            "target": self.target.worker_ref(),
            "impl": self.impl.ref,
            "impl_kwargs": self.impl.kwargs,
            "case": self.case.to_dict(),
            "mode": mode,
            **extra,
        }
        one = dataclasses.replace(self.case, world_size=1, mesh=(1,))
        task = Task(
            one, self.target.worker_ref(), ImplRef.from_parts(RUN_SELF, kwargs), cap, self.deterministic
        )
        pool.submit(task)
        try:
            outcome = pool.collect(self.window, cap)
        except BaseException:
            discard_pool(pool)
            raise
        if not isinstance(outcome, Completed) or any(getattr(r, "restart", False) for r in outcome.replies):
            discard_pool(pool)
        if isinstance(outcome, Completed):
            reply = outcome.replies[0]
            if isinstance(reply, UnsupportedReply):
                raise Unsupported(
                    f"the self-oracle run (world size 1) refused the case: {reply.reason}",
                    reason=reply.reason,
                )
            return decode(reply.outputs)["self"]
        what = f"implementation {self.impl} at world size 1 ({mode}), the self-oracle of {self.case!r},"
        if isinstance(outcome, RankFailed):
            detail = f"raised:\n{outcome.error.traceback}"
        elif isinstance(outcome, RankDied):
            detail = f"died (exit code {outcome.exitcode}):\n{''.join(outcome.output.values())}"
        else:
            assert isinstance(outcome, Hung)
            detail = f"hung:\n{''.join(outcome.stacks.values())}"
        raise TargetError(
            f"{what} {detail}\nA self-oracle needs an implementation that runs on one rank in float64 "
            "and in the case dtype; write an oracle function for this target otherwise."
        )


# -- inside the 1-rank pool ----------------------------------------------------------------------
def run_self(
    ctx: Any,
    *,
    target: str,
    impl: str,
    impl_kwargs: tuple = (),
    case: dict[str, Any],
    mode: str,
    samples: int = 0,
    first: int = 0,
    full_scale: bool = False,
) -> dict[str, Any]:
    """The implementation ``impl`` of the case ``case`` at world size 1 (``ctx`` is this 1-rank
    pool's), on the case's inputs: ``mode="values"``: its outputs in float64 and in the case dtype;
    ``"noise"``: their noise from ``samples`` runs under :mod:`shardfuzz.verdict.noise`'s mode."""
    orig = Case.from_dict(case)
    spec = resolve_worker_target(target)
    fn = load_ref(impl, "impl")
    built = spec.inputs(orig)  # the case dtype, rounded: exactly what the sharded ranks got
    outputs = spec.outputs_for(orig)

    def placed(dtype: str) -> dict[str, Any]:
        full = {
            k: (v.to(ctx.device) if dtype != "float64" else float64(v).to(ctx.device))
            if isinstance(v, torch.Tensor)
            else v
            for k, v in built.items()
        }
        return full

    ready = {dtype: placed(dtype) for dtype in {"float64", orig.dtype}}

    def run(dtype: str) -> dict[str, Any]:
        one = dataclasses.replace(orig, world_size=1, mesh=(1,), dtype=dtype)
        full = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in ready[dtype].items()}
        local = {
            k: local_input(spec.input_layout(k), v, ctx.mesh, 0, 1) if isinstance(v, torch.Tensor) else v
            for k, v in full.items()
        }
        seed_global(orig.seed, ctx.device.type)  # every run draws what the sharded ranks drew
        random.seed(orig.seed)
        np.random.seed(orig.seed % (2**32))
        got = fn(dataclasses.replace(ctx, case=one, inputs=full, local=local), **dict(impl_kwargs))
        if not isinstance(got, dict):
            raise TypeError(
                f"implementation {impl} returned {type(got).__name__}, expected a dict of outputs"
            )
        return {name: _whole(layout, got[name]) for name, layout in outputs.items() if name in got}

    if mode == "values":
        ref = run("float64")
        if orig.dtype == "float64":
            return {"self": {"ref": ref, "low": ref}}
        low, overflow = run(orig.dtype), None
        off = far_off_outputs(orig, ref, low)
        if off:  # rare: only then run it again, watched for an overflow behind them
            watch = OverflowWatch()
            with watch:
                again = run(orig.dtype)
            overflow = watched_overflow(watch, again, off)
        return {"self": {"ref": ref, "low": low, "overflow": overflow}}
    try:
        ref = _plain(run)
        with torch.enable_grad():
            noise = estimate(
                lambda: run("float64"),
                ref,
                orig.dtype,
                orig.seed,
                orig.group_size,
                samples,
                first,
                full_scale,
            )
    except NoiseModelRefusal as e:  # a live max, DTensor code: said as a refusal, not a crash
        return {"self": {"refused": str(e), "in_code": e.in_code, "where": _user_frame(e)}}
    return {"self": {"noise": noise}}


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc`` outside shardfuzz and torch: the line of the
    implementation that the refusal is about ("" where there is none)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    inside = (package, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    built_in = package + "targets" + os.sep  # the built-in targets' code is an implementation's

    def ours(name: str) -> bool:
        return name.startswith(inside) and not name.startswith(built_in)

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not ours(os.path.abspath(f.filename))]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _plain(run: Any) -> dict[str, Any]:
    """The float64 run, refused when it computes on tensor subclasses (DTensor): the noise mode
    sees their ops, not the local ones inside, and cannot perturb them."""
    plain = (torch.Tensor, torch.nn.Parameter)

    class Watch(TorchDispatchMode):
        seen: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            self.seen.update(t.__name__ for t in types if t not in plain)
            return func(*args, **(kwargs or {}))

    with Watch() as watch:
        ref = run("float64")
    if watch.seen:
        raise NoiseModelRefusal(
            f"with noise_model='mca' it computes on {sorted(watch.seen)}, whose ops the noise model "
            "cannot perturb; allowed: Tolerance(noise_model='dtype-rerun'), fixed tolerances "
            "(Target(tolerance=...)), or a written oracle",
            in_code=False,
        )
    return ref


def _whole(layout: Any, value: Any) -> Any:
    """One rank's output as the global value: a DTensor's full tensor, or the layout's assembly of
    the one local (a ``Partial`` sum stays in the local's dtype)."""
    if hasattr(value, "full_tensor") and hasattr(value, "placements"):
        value = value.full_tensor()
    if not isinstance(value, torch.Tensor):
        return value
    return layout.assemble_at([0], [value.detach()]).to(value.dtype)
