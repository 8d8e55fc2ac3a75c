"""The ``shardfuzz`` command.

Exit codes: 0 nothing found (replay: everything passes), 1 a counterexample was found (replay: a
case still fails), 2 a usage error, 3 the fuzzer itself failed (a pool would not start, too few
GPUs, ...). An interrupted campaign (Ctrl-C or SIGTERM) prints what it found and exits 1 if it
found something, else 130.

A start-up seam: the module imports only what parsing a command line needs (what ``cli_args``
loads anyway), none of which imports torch or Hypothesis; each command imports the engine it runs.
So ``shardfuzz --help`` and a usage error stay fast, torch loads only after :func:`main` has set
``OMP_NUM_THREADS``, and a command that runs ranks starts their forkserver before it imports the
engine, so that the forkserver's preload overlaps with the driver's own import of torch.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from shardfuzz.case import Case
from shardfuzz.engine.config import RunConfig, check_exclude_keys, check_tolerance_outputs
from shardfuzz.engine.hooks import grace_seconds
from shardfuzz.engine.shared_db import RedisLost, connect, env_fleet, is_redis_url, redact
from shardfuzz.errors import (
    CaseOutsideBounds,
    Finding,
    InfrastructureError,
    InvalidArgument,
    Mismatch,
    ShardfuzzError,
    ShardfuzzWarning,
    Unsupported,
)
from shardfuzz.frontends.cli_args import (
    EXIT_FOUND,
    EXIT_INFRA,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    build_parser,
)
from shardfuzz.frontends.jobs import die_with_parent, how_it_ended, job_cost, run_jobs, sigterm_interrupts
from shardfuzz.ranks.fast_exit import exit_without_teardown
from shardfuzz.ranks.spawn import start_forkserver
from shardfuzz.report.closest_pass import RECHECK_FROM, judged_with_recheck, said_lower
from shardfuzz.report.divergence import format_trace
from shardfuzz.spec.refs import add_search_path, pythonpath_prefix, split_file_ref
from shardfuzz.spec.registry import available_targets, builtin_targets, get_target, listed_targets
from shardfuzz.spec.target import UNDER_TEST, UNDER_TEST_NOTE
from shardfuzz.spec.tolerance import UNIT_ROUNDOFF, Tolerance
from shardfuzz.verdict.comm import CostModel, format_comm


def _cmd_list(specs: list[str]) -> int:
    # a file that defines several targets lists them all (a run asks for one: FILE::NAME)
    targets = [t for spec in specs for t in listed_targets(spec)] or [
        get_target(n) for n in sorted(available_targets())
    ]
    roles = []
    for t in targets:
        print(f"{t.name}:" + (f" {t.description}" if t.description else ""))
        for impl in t.implementations:
            roles.append(t.role(impl))
            print(f"  {impl:<24} {roles[-1]}")
    if UNDER_TEST in roles:  # said once, not on every line (a new user found it noisy there)
        print(f"({UNDER_TEST_NOTE})")
    return EXIT_OK


def _tolerance(args: Any) -> Tolerance:
    """``--tolerance OUTPUT=...`` flags as per-output overrides on the default Tolerance (the last
    one for an output wins), judged at ``--precision`` where given."""
    return Tolerance(precision=args.precision).with_overrides(dict(args.tolerance))


def _config(args: Any, **extra: Any) -> RunConfig:
    """The run configuration of a command line (the only place flags become a RunConfig)."""
    return RunConfig(
        backend=args.backend or "gloo",
        device=args.device,
        timeout=args.timeout,
        deterministic=args.deterministic,
        tolerance=_tolerance(args),
        ranks=args.ranks,
        secret_file=args.secret_file,
        **extra,
    )


def _fuzz_config(args: Any) -> RunConfig:
    """The run's configuration (a child job's: its parent's), checked before any fuzzing."""
    if args.config_json:
        config = RunConfig.from_json(args.config_json)
    else:
        config = _config(
            args,
            world_sizes=args.world_sizes,
            dtypes=args.dtypes,
            profile=args.profile,
            max_examples=args.max_examples,
            deadline=args.duration,
            finish_shrink=args.finish_shrink,
            stop_at_first=args.stop_at_first,
            failures_dir=args.failures_dir,
            database=args.database,
            fleet=args.fleet,
            exclude=tuple(args.exclude),
            options=dict(args.option),
        )
    if config.deadline is not None:
        grace_seconds()  # a bad $SHARDFUZZ_GRACE is a usage error before any fuzzing
    elif config.stop_at_first:
        raise InvalidArgument(
            "--stop-at-first without --duration: a run of --max-examples ends after its first "
            "finding's shrink anyway; allowed: --stop-at-first with --duration TIME"
        )
    if args.workers > 1:
        _check_workers(args.workers, config)
    if config.ranks is not None and (args.workers > 1 or args.jobs > 1):
        many = f"--workers {args.workers}" if args.workers > 1 else f"--jobs {args.jobs}"
        raise InvalidArgument(
            f"--ranks={config.ranks!r} with {many}: one driver serves one torchrun world; "
            "allowed: --jobs 1 --workers 1 (start one torchrun job per driver)"
        )
    return config


