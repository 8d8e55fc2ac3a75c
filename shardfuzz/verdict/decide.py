"""The verdict procedure: the ranks' replies against the oracle, judge -> noise -> recheck.

:func:`decide` is the one place a verdict is made (the runner, the torchrun path and the benchmarks
call it). It judges without the noise term first: the noise only widens the bound, so a case that
passes without it passes with it, at a ratio no higher. If that ratio is within :data:`SURE_PASS`,
or below the closest pass seen so far (which it then cannot raise), the noise samples (the model's
cost) are skipped and the ratio reported is that upper bound (``Verdict.upper_bound``: a run's
closest pass says so when it is one). Every other verdict is made with the noise; and a failing one
that is not :func:`gross` is rechecked with more and full-scale samples before it is reported (a
gross one first gets a full-scale pair, which sees a rounding that flips a sign: it may not stay gross)
(a pass too with ``DecideConfig.recheck``: a clean run's closest pass, looked at again).

It describes and never raises a finding (:mod:`shardfuzz.report.findings` does); an output a rank
returned as None where the oracle has a value is a layout problem of the verdict (an expert that got
no tokens left its gradient None: the implementation's to answer for, found and shrunk).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from shardfuzz.case import Case
from shardfuzz.errors import InvalidArgument, Unsupported
from shardfuzz.protocol import Reply, decode
from shardfuzz.spec.tolerance import Tolerance
from shardfuzz.verdict.judge import Verdict, judge
from shardfuzz.verdict.oracle import Expected, confirm_noise, estimate_noise, search_flips, widen_full_scale

#: a pass this far within the bound without the noise term needs no noise samples (see the module)
SURE_PASS = 1.0
#: a mismatch this far past the bound, and by this share of the output's largest value, is no
#: rounding: more samples cannot pass it (the recheck costs 12 oracle runs per failing example)
GROSS_RATIO, GROSS_SHARE = 100.0, 0.25
#: the full-scale runs (one antithetic pair) a gross failure gets before it skips the recheck
FLIP_PROBE = 2


@dataclasses.dataclass(frozen=True)
class DecideConfig:
    """What a verdict depends on besides the case, the replies and the oracle's values."""

    target: Any  # the shardfuzz.Target: its outputs' layouts, and its oracle for noise samples
    tolerance: Tolerance  # the run's: the target's per-output overrides, then the run's own
    closest_pass: float = 0.0  # the worst error/tolerance of the run's passing examples so far
    #: judge every verdict with the noise term (``shardfuzz case``: one case, its true ratios)
    always_noise: bool = False
    #: widen the noise with the recheck's samples for a pass too, as for a failure before it is
    #: reported (a clean run's closest pass, looked at again: how near a report it really came)
    recheck: bool = False


