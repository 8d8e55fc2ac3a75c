"""Power and cost of a noise model (the tolerance's ``noise_model``), measured on the built-in targets.

    python benchmarks/noise_power.py power [TARGET ...] [--effective 200] [--max-cases 2000]
        [--dtypes float32,bfloat16,float64] [--model mca|dtype-rerun] [--seed S]
    python benchmarks/noise_power.py false-positives [TARGET-or-FILE ...] [--examples 500] [--model ...]
    python benchmarks/noise_power.py cost [TARGET ...] [--examples 200] [--block 10] [--warmup 6]

``power``: for every planted bug of every (given) built-in target and every dtype, cases are drawn
from the target's strategy restricted to that dtype. A case is *effective* for the bug when the
planted implementation, run on the same case in float64, is off the float64 oracle by more than 5%
of an output's scale (its largest absolute reference value) somewhere, or gives a wrong exact
output, or fails in a way other than a mismatch (layout, rank error, hang, ignored collective). An
effective case *fails* when the planted implementation run in the case's own dtype under the chosen
model gives any finding. One line per bug and dtype: drawn, effective, failed, share failed, the
finding kinds; shares below 95% (float32, float64) or 90% (bfloat16, float16) are flagged LOW with
the first effective case that passed. A bug/dtype stops after ``--effective`` effective cases or
``--max-cases`` drawn ones.

``false-positives``: the reference of each built-in target (or of a ``file.py`` target), on
``--examples`` cases drawn with random seeds in the target's own dtypes, every case run (no stop at
the first failure): failures, the worst failing error/tolerance and its case, the closest pass,
examples/s (pool starts included).

``cost``: the same cases (drawn once) through two runners of the reference, one per noise model,
alternated in blocks (the order flips every block) after untimed warm-up cases on warm pools:
examples/s of each and the ratio of throughputs (mca / dtype-rerun). Default targets: tp_mlp
ring_attention.

Cases are drawn inside a ``@given`` test (random seeds unless ``--seed``); run in the same process
as the pools (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import random
import re
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

#: the share of effective cases a model must fail, per dtype, below which a line is flagged
THRESHOLDS = {"float32": 95.0, "float64": 95.0, "bfloat16": 90.0, "float16": 90.0}
#: a float64 difference above this share of the output's scale makes a case effective
EFFECT = 0.05


# -- drawing cases ---------------------------------------------------------------------------------
def draw_cases(strategy: Any, n: int, seed: int | None = None) -> list:
    """Up to ``n`` distinct random cases of ``strategy`` (shardfuzz's one sampler,
    :func:`shardfuzz.spec.sampling.draw_pool`); a fresh random seed when ``seed`` is None."""
    from shardfuzz.spec.sampling import draw_pool

    return [case for case, _ in draw_pool(strategy, random.randrange(2**63) if seed is None else seed, n)]


class CaseStream:
    """Distinct cases of one strategy, drawn in batches on demand and shared by every reader."""

    def __init__(self, strategy: Any, seed: int | None = None) -> None:
        self.strategy, self.seed = strategy, seed
        self.cases: list = []
        self.seen: set = set()
        self.batches = 0
        self.exhausted = False

    def get(self, i: int, batch: int) -> Any:
        """The ``i``-th case (None when the strategy gives no more)."""
        while i >= len(self.cases) and not self.exhausted:
            seed = None if self.seed is None else self.seed + self.batches
            self.batches += 1
            fresh = [c for c in draw_cases(self.strategy, max(batch, 20), seed) if c not in self.seen]
            for c in fresh:
                self.seen.add(c)
                self.cases.append(c)
            self.exhausted = not fresh
        return self.cases[i] if i < len(self.cases) else None


# -- the runners ------------------------------------------------------------------------------------
def capture_runner_class():
    from shardfuzz.engine.runner import Runner

    class CaptureRunner(Runner):
        """A runner that keeps the last verdict and oracle values it judged."""

        last: tuple | None = None

        def verdict(self, case, replies, expected):
            v = super().verdict(case, replies, expected)
            self.last = (v, expected)
            return v

    return CaptureRunner


def make_config(model: str, timeout: float | None = None, dtypes: tuple[str, ...] | None = None):
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.spec.tolerance import Tolerance

    return RunConfig(tolerance=Tolerance(noise_model=model), timeout=timeout, dtypes=dtypes)


def float64_effect(verdict: Any, expected: Any) -> float:
    """The largest float64 error over the outputs, as a share of each output's scale (its largest
    absolute reference value); inf for a wrong exact output or a non-finite mismatch."""
    import torch

    if verdict.ignored or verdict.layout_problems:
        return math.inf
    worst = 0.0
    for od in verdict.diffs:
        ref = expected.ref.get(od.name)
        if isinstance(ref, torch.Tensor) and (ref.is_floating_point() or ref.is_complex()):
            finite = ref[torch.isfinite(ref)].abs()
            scale = float(finite.max()) if finite.numel() else 0.0
            case_scale = expected.case_scale() if callable(expected.case_scale) else expected.case_scale
            scale = scale or float(case_scale or 0.0)
            err = max((r.max_abs for r in od.ranks), default=0.0)
            if err > 0:
                worst = max(worst, err / scale if scale > 0 else math.inf)
        elif od.bad:
            worst = math.inf
    return worst


def header(title: str, args: Any) -> None:
    import torch

    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"# noise_power {title}: model={getattr(args, 'model', 'mca vs dtype-rerun')}, loadavg {load}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        flush=True,
    )


# -- power ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class PowerRow:
    drawn: int = 0
    effective: int = 0
    failed: int = 0
    refused: int = 0
    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    missed: Any = None  # (case, effect, ratio) of the first effective case that passed

    @property
    def share(self) -> float:
        return 100.0 * self.failed / self.effective if self.effective else math.nan


def measure_power(stream: CaseStream, args: Any, runners: tuple) -> PowerRow:
    from shardfuzz.errors import ExternalFault, Finding, Unsupported

    f64, low = runners
    row = PowerRow()
    i = 0
    while row.effective < args.effective and row.drawn < args.max_cases:
        case = stream.get(i, 4 * (args.effective - row.effective))
        i += 1
        if case is None:
            break
        row.drawn += 1
        f64.last = None
        try:
            f64.run_case(dataclasses.replace(case, dtype="float64"))
            effect = float64_effect(*f64.last)
        except Finding as f:
            effect = float64_effect(*f64.last) if f.kind == "mismatch" and f64.last else math.inf
        except (Unsupported, ExternalFault):
            row.refused += 1
            continue
        if not effect > EFFECT:
            continue
        try:
            ratio = low.run_case(case)
        except Finding as f:
            row.effective += 1
            row.failed += 1
            row.kinds[f.kind] += 1
            continue
        except (Unsupported, ExternalFault):
            row.refused += 1
            continue
        row.effective += 1
        if row.missed is None:
            row.missed = (case, effect, ratio)
    return row


def cmd_power(args: Any) -> int:
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    CaptureRunner = capture_runner_class()
    from shardfuzz.engine.runner import Runner

    names = args.targets or sorted(BUILTIN_TARGETS)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    header("power", args)
    print(
        f"# effective: float64 run off the float64 oracle by > {100 * EFFECT:g}% of an output's scale, "
        f"or failing otherwise than a mismatch; stop at {args.effective} effective or {args.max_cases} drawn"
    )
    cols = f"{'target':<16} {'bug':<24} {'dtype':<9} {'drawn':>6} {'effect':>6} {'failed':>6} {'share':>7}"
    print(f"{cols}  {'time':>6}  kinds")
    low_rows = 0
    for name in names:
        target = get_target(name)
        streams = {d: CaseStream(target.strategy(None, (d,)), args.seed) for d in dtypes}
        for bug_name, bug in target.planted.items():
            if not set(bug.expect.kinds) & set(args.kinds.split(",")) or re.search(args.exclude, bug_name):
                continue
            timeout = bug.expect.timeout
            f64 = CaptureRunner(target, bug_name, make_config("dtype-rerun", timeout))
            low = Runner(target, bug_name, make_config(args.model, timeout))
            for dtype in dtypes:
                t0 = time.perf_counter()
                row = measure_power(streams[dtype], args, (f64, low))
                flag = ""
                if row.effective and row.share < THRESHOLDS.get(dtype, 95.0):
                    flag, low_rows = "  LOW", low_rows + 1
                share = f"{row.share:.1f}%" if row.effective else "-"
                kinds = ",".join(f"{k}:{v}" for k, v in sorted(row.kinds.items())) or "-"
                if row.refused:
                    kinds += f" (refused {row.refused})"
                print(
                    f"{target.name:<16} {bug_name:<24} {dtype:<9} {row.drawn:>6} {row.effective:>6} "
                    f"{row.failed:>6} {share:>7}  {time.perf_counter() - t0:>5.0f}s  {kinds}{flag}",
                    flush=True,
                )
                if flag and row.missed is not None:
                    case, effect, ratio = row.missed
                    print(f"    passed: effect {effect:.3g} of scale, error/tolerance {ratio:.3g}: {case!r}")
    print(f"# {low_rows} line(s) below threshold")
    return 0


# -- false positives -----------------------------------------------------------------------------
def cmd_false_positives(args: Any) -> int:
    from shardfuzz.engine.runner import Runner
    from shardfuzz.errors import ExternalFault, Finding, Unsupported
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    specs = args.targets or sorted(BUILTIN_TARGETS)
    header("false-positives", args)
    print(
        f"{'target':<24} {'examples':>8} {'failures':>8} {'closest pass':>12} {'worst fail':>10} "
        f"{'ex/s':>6} {'time':>6}  dtypes"
    )
    bad = 0
    for spec in specs:
        target = get_target(spec)
        runner = Runner(target, None, make_config(args.model))
        cases = draw_cases(runner.strategy(), args.examples, args.seed)
        fails: list = []
        closest, refused, run_s = 0.0, 0, 0.0
        dts: collections.Counter = collections.Counter()
        t0 = time.perf_counter()
        for case in cases:
            t1 = time.perf_counter()
            try:
                closest = max(closest, runner.run_case(case))
            except Finding as f:
                fails.append((f.ratio if f.ratio is not None else math.inf, f.kind, case))
            except (Unsupported, ExternalFault):
                refused += 1
                continue
            finally:
                run_s += time.perf_counter() - t1
            dts[case.dtype] += 1
        n = sum(dts.values())
        worst = max(fails, key=lambda x: x[0]) if fails else None
        bad += len(fails)
        print(
            f"{target.name:<24} {n:>8} {len(fails):>8} {closest:>12.3g} "
            f"{(f'{worst[0]:.3g}' if worst else '-'):>10} {n / run_s if run_s else 0:>6.1f} "
            f"{time.perf_counter() - t0:>5.0f}s  "
            + " ".join(f"{d} {c}" for d, c in sorted(dts.items()))
            + (f" (refused {refused})" if refused else ""),
            flush=True,
        )
        if worst:
            kinds = collections.Counter(k for _, k, _ in fails)
            print(f"    worst failure ({', '.join(f'{k} x{v}' for k, v in kinds.items())}): {worst[2]!r}")
    print(f"# {bad} failure(s) in all")
    return 0


# -- cost -------------------------------------------------------------------------------------------
def cmd_cost(args: Any) -> int:
    from shardfuzz.engine.runner import Runner
    from shardfuzz.spec.registry import get_target

    models = ("mca", "dtype-rerun")
    header("cost", args)
    print(
        f"{'target':<16} {'examples':>8} {'mca ex/s':>9} {'rerun ex/s':>10} {'mca/rerun':>9} "
        f"{'mca fail':>8} {'rerun fail':>10}"
    )
    for name in args.targets:
        target = get_target(name)
        runners = {m: Runner(target, None, make_config(m)) for m in models}
        cases = draw_cases(runners["dtype-rerun"].strategy(), args.examples + args.warmup, args.seed)
        by_world: dict[int, Any] = {}
        for c in cases:
            by_world.setdefault(c.world_size, c)
        warm = list(by_world.values()) + cases[: args.warmup]
        timed = cases[args.warmup :]
        broken = _warm_up(runners, warm)
        if broken:
            print(f"{target.name:<16} model unusable: {broken}", flush=True)
            continue
        spent, count, fails = _timed_blocks(runners, timed, args.block)
        rate = {m: count[m] / spent[m] if spent[m] else 0.0 for m in models}
        ratio = rate["mca"] / rate["dtype-rerun"] if rate["dtype-rerun"] else math.nan
        print(
            f"{target.name:<16} {count['dtype-rerun']:>8} {rate['mca']:>9.1f} {rate['dtype-rerun']:>10.1f} "
            f"{ratio:>9.2f} {fails['mca']:>8} {fails['dtype-rerun']:>10}",
            flush=True,
        )
    return 0


def _warm_up(runners: dict[str, Any], warm: list) -> str | None:
    """Run the ``warm`` cases (one per world size first) through every runner, untimed: every pool
    is started and the target imported in its ranks before the clock runs. Returns why a model is
    unusable (the last error other than a finding, a refused case or an external fault), else None."""
    from shardfuzz.errors import ExternalFault, Finding, Unsupported

    broken = None
    for case in warm:
        for m, r in runners.items():
            try:
                r.run_case(case)
            except (Finding, Unsupported, ExternalFault):
                pass
            except Exception as e:  # noqa: BLE001 (the model itself fails, however: say so and move on)
                broken = f"{m}: {type(e).__name__}: {e}"
    return broken


def _timed_blocks(
    runners: dict[str, Any], timed: list, block_size: int
) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """Each model's time, examples run and failures on the ``timed`` cases, run in blocks of
    ``block_size`` cases whose model order flips every block (a drift of the machine's speed falls
    on both models alike). A refused case (unsupported, external fault) is neither timed nor counted."""
    from shardfuzz.errors import ExternalFault, Finding, Unsupported

    models = tuple(runners)
    spent = dict.fromkeys(models, 0.0)
    count = dict.fromkeys(models, 0)
    fails = dict.fromkeys(models, 0)
    for b, start in enumerate(range(0, len(timed), block_size)):
        block = timed[start : start + block_size]
        for m in models if b % 2 == 0 else models[::-1]:
            for case in block:
                t0 = time.perf_counter()
                try:
                    runners[m].run_case(case)
                except Finding:
                    fails[m] += 1
                except (Unsupported, ExternalFault):
                    continue
                spent[m] += time.perf_counter() - t0
                count[m] += 1
    return spent, count, fails


def main(argv=None) -> int:
    from shardfuzz.spec.tolerance import NOISE_MODELS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pw = sub.add_parser("power", help="share of effective planted-bug cases each model fails")
    pw.add_argument("targets", nargs="*", help="built-in target names (default: all)")
    pw.add_argument("--effective", type=int, default=200, help="stop a bug/dtype after N effective cases")
    pw.add_argument("--max-cases", type=int, default=2000, help="... or after M drawn cases")
    pw.add_argument("--dtypes", default="float32,bfloat16,float64")
    pw.add_argument(
        "--kinds",
        default="mismatch",
        help="planted bugs whose expected finding is one of these (comma-separated)",
    )
    pw.add_argument(
        "--exclude",
        default="^bf16_",
        help="skip bugs matching this regex (default: the bf16-only ones, never effective: their float64 run is the reference)",
    )
    fp = sub.add_parser("false-positives", help="failures of the references (every case run)")
    fp.add_argument("targets", nargs="*", help="target names or file.py paths (default: all built-ins)")
    fp.add_argument("--examples", type=int, default=500)
    co = sub.add_parser("cost", help="throughput of the two models on the same cases")
    co.add_argument("targets", nargs="*", default=["tp_mlp", "ring_attention"])
    co.add_argument("--examples", type=int, default=200)
    co.add_argument("--block", type=int, default=10, help="cases per block; the order flips every block")
    co.add_argument("--warmup", type=int, default=6, help="untimed cases first (plus one per world size)")
    for s in (pw, fp):
        s.add_argument("--model", choices=NOISE_MODELS, default="mca")
    for s in (pw, fp, co):
        s.add_argument("--seed", type=int, default=None, help="Hypothesis seed for drawing (default: random)")
    args = p.parse_args(argv)
    return {"power": cmd_power, "false-positives": cmd_false_positives, "cost": cmd_cost}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