def _cmd_fuzz(args: Any) -> int:
    config = _fuzz_config(args)  # a usage error starts no forkserver
    _check_report(args.report)
    targets = args.targets or sorted(builtin_targets())
    if args.workers <= 1 and not (args.jobs > 1 and len(targets) > 1):  # else the children fuzz
        start_forkserver()  # first: its preload of torch overlaps with the engine's own import of it
    from shardfuzz.engine.failures import FailureRecorder
    from shardfuzz.engine.runner import Runner
    from shardfuzz.frontends import campaign, display  # rich: only a campaign loads it, not --help

    # resolve every target and implementation first: a typo is a usage error before any fuzzing
    runners = [Runner(spec, args.impl, config) for spec in targets]
    if not args.config_json:  # a child job's parent checked every target
        check_tolerance_outputs([r.target for r in runners], config.tolerance, "--tolerance")
        check_exclude_keys([r.target for r in runners], config.exclude, "--exclude", config.world_sizes)
    recorder = FailureRecorder(config.failures_dir)  # checks the directory before any fuzzing
    if args.workers > 1:
        # fresh seeds in every worker: derandomized ones (the ci profile, or any profile under
        # Hypothesis' own CI settings) would all run the same examples
        workers = [spec for spec in targets for _ in range(args.workers)]
        return _fuzz_jobs(args, workers, config.replace(derandomize=False))
    if args.jobs > 1 and len(targets) > 1:
        return _fuzz_jobs(args, targets, config)
    outcomes: list[campaign.Outcome] = []
    interrupted, failed_later = False, None
    for spec, runner in zip(targets, runners, strict=True):
        _say_fuzzing(spec, runner, args, config)
        try:
            out = campaign.fuzz_one(
                spec,
                args.impl,
                config,
                recorder=recorder,
                stream=sys.stdout,
                interval=args.progress_every,
                live=not args.no_progress,
            )
        except InfrastructureError as e:
            if not any(o.findings for o in outcomes):
                raise
            # an earlier target's findings are reported and decide the exit code (they were lost)
            failed_later = f"{spec}: {e}"
            break
        outcomes.append(out)
        _print_findings(out)
        if out.interrupted or out.failed:
            interrupted = out.interrupted
            break
    rows = [o.row(pictures=bool(args.report or args.pictures)) for o in outcomes]
    display.print_summary(campaign.summary_table(rows), live=not args.no_progress)
    _write_summary(args.summary_json, rows)
    _write_report(args.report, rows, args.command_line)
    found = any(r["found"] for r in rows)
    if RedisLost.lost is not None:
        print(
            f"shardfuzz: the shared database was lost during the campaign ({RedisLost.lost}); its findings "
            f"are in the failure files under {recorder.directory}",
            file=sys.stderr,
        )
    if interrupted:
        print("shardfuzz: interrupted; failures found so far are in their failure files", file=sys.stderr)
        return EXIT_FOUND if found else EXIT_INTERRUPTED
    _say_failed([o.failed for o in outcomes] + [failed_later])
    return EXIT_FOUND if found else EXIT_OK


