"""The ``shardfuzz`` command.

Exit codes: 0 nothing found, 1 a counterexample was found (its report is printed), 2 a usage
error, 3 the fuzzer itself failed (a pool would not start, too few GPUs, ...).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_INFRA = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors already; keep its message
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"--world-sizes={text!r}; expected comma-separated integers >= 1")
    return sizes


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardfuzz",
        description="Differential fuzzing of sharded PyTorch code against a single-process oracle.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="list targets and their implementations")

    common = _Parser(add_help=False)
    common.add_argument(
        "--impl",
        default=None,
        help="implementation name, 'pkg.mod:func' or 'file.py::NAME' (default: the reference)",
    )
    common.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    common.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help="fixed per-example timeout in seconds (default: adaptive)",
    )

    f = sub.add_parser(
        "fuzz", parents=[common], help="fuzz targets (default: every built-in target's reference)"
    )
    f.add_argument(
        "targets", nargs="*", metavar="TARGET", help="target names, 'pkg.mod:ATTR' or file.py paths"
    )
    f.add_argument(
        "--max-examples",
        type=_positive_int,
        default=None,
        help="examples per target (default: the profile's)",
    )
    f.add_argument("--world-sizes", type=_world_sizes, default=None, metavar="N,N,...")
    f.add_argument(
        "--profile", default="shardfuzz-dev", choices=("shardfuzz-ci", "shardfuzz-dev", "shardfuzz-fuzz")
    )

    c = sub.add_parser("case", parents=[common], help="rerun exactly one case (the last line of a report)")
    c.add_argument("target", metavar="TARGET")
    c.add_argument("case", metavar="CASE", help="Case(...) as printed in a report")
    return p


def _cmd_list() -> int:
    from shardfuzz.registry import available_targets, get_target

    for name in sorted(available_targets()):
        t = get_target(name)
        print(f"{t.name}: {t.description}")
        for impl in t.implementations:
            if impl == t.reference:
                tag = "reference"
            elif impl in t.planted:
                tag = f"planted bug: {t.planted[impl]}"
            elif impl in t.expected_failures:
                tag = f"expected failure: {t.expected_failures[impl]}"
            else:
                tag = "implementation"
            print(f"  {impl:<24} {tag}")
    return EXIT_OK


def _cmd_fuzz(args) -> int:
    from shardfuzz.engine import Runner, run
    from shardfuzz.registry import BUILTIN_TARGETS

    targets = args.targets or sorted(BUILTIN_TARGETS)
    # resolve every target and implementation first: a typo is a usage error before any fuzzing
    runners = [
        Runner(
            spec,
            args.impl,
            backend=args.backend,
            timeout=args.timeout,
            world_sizes=args.world_sizes,
            target_spec=spec,
        )
        for spec in targets
    ]
    found = False
    rows = []
    for spec, runner in zip(targets, runners):
        t0 = time.perf_counter()
        print(f"fuzzing {spec} ({runner.impl_name}) on {args.backend} ...", flush=True)
        result = run(runner.target, max_examples=args.max_examples, profile=args.profile, runner=runner)
        print(f"  {result.stats.summary()}", flush=True)
        if result.found:
            found = True
            print(f"\n{result.report}\n", flush=True)
        rows.append(
            (
                result.target,
                result.impl,
                result.kind or "-",
                result.stats.examples,
                result.stats.per_second,
                time.perf_counter() - t0,
            )
        )
    print(f"\n{'target':<18} {'implementation':<24} {'found':<18} {'examples':>8} {'ex/s':>7} {'time':>7}")
    for r in rows:
        print(f"{r[0]:<18} {r[1]:<24} {r[2]:<18} {r[3]:>8} {r[4]:>7.1f} {r[5]:>6.1f}s")
    return EXIT_FOUND if found else EXIT_OK


def _cmd_case(args) -> int:
    from shardfuzz.case import Case
    from shardfuzz.engine import Runner
    from shardfuzz.errors import Finding, Unsupported

    case = Case.parse(args.case)
    runner = Runner(
        args.target, args.impl, backend=args.backend, timeout=args.timeout, target_spec=args.target
    )
    try:
        ratio = runner.run_case(case)
    except Unsupported as e:
        print(f"UNSUPPORTED: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Finding as f:
        print(f"FAIL ({f.kind})\n{f.report}")
        return EXIT_FOUND
    print(f"PASS: {case!r}\n  worst error/tolerance {ratio:.3g} ({runner.tolerance.describe()})")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    from shardfuzz.errors import InfrastructureError, InvalidArgument, ShardfuzzError

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            return _cmd_list()
        if args.command == "fuzz":
            return _cmd_fuzz(args)
        if args.command == "case":
            return _cmd_case(args)
    except InvalidArgument as e:
        print(f"shardfuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (InfrastructureError, ShardfuzzError) as e:
        print(f"shardfuzz: the fuzzer itself failed: {e}", file=sys.stderr)
        return EXIT_INFRA
    except KeyboardInterrupt:
        print("shardfuzz: interrupted", file=sys.stderr)
        return 130
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