def decide(case: Case, replies: list[Reply], expected: Expected, config: DecideConfig) -> Verdict:
    """The verdict of every rank's :class:`Reply` on ``case`` against ``expected`` (noise samples
    are drawn into ``expected`` where the verdict needs them)."""
    unit = config.tolerance.judged_dtype(case.dtype)
    if expected.source is not None:  # a self-oracle: its values now, the ranks being done
        if unit != case.dtype:  # its noise is drawn on a rank, in the case dtype's unit
            raise InvalidArgument(
                f"precision={unit!r}: a target whose oracle is its own implementation (oracle=SELF) "
                "is judged in the case dtype's rounding; run its cases in that dtype (--dtypes)"
            )
        expected.source.values(expected)
    expected.unit_dtype = unit if unit != case.dtype else None
    ignored = {r: list(rep.ignored_collectives) for r, rep in enumerate(replies) if rep.ignored_collectives}
    locals_ = [decode(rep.outputs) for rep in replies]
    outputs, tol = config.target.outputs_for(case), config.tolerance
    verdict = judge(case, outputs, locals_, expected, tol, ignored)
    sure = verdict.passed and verdict.worst <= max(SURE_PASS, config.closest_pass) and not config.always_noise
    if tol.noise_model != "mca" or not verdict.diffs:
        return verdict
    if sure:
        return dataclasses.replace(verdict, upper_bound=not expected.noise)
    if not expected.noise:
        estimate_noise(config.target, case, expected, tol.samples, outputs)
        verdict = judge(case, outputs, locals_, expected, tol, ignored)
    probe, first_order = min(FLIP_PROBE, tol.full_scale_samples), None
    if not verdict.passed and probe and gross(verdict, expected):
        # a rounding that flips a sign or a branch can be gross too (an Adam update is lr * sign(g)
        # where g cancels: FSDP2's own step, right, was reported at 1.45e6x in float64 without a
        # recheck): the full-scale pair sees a flip within reach; only a failure still gross after
        # it skips the recheck (none with full_scale_samples=0: the user turned them off)
        first_order = dict(expected.noise)
        widen_full_scale(config.target, case, expected, probe, outputs)
        verdict = judge(case, outputs, locals_, expected, tol, ignored)
    # a failure is rechecked before it is reported; with ``recheck`` a pass too
    if (config.recheck or not verdict.passed) and not gross(verdict, expected):
        if first_order is not None:
            # the recheck pools first-order samples with the first ones (the probe's widened noise
            # counted as first order, up to 1.29x wider); its full-scale runs repeat the probe's pair
            expected.noise = first_order
        confirm_noise(config.target, case, expected, tol, outputs)
        verdict = judge(case, outputs, locals_, expected, tol, ignored)
        if not verdict.passed and _noise_judged(verdict, expected, tol):
            # still failing: more full-scale pairs look only for a flip the first pairs missed
            judged = [verdict]

            def passes() -> bool:
                judged.append(judge(case, outputs, locals_, expected, tol, ignored))
                return judged[-1].passed

            search_flips(config.target, case, expected, tol, outputs, passes)
            verdict = judged[-1]
    if not verdict.passed:
        _refuse_beyond_range(config.target, case, verdict)
    return verdict


def _refuse_beyond_range(target: Any, case: Case, verdict: Verdict) -> None:
    """Unsupported when every wrong element is an overflow that a correct computation can make:
    not finite where the oracle is, with terms summed into it that reach past the dtype's range
    (:func:`shardfuzz.verdict.compare._note_beyond_range`). Like an oracle that overflows the case
    dtype, the case is counted, never judged: a sum whose order the oracle does not fix (each
    rank's partial sum, then the all-reduce's) has no value in that dtype to hold the
    implementation to."""
    if verdict.layout_problems or verdict.ignored or not verdict.mismatched:
        return
    rds = [rd for od in verdict.mismatched for rd in od.ranks if rd.bad]
    if not rds or any(rd.beyond_range < rd.bad for rd in rds):
        return
    name = next(od.name for od in verdict.mismatched if any(rd.bad for rd in od.ranks))
    reach = max(rd.beyond_reach for rd in rds)
    raise Unsupported(
        f"target {target.name!r}: output {name!r} is not finite where the oracle's is, and the terms "
        f"summed into it reach about {reach:.3g}, past the largest finite value of its dtype: summed "
        "in another order (each rank's partial sum, then the all-reduce's), a correct computation "
        f"overflows there too, so the case is counted, never judged ({case.dtype} has no headroom for it)",
        reason=BEYOND_RANGE,
    )


#: the reason a case whose terms reach past its dtype's range is counted under
BEYOND_RANGE = "the terms of an output reach past the case dtype's range"


def _noise_judged(verdict: Verdict, expected: Expected, tol: Tolerance) -> bool:
    """Whether some output that fails is judged with the noise (floating, no fixed tolerance): only
    there can more samples change the verdict."""
    if verdict.layout_problems or verdict.ignored:
        return False
    for od in verdict.mismatched:
        ref = expected.ref.get(od.name)
        if tol.for_output(od.name) is None and isinstance(ref, torch.Tensor) and ref.is_floating_point():
            return True
    return False


def gross(verdict: Verdict, expected: Expected) -> bool:
    """Whether some output is wrong by more than ``GROSS_RATIO`` times its bound and by more than
    ``GROSS_SHARE`` of its largest reference value (or non-finite where the reference is not)."""
    for od in verdict.mismatched:
        ref = expected.ref.get(od.name)
        if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or od.max_ratio < GROSS_RATIO:
            continue
        finite = ref[torch.isfinite(ref)].abs()
        scale = float(finite.max()) if finite.numel() else 0.0
        err = max((r.max_abs for r in od.ranks), default=0.0)
        if not math.isfinite(err) or (scale > 0 and err > GROSS_SHARE * scale):
            return True
    return False