def _say_fuzzing(spec: str, runner: Any, args: Any, config: RunConfig) -> None:
    """The line a target's campaign starts with: what runs where, and the covering rows when they
    are more than the examples asked (12 examples for --max-examples 5 read as a bug)."""
    from shardfuzz.engine.covering import rows_for

    asked = config.max_examples
    n_rows = len(rows_for(runner)) if asked is not None else 0
    floor = (
        f", its {n_rows} covering rows first (more than the {asked} example{'s' if asked > 1 else ''} asked)"
        if asked is not None and n_rows > asked
        else ""
    )
    print(
        f"fuzzing {spec} ({get_target(spec).impl_name(args.impl)}) on {config.backend}/{config.device}"
        f"{config.restrictions()}{floor} ...",
        flush=True,
    )


def _print_findings(out: Any) -> None:
    """Every distinct finding of a campaign, in the order found (a fleet's known one by its ID)."""
    from shardfuzz.frontends.campaign import fleet_note

    for i, (finding, _) in enumerate(out.findings):
        note = out.fleet[i] if i < len(out.fleet) else None
        if note is not None and note["fleet"] == "known":  # the fleet has its report already
            print(f"\n{finding.kind}: fleet finding {note['id']}, {fleet_note(note)}\n", flush=True)
        else:
            print(f"\n{finding.report}\n", flush=True)


def _say_failed(failures: list[str | None]) -> None:
    """Failures of the fuzzer itself after a campaign's findings: said beside them, which decide
    the exit code (cli.md)."""
    for failed in filter(None, failures):
        print(f"shardfuzz: the fuzzer itself failed after the findings above: {failed}", file=sys.stderr)


def _check_report(directory: str | None) -> None:
    """``--report DIR`` is a folder this process can write (made if missing), before any fuzzing."""
    if directory is None:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        ok = os.access(directory, os.W_OK)
    except OSError as e:
        raise InvalidArgument(f"--report {directory!r}: cannot make that folder ({e.strerror})") from None
    if not ok:
        raise InvalidArgument(f"--report {directory!r}: the folder is not writable")


def _write_report(directory: str | None, rows: list[dict[str, Any]], command: str) -> None:
    if directory is None:
        return
    from shardfuzz.report.html_page import write_report

    path = write_report(directory, rows, command)
    print(f"report: {path}", flush=True)


def _write_summary(path: str | None, rows: list[dict[str, Any]]) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(rows, fh)


def _check_workers(workers: int, config: RunConfig) -> None:
    """Fleet workers share one Redis database (examples and findings); on a local directory each
    would find and shrink the same bugs alone."""
    url = config.database
    if url is None or not is_redis_url(url):
        raise InvalidArgument(
            f"--workers {workers}: fleet workers share their examples and findings through a Redis "
            f"database; give --database redis://HOST:PORT/N (or set $SHARDFUZZ_DATABASE)"
        )
    # reachable, with the right password, before any worker starts: each worker's own usage error
    # (exit 2) read as "the fuzzer itself failed" (exit 3) in the parent
    connect(url).close()


