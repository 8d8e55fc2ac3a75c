"""The ``shardfuzz`` command.

Exit codes: 0 nothing found (replay: everything passes), 1 a counterexample was found (replay: a
case still fails), 2 a usage error, 3 the fuzzer itself failed (a pool would not start, too few
GPUs, ...). An interrupted campaign exits 1 if it found something, else 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from shardfuzz import campaign, failures
from shardfuzz.case import Case
from shardfuzz.config import BACKENDS, DEVICES, PROFILES, RunConfig, parse_world_sizes
from shardfuzz.errors import Finding, InfrastructureError, InvalidArgument, ShardfuzzError, Unsupported
from shardfuzz.failures import FailureRecorder
from shardfuzz.gpu import placement_summary
from shardfuzz.registry import BUILTIN_TARGETS, available_targets, get_target
from shardfuzz.replay import replay_one
from shardfuzz.runner import Runner
from shardfuzz.torchrun import write_repro

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_INFRA, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_world_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--world-sizes={e}") from None


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


def _duration(text: str) -> float:
    try:
        return campaign.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardfuzz",
        description="Differential fuzzing of sharded PyTorch code against a single-process oracle.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="list targets and their implementations")
    sub.add_parser("gpus", help="say which targets and world sizes can run on this machine's GPUs")

    where = _Parser(add_help=False)
    where.add_argument("--backend", default=None, choices=BACKENDS, help="default: gloo (replay: the file's)")
    where.add_argument("--device", default=None, choices=DEVICES, help="default: cuda for nccl, else cpu")
    where.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help="fixed per-example timeout in seconds (default: adaptive)",
    )
    where.add_argument(
        "--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True) on every rank"
    )

    impl = _Parser(add_help=False)
    impl.add_argument(
        "--impl",
        default=None,
        help="implementation name, 'pkg.mod:func' or 'file.py::NAME' (default: the reference)",
    )

    f = sub.add_parser(
        "fuzz", parents=[impl, where], help="fuzz targets (default: every built-in target's reference)"
    )
    f.add_argument(
        "targets", nargs="*", metavar="TARGET", help="target names, 'pkg.mod:ATTR' or file.py paths"
    )
    budget = f.add_mutually_exclusive_group()
    budget.add_argument(
        "--max-examples",
        type=_positive_int,
        default=None,
        help="examples per target (default: the profile's)",
    )
    budget.add_argument(
        "--duration",
        type=_duration,
        default=None,
        metavar="TIME",
        help="fuzz each target for TIME (90s, 10m, 1.5h): successive Hypothesis runs with fresh seeds",
    )
    f.add_argument("--world-sizes", type=_world_sizes, default=None, metavar="N,N,...")
    f.add_argument("--profile", default="shardfuzz-dev", choices=PROFILES)
    f.add_argument(
        "--failures-dir",
        default=None,
        metavar="DIR",
        help="where failure files go (default: .shardfuzz/failures)",
    )
    f.add_argument(
        "--jobs", type=_positive_int, default=1, help="targets fuzzed side by side in child processes"
    )
    f.add_argument(
        "--rank-budget",
        type=_positive_int,
        default=None,
        help="ranks in use at once across jobs (default: the number of cores)",
    )
    f.add_argument("--progress-every", type=_positive_float, default=2.0, metavar="SECONDS")
    f.add_argument("--summary-json", default=None, help=argparse.SUPPRESS)
    f.add_argument(
        "--config-json", default=None, help=argparse.SUPPRESS
    )  # child jobs: the parent's RunConfig

    c = sub.add_parser(
        "case", parents=[impl, where], help="rerun exactly one case (the last line of a report)"
    )
    c.add_argument("target", metavar="TARGET")
    c.add_argument("case", metavar="CASE", help="Case(...) as printed in a report")

    r = sub.add_parser("replay", parents=[where], help="rerun the cases in failure files")
    r.add_argument("paths", nargs="+", metavar="FILE|DIR")
    r.add_argument(
        "--debug-collectives",
        action="store_true",
        help="rerun with torch's collective checking (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
    )

    rp = sub.add_parser("repro", help="write a standalone torchrun script for one failure file")
    rp.add_argument("file", metavar="FILE")
    rp.add_argument("-o", "--output", default="repro.py")
    return p


def _cmd_list() -> int:
    for name in sorted(available_targets()):
        t = get_target(name)
        print(f"{t.name}: {t.description}")
        for impl in t.implementations:
            print(f"  {impl:<24} {t.role(impl)}")
    return EXIT_OK


def _config(args: Any, **extra: Any) -> RunConfig:
    """The run configuration of a command line (the only place flags become a RunConfig)."""
    return RunConfig(
        backend=args.backend or "gloo",
        device=args.device,
        timeout=args.timeout,
        deterministic=args.deterministic,
        **extra,
    )


def _cmd_fuzz(args: Any) -> int:
    targets = args.targets or sorted(BUILTIN_TARGETS)
    if args.config_json:
        config = RunConfig.from_json(args.config_json)
    else:
        config = _config(
            args,
            world_sizes=args.world_sizes,
            profile=args.profile,
            max_examples=args.max_examples,
            deadline=args.duration,
            failures_dir=args.failures_dir,
        )
    # resolve every target and implementation first: a typo is a usage error before any fuzzing
    for spec in targets:
        Runner(spec, args.impl, config, target_spec=spec)
    if args.jobs > 1 and len(targets) > 1:
        return _fuzz_jobs(args, targets, config)
    recorder = FailureRecorder(config.failures_dir)
    outcomes = []
    interrupted = False
    for spec in targets:
        print(
            f"fuzzing {spec} ({args.impl or 'reference'}) on {config.backend}/{config.device} ...", flush=True
        )
        out = campaign.fuzz_one(
            spec,
            args.impl,
            config,
            target_spec=spec,
            recorder=recorder,
            stream=sys.stdout,
            interval=args.progress_every,
        )
        outcomes.append(out)
        if out.result is not None and out.result.found:
            print(f"\n{out.result.report}\n", flush=True)
        if out.interrupted:
            interrupted = True
            break
    rows = [o.row() for o in outcomes]
    print("\n" + campaign.summary_table(rows), flush=True)
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(rows, fh)
    found = any(r["found"] for r in rows)
    if interrupted:
        print("shardfuzz: interrupted; failures found so far are in their failure files", file=sys.stderr)
        return EXIT_FOUND if found else EXIT_INTERRUPTED
    return EXIT_FOUND if found else EXIT_OK


def _fuzz_jobs(args: Any, targets: list[str], config: RunConfig) -> int:
    base = [sys.executable, "-m", "shardfuzz.cli", "fuzz"]
    opts = ["--config-json", config.to_json(), "--progress-every", str(args.progress_every)]
    if args.impl is not None:
        opts += ["--impl", args.impl]
    jobs = [[*base, spec, *opts] for spec in targets]
    cost = campaign.job_cost(config.world_sizes)
    budget = args.rank_budget or os.cpu_count() or 1
    print(
        f"running {len(jobs)} jobs, up to {args.jobs} at once within {budget} ranks (each job uses up to {cost})",
        flush=True,
    )
    try:
        rows = campaign.run_jobs(jobs, [cost] * len(jobs), budget, args.jobs)
    except KeyboardInterrupt:
        print("shardfuzz: interrupted; failures found so far are in their failure files", file=sys.stderr)
        return EXIT_INTERRUPTED
    print("\n" + campaign.summary_table(rows), flush=True)
    return EXIT_FOUND if any(r["found"] for r in rows) else EXIT_OK


def _cmd_case(args: Any) -> int:
    case = Case.parse(args.case)
    runner = Runner(args.target, args.impl, _config(args), target_spec=args.target)
    try:
        ratio = runner.run_case(case)
    except Unsupported as e:
        print(f"UNSUPPORTED: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Finding as f:
        print(f"FAIL ({f.kind})\n{f.report}")
        return EXIT_FOUND
    print(f"PASS: {case!r}\n  worst error/tolerance {ratio:.3g} ({runner.config.tolerance.describe()})")
    return EXIT_OK


def _cmd_replay(args: Any) -> int:
    paths = failures.find_files(args.paths)
    if not paths:
        print(f"shardfuzz: error: no failure files (*.json) in {args.paths}", file=sys.stderr)
        return EXIT_USAGE
    records = [failures.load(p) for p in paths]  # validate them all before running any
    still = 0
    for rec in records:
        res = replay_one(
            rec,
            backend=args.backend,
            device=args.device,
            debug_collectives=args.debug_collectives,
            deterministic=args.deterministic or None,
            timeout=args.timeout,
        )
        print(res.line(), flush=True)
        if res.failed:
            still += 1
            print(res.report + "\n", flush=True)
    print(f"{len(records)} replayed: {still} fail, {len(records) - still} pass")
    return EXIT_FOUND if still else EXIT_OK


def _cmd_repro(args: Any) -> int:
    record = failures.load(args.file)
    path = write_repro(record, args.output)
    n = record["case"].world_size
    print(f"wrote {path}; run it with: torchrun --nproc-per-node={n} {path} [--backend nccl]")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            return _cmd_list()
        if args.command == "gpus":
            print(placement_summary())
            return EXIT_OK
        if args.command == "fuzz":
            return _cmd_fuzz(args)
        if args.command == "case":
            return _cmd_case(args)
        if args.command == "replay":
            return _cmd_replay(args)
        if args.command == "repro":
            return _cmd_repro(args)
    except InvalidArgument as e:
        print(f"shardfuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (InfrastructureError, ShardfuzzError) as e:
        print(f"shardfuzz: the fuzzer itself failed: {e}", file=sys.stderr)
        return EXIT_INFRA
    except KeyboardInterrupt:
        print("shardfuzz: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