def _fuzz_jobs(args: Any, targets: list[str], config: RunConfig) -> int:
    from shardfuzz.frontends import campaign, display

    base = [sys.executable, "-m", "shardfuzz.frontends.cli", "fuzz"]
    settings = json.loads(config.to_json())
    if is_redis_url(settings.get("database")):
        # through the environment, not the command line: each job's start line and `ps` showed
        # the URL, password and all (the children read $SHARDFUZZ_DATABASE when none is given)
        os.environ["SHARDFUZZ_DATABASE"] = settings.pop("database")
    opts = ["--config-json", json.dumps(settings), "--progress-every", str(args.progress_every)]
    opts += ["--pictures"] if args.report else []  # the parent writes the page from their rows
    if args.impl is not None:
        opts += ["--impl", args.impl]
    jobs = [[*base, spec, *opts] for spec in targets]
    cost = job_cost(config.world_sizes)
    parallel = args.jobs * args.workers
    budget = args.rank_budget or os.cpu_count() or 1
    if args.workers > 1 and not args.rank_budget:
        # workers run together (a worker that waits for another's end is no worker): up to --jobs
        # targets' groups of workers at once, whatever the cores
        budget = max(budget, cost * parallel)
    print(
        f"running {len(jobs)} jobs, up to {parallel} at once within {budget} ranks (each job uses up to {cost})",
        flush=True,
    )
    rows, codes, interrupted = run_jobs(
        jobs, [cost] * len(jobs), budget, parallel, stop_at_first=config.stop_at_first
    )
    display.print_summary(campaign.summary_table(rows), live=not args.no_progress)
    _write_summary(args.summary_json, rows)
    _write_report(args.report, rows, args.command_line)
    found = any(r["found"] for r in rows)
    if interrupted:
        print("shardfuzz: interrupted; failures found so far are in their failure files", file=sys.stderr)
        return EXIT_FOUND if found else EXIT_INTERRUPTED
    failed = [f"job {i + 1} ended {how_it_ended(c)}" for i, c in enumerate(codes) if c not in (0, 1)]
    # a child whose findings decided its exit code (1) after the fuzzer itself failed there
    failed += [f"{r['target']}/{r['impl']}: {r['failed']}" for r in rows if r.get("failed")]
    if failed:  # said beside a finding too (which decides the exit code): its row may be missing
        print(f"shardfuzz: the fuzzer itself failed: {', '.join(failed)} (output above)", file=sys.stderr)
    if failed and not found:
        return EXIT_INFRA
    return EXIT_FOUND if found else EXIT_OK


def _note_outside_bounds(target: Any, case: Case) -> None:
    """Say so when the target's strategy never draws ``case`` (it runs anyway: a case typed by hand
    may be one on purpose). A new user's case of seq 3 on 2 ranks ran without a word, where their
    strategy drew only sizes the group divides; a failure file's case outside them is refused."""
    from shardfuzz.spec.bounds import check_in_bounds

    try:
        check_in_bounds(target, case)
    except InvalidArgument as e:
        print(f"note: {e}; running it as given", file=sys.stderr)


def _cmd_case(args: Any) -> int:
    if args.plot_output is not None and args.plot is None:
        raise InvalidArgument(f"--plot-output {args.plot_output!r} needs --plot FILE.png")
    start_forkserver()  # first: its preload of torch overlaps with the engine's own import of it
    from shardfuzz.engine.input_bounds import check_input_size
    from shardfuzz.engine.runner import Runner
    from shardfuzz.report import plot
    from shardfuzz.verdict.oracle import check_case

    if args.plot is not None:  # before the case runs: a missing extra or folder is a usage error
        plot.require_matplotlib()
        plot.check_path(args.plot)
    case = Case.parse(args.case)
    target, parts = args.target, split_file_ref(args.target)
    if parts is not None and not parts[1]:  # a file of several targets: the one the case names
        target = f"{parts[0]}::{case.target}"
    runner = Runner(target, args.impl, _config(args))
    runner.always_noise = True  # one case: its true ratios, not a sure pass's upper bound
    runner.recheck = args.recheck
    check_tolerance_outputs([runner.target], runner.config.tolerance, "--tolerance")
    check_input_size(runner.target, case)  # before inputs(case) allocates them
    check_case(runner.target, case)
    _note_outside_bounds(runner.target, case)
    try:
        ratio = runner.run_case(case)
    except Unsupported as e:
        said = f" ({e})" if str(e) and str(e) != e.reason else ""  # the message, where it says more
        print(f"UNSUPPORTED: {e.reason}{said}", file=sys.stderr)
        return EXIT_USAGE
    except Finding as f:
        print(f"FAIL ({f.kind})\n{f.report}")
        _print_collectives(args, f.traces)
        if args.plot is not None:
            sys.stdout.flush()
            if isinstance(f, Mismatch) and f.diffs:
                drawn = plot.plot_mismatch(f.diffs, args.plot, args.plot_output)
                print(f"plot of {', '.join(drawn)}: {args.plot}")
            else:
                print(f"--plot: nothing drawn, the finding is a {f.kind}, not a mismatch", file=sys.stderr)
        return EXIT_FOUND
    print(f"PASS: {case!r}\n  worst error/tolerance {ratio:.3g} ({runner.tolerance.describe(case.dtype)})")
    verdict = runner.last_verdict
    if verdict is not None and verdict.diffs:
        per = ", ".join(f"{d.name} {d.max_ratio:.3g}" for d in verdict.diffs if d.ranks)
        print(f"  per output (error/tolerance; 0: compared exactly and equal): {per}")
    if not args.recheck and ratio >= RECHECK_FROM and _recheck_can_lower(runner, verdict):
        words = _rechecked_words(runner, case, ratio)  # the figure a campaign's closest pass gives beside it
        if words:
            print(f"  {words}")
    _print_collectives(args, runner.last_traces)
    if args.plot is not None:
        print("--plot: nothing drawn, the case passes", file=sys.stderr)
    return EXIT_OK


def _recheck_can_lower(runner: Any, verdict: Any) -> bool:
    """Whether the recheck's samples can lower the figure: the noise model is on and the worst
    output is judged with it (not a fixed tolerance, not an exact comparison)."""
    tol = runner.tolerance
    if tol.noise_model != "mca" or verdict is None or not verdict.diffs:
        return False
    worst = max(verdict.diffs, key=lambda d: d.max_ratio)
    return tol.for_output(worst.name) is None and worst.dtype in UNIT_ROUNDOFF


def _rechecked_words(runner: Any, case: Case, first: float) -> str | None:
    """The case judged again with the recheck a failure gets before it is reported, said where it
    is lower, as a campaign's closest pass says it: a new user read "closest pass 1 (0.273 with the
    recheck ...)", ran the case, and saw only the 1."""
    rechecked, other_kind = judged_with_recheck(runner, case)
    if other_kind is not None:
        return f"judged again with the recheck a failure gets before it is reported: a {other_kind} (it passed once: not deterministic?)"
    if rechecked is None or not said_lower(rechecked, first):
        return None
    return f"with the recheck a failure gets before it is reported (--recheck): {rechecked:.3g}"


def _print_collectives(args: Any, traces: dict[int, Any]) -> None:
    if args.trace:
        print(f"collective trace:\n{format_trace(traces)}")
    if args.comm:
        model = CostModel(args.alpha, args.beta, args.algorithm)
        print(f"communication (model of shardfuzz.verdict.comm):\n{format_comm(traces, model)}")


def _cmd_replay(args: Any) -> int:
    if not args.paths:  # a fleet's, from the variable: its password stays out of ps
        args.paths = [_fleet_url("replay", None)]
    if args.finding is not None and not any(map(is_redis_url, args.paths)):
        raise InvalidArgument(f"--finding={args.finding!r} names a fleet finding: give a redis://... URL")
    start_forkserver()  # first: its preload of torch overlaps with the engine's own import of it
    from shardfuzz.engine import failures
    from shardfuzz.engine.failure_schema import printable
    from shardfuzz.frontends import fleet_view
    from shardfuzz.repro.replay import case_repr_note, replay_one

    files = [p for p in args.paths if not is_redis_url(p)]
    paths = failures.find_files(files) if files else []
    records, outside = [], []
    for p in paths:  # all checked before any runs
        try:
            records.append(failures.load(p, trust_refs=args.trust_refs))
        except CaseOutsideBounds as e:  # stale (the target changed since), not forged: the rest run
            outside.append(str(e))
    for url in filter(is_redis_url, args.paths):  # a fleet's findings: untrusted records of a store
        records += fleet_view.fleet_records(url, args.fleet, args.finding, trust_refs=args.trust_refs)
    if outside and not records:  # nothing left to replay: the refusal it was before, exit 2
        more = f" (and {len(outside) - 1} more files like it)" if len(outside) > 1 else ""
        raise InvalidArgument(outside[0] + more)
    for said in outside:
        print(f"NOT RUN: {said}", flush=True)
    if not records:
        fleet = args.fleet or env_fleet()
        where = [
            f"fleet {fleet!r} at {redact(p)}" if is_redis_url(p) else repr(printable(p)) for p in args.paths
        ]
        print(
            f"shardfuzz: error: no failure files (*.json) or findings in {' or '.join(where)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    tolerance = _tolerance(args)
    check_tolerance_outputs([failures.record_target(r)[0] for r in records], tolerance, "--tolerance")
    still = aside = other = moved = 0
    for rec in records:
        # on stderr, before it runs: a case that takes long (the oracle in this process has no
        # timeout) shows which file it is
        named = (
            printable(os.path.basename(rec["path"]))
            if rec.get("path")
            else f"fleet finding {printable(str(rec.get('fleet_id', '?')))}"
        )
        print(f"shardfuzz: replaying {named} ...", file=sys.stderr, flush=True)
        res = replay_one(
            rec,
            backend=args.backend,
            device=args.device,
            debug_collectives=args.debug_collectives,
            deterministic=args.deterministic or None,
            timeout=args.timeout,
            tolerance=tolerance,
            ranks=args.ranks,
            secret_file=args.secret_file,
        )
        print(res.line(), flush=True)
        if res.failed:
            still += 1
            print(res.report + "\n", flush=True)
        aside += res.not_judged
        other += res.status == "another implementation"
        # a pass on other inputs (regressions() fails it) or another case (its case_repr edited)
        # than the file recorded says nothing of its failure: never exit 0 on it
        edited = res.status == "different inputs" or bool(case_repr_note(res.record))
        moved += edited and not res.failed and res.status in ("different inputs", "now passes")
    rest = f", {aside} set aside (a known failure now, or refused)" if aside else ""
    rest += f"; {other} of the passes ran another implementation than the file names" if other else ""
    rest += (
        f"; {moved} of the passes ran other inputs or another case than the file recorded (not a fix)"
        if moved
        else ""
    )
    rest += f"; {len(outside)} not run (cases their targets no longer draw)" if outside else ""
    print(f"{len(records)} replayed: {still} fail, {len(records) - still - aside} pass{rest}")
    return EXIT_FOUND if still or other or moved else EXIT_OK


def _cmd_repro(args: Any) -> int:
    from shardfuzz.engine import failures
    from shardfuzz.repro.replay import case_repr_note, impl_note, record_target
    from shardfuzz.repro.standalone import write_standalone
    from shardfuzz.repro.torchrun import write_repro

    record = failures.load(args.file, trust_refs=args.trust_refs)
    target, _ = record_target(record)
    runs = "the script runs"
    for note in (case_repr_note(record, runs), impl_note(record, target, runs)):  # an edited file
        if note:
            print(f"shardfuzz: {note}", file=sys.stderr)
    output = args.output or ("repro" if args.standalone else "repro.py")
    if args.standalone and output.endswith(".py") and not os.path.isdir(output):
        # a new user's -o repro_mor.py became a folder of that name, the script inside it
        raise InvalidArgument(
            f"-o {output!r}: with --standalone, -o names a folder (the script in it is named after "
            "the implementation, repro_<name>.py, beside what it needs); give a folder, e.g. -o repro"
        )
    try:
        path = (write_standalone if args.standalone else write_repro)(record, output)
    except OSError as e:  # a folder that cannot be made or written, a name the file system refuses
        raise InvalidArgument(f"-o {output!r}: cannot write there: {e.strerror or e}") from None
    n = record["case"].world_size
    # a standalone script imports what the implementation imports (a new user's own package) as
    # plain imports; the shardfuzz one loads the target as shardfuzz does, and finds it from there
    refs = [r for r in (record.get("target_ref"), record.get("impl_ref")) if isinstance(r, str) and r]
    env = pythonpath_prefix(refs) if args.standalone else ""
    print(f"wrote {path}; run it with: {env}torchrun --nproc-per-node={n} {path} [--backend nccl]")
    return EXIT_OK


def command_line(argv: Sequence[str]) -> str:
    """The command as typed, for a report meant to be shared: a redis:// URL's password never
    shows (:func:`shardfuzz.engine.shared_db.redact`)."""
    return "shardfuzz " + " ".join(shlex.quote(redact(str(a))) for a in argv)


class _OneLineWarnings:
    """``warnings.showwarning`` for the command: shardfuzz's own warnings as one line, as its errors
    are printed; any other as ``show`` (the one it replaces) shows it."""

    def __init__(self, show: Any) -> None:
        self.show = show

    def __call__(
        self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if issubclass(category, ShardfuzzWarning):
            print(f"shardfuzz: warning: {message}", file=sys.stderr, flush=True)
        else:
            self.show(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not isinstance(warnings.showwarning, _OneLineWarnings):
        warnings.showwarning = _OneLineWarnings(warnings.showwarning)
    args = build_parser().parse_args(argv)
    args.command_line = command_line(sys.argv[1:] if argv is None else argv)
    if getattr(args, "parent_pid", None):
        die_with_parent(args.parent_pid)
    with sigterm_interrupts(args.command == "fuzz"):  # SIGTERM stops a campaign like Ctrl-C
        return _main(args)


def _fleet_url(command: str, url: str | None) -> str:
    """``findings``/``status``/``replay``'s URL: the argument, else ``$SHARDFUZZ_DATABASE`` (the
    variable the docs advise for a password, which ``fuzz`` reads: these required the URL on the
    line)."""
    if url is not None:
        return url
    from shardfuzz.engine.shared_db import env_database, is_redis_url

    url = env_database()
    if url is None or not is_redis_url(url):
        raise InvalidArgument(
            f"{command} needs the fleet's redis://HOST:PORT/N URL, as an argument or in "
            f"$SHARDFUZZ_DATABASE (it holds {'nothing' if url is None else 'no Redis URL'})"
        )
    return url


def _main(args: Any) -> int:
    try:
        add_search_path(getattr(args, "search_path", None) or [])
        if args.command == "list":
            return _cmd_list(args.targets)
        if args.command == "gpus":
            from shardfuzz.ranks.gpu import placement_summary

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
        if args.command in ("findings", "status"):
            from shardfuzz.frontends import fleet_view

            args.url = _fleet_url(args.command, args.url)
            if args.command == "status":
                return fleet_view.cmd_status(args.url, args.fleet)
            _check_report(args.report)
            code = fleet_view.cmd_findings(args.url, args.fleet)
            _write_report(args.report, fleet_view.fleet_rows(args.url, args.fleet), args.command_line)
            return code
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


def entry() -> NoReturn:
    """The ``shardfuzz`` command: :func:`main`, then an exit without the interpreter's teardown of
    torch (1.2-1.7 s after the last line is printed: :mod:`shardfuzz.ranks.fast_exit`). An error
    nobody caught prints its traceback and exits 3, the fuzzer itself failed (never 1, found)."""
    try:
        code = main()
    except SystemExit as e:  # argparse's usage errors and --help: the code sys.exit would give
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BrokenPipeError:  # the reader left (`shardfuzz list | head`): quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    except Exception:  # noqa: BLE001 (must catch all: an error nobody caught is shardfuzz's or a target's bug, and Python's own exit code, 1, is the one that says "found")
        # its traceback as ever, and exit 3: a maintainer's pinned placement crashed the progress
        # conditions with an IndexError, and CI read the exit 1 as a counterexample found
        traceback.print_exc()
        print(
            "shardfuzz: the fuzzer itself failed: an error nobody caught (its traceback is above), "
            "in shardfuzz or in the target's code; nothing was found",
            file=sys.stderr,
        )
        code = EXIT_INFRA
    exit_without_teardown(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
