"""The ``shardfuzz`` command line: its parser, argument types and exit codes (``cli.py`` runs the
commands)."""

from __future__ import annotations

import argparse
import ast
import difflib
import math
from typing import Any, NoReturn

from shardfuzz.engine.config import (
    BACKENDS,
    DEVICES,
    PROFILES,
    bind_address,
    parse_dtypes,
    parse_tolerance,
    parse_world_sizes,
)
from shardfuzz.engine.shared_db import check_database, check_fleet, is_redis_url, redact
from shardfuzz.engine.trust import add_trust_option
from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.exclude import CALLS, CaseExpression
from shardfuzz.spec.refs import add_search_path_option
from shardfuzz.spec.tolerance import OutputTolerance
from shardfuzz.verdict.comm import ALGORITHMS, RATE_UNITS, TIME_UNITS, parse_quantity

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_INFRA, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


#: options users bring from other fuzzers that shardfuzz has no use for, with what it does instead
#: (a new user's ``--seed`` was answered "did you mean --fleet?")
ABSENT = {
    "--seed": "no such option: --profile shardfuzz-ci draws the same cases on every run, the "
    "other profiles fresh ones, each case carries its own seed, and `shardfuzz case` reruns one",
}


#: the commands that read failure files, and what to say to one given a case instead
FILE_COMMANDS = {
    c: "takes failure files (FILE: a finding writes one under .shardfuzz/failures/, its report names it); "
    "a report's rerun line, shardfuzz case TARGET --impl IMPL 'Case(...)', reruns a case"
    for c in ("repro", "replay")
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with usage errors a user can read: the message and where the options are
    listed, not the whole usage first (``fuzz``'s is 15 lines, above the message); an unknown
    option is the command's error, with the closest option it has."""

    #: the subcommands' parsers, by name (on the top-level parser)
    commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see '{self.prog} --help' for its usage)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            known = [o for action in command._actions for o in action.option_strings]
            guesses = [
                f"{e} ({ABSENT[e.split('=')[0]]})"
                if e.split("=")[0] in ABSENT
                else f"{e} (did you mean {close[0]}?)"
                if (close := difflib.get_close_matches(e.split("=")[0], known, n=1))
                else e
                for e in extras
            ]
            name = getattr(parsed, "command", None)
            # a new user gave repro what `shardfuzz case` takes, the report's rerun line
            case_line = name in FILE_COMMANDS and any(e.startswith(("Case(", "--impl")) for e in extras)
            hint = f"; {name} {FILE_COMMANDS[name]}" if case_line and name else ""
            command.error(f"unrecognized arguments: {' '.join(guesses)}{hint}")
        return parsed


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds; ValueError unless finite and > 0 (``nan``,
    ``inf``, ``0`` and negative times are refused)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"--duration={text!r}; expected a finite time > 0 like 90s, 10m or 1.5h")
    return value


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_world_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--world-sizes={e}") from None


def _tolerance(text: str) -> tuple[str, OutputTolerance]:
    try:
        return parse_tolerance(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--tolerance {e}") from None


def _option(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"--option {text!r}: expected NAME=VALUE, e.g. lse_grad=False")
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        parsed = value.strip()  # a bare word is a string
    if not isinstance(parsed, (str, int, float, bool, type(None))):
        # a target that draws a list as a string (dtensor_ops' dims='[0]') takes it quoted
        raise argparse.ArgumentTypeError(
            f"--option {text!r}: the value must be a number, string, bool or None (a target that "
            f"""draws this option as a string takes it quoted: --option "{name.strip()}='{value.strip()}'")"""
        )
    return name.strip(), parsed


def _exclude(text: str) -> str:
    try:
        return CaseExpression(text).text
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dtypes(text: str) -> tuple[str, ...]:
    try:
        return parse_dtypes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--dtypes {e}") from None


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
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return v


def _alpha(text: str) -> float:
    try:
        return parse_quantity(text, TIME_UNITS, "--alpha")
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _beta(text: str) -> float:
    try:
        value = parse_quantity(text, RATE_UNITS, "--beta")
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--beta={text!r}; must be > 0, e.g. 200GB/s")
    return value


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ranks(text: str) -> str:
    try:
        bind_address(text, "--ranks")
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


def _database(text: str) -> str:
    try:
        return str(check_database(text, "--database"))
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _redis_url(text: str) -> str:
    """A positional fleet URL (``status``, ``findings``): its errors name no ``--database``."""
    if not is_redis_url(text):
        raise argparse.ArgumentTypeError(f"{redact(text)!r} is not a redis://HOST:PORT/N URL")
    try:
        return str(check_database(text, "URL"))
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fleet(text: str) -> str:
    try:
        return check_fleet(text, "--fleet")
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


FLEET_HELP = "the fleet's name on a shared Redis (default: $SHARDFUZZ_FLEET, else 'default')"


def _finish_time(text: str) -> float:
    """``--finish-shrink``: a time as ``--duration`` takes it, or 0 (no finishing)."""
    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--finish-shrink={text!r}; expected 0 or a finite time > 0 like 30s or 2m"
        ) from None


class _Once(argparse.Action):
    """An option given at most once: a second ``--impl`` silently replaced the first (a new user's
    ``--impl reference --impl offset_floor`` fuzzed only the bug)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None and before != values:
            parser.error(
                f"{option_string} given twice ({before!r}, {values!r}); one implementation per run: "
                f"run shardfuzz once for each"
            )
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardfuzz",
        description="Differential fuzzing of sharded PyTorch code against a single-process oracle.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    listing = sub.add_parser("list", help="list targets and their implementations")
    listing.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="target names, 'pkg.mod:ATTR' or file.py paths (default: every target found)",
    )
    sub.add_parser("gpus", help="say which targets and world sizes can run on this machine's GPUs")

    where = _Parser(add_help=False)
    where.add_argument("--backend", default=None, choices=BACKENDS, help="default: gloo (replay: the file's)")
    where.add_argument("--device", default=None, choices=DEVICES, help="default: cuda for nccl, else cpu")
    where.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help="fixed per-example timeout in seconds, for the ranks' work (default: adaptive); the "
        "oracle, which runs in this process, has none",
    )
    where.add_argument(
        "--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True) on every rank"
    )
    where.add_argument(
        "--ranks",
        type=_ranks,
        default=None,
        metavar="HOST:PORT",
        help="run every case on rank servers that torchrun started (python -m shardfuzz.ranks.serve "
        "--driver HOST:PORT), listening there (PORT alone: on 127.0.0.1); docs/how-to/multi-node.md",
    )
    where.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="with --ranks: the secret the rank servers must prove, in a file only you can read "
        "(default: $SHARDFUZZ_SECRET)",
    )

    where.add_argument(
        "--tolerance",
        type=_tolerance,
        action="append",
        default=[],
        metavar="OUTPUT=rtol:X,atol:Y",
        help="a fixed tolerance for one output in place of the noise model (repeatable; the last for "
        "an output wins); OUTPUT must be an output of the target (of one of the targets), or a pattern "
        "of them ('grad_*', quoted), which an output's own --tolerance overrides",
    )

    where.add_argument(
        "--precision",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        metavar="DTYPE",
        help="the implementation computes part of its work in DTYPE by design, whatever the case "
        "dtype (a bf16-compressed all-reduce, FSDP's reduce_dtype): judge every case at least at "
        "DTYPE's rounding (bfloat16, float16 or float32); a bug must be larger to be seen. Not for "
        "quantization (an int8 or float8 cast with a scale): replay it in the oracle "
        "(docs/reference/target-spec.md, Quantization)",
    )

    add_search_path_option(where)

    impl = _Parser(add_help=False)
    impl.add_argument(
        "--impl",
        default=None,
        action=_Once,
        help="implementation name, 'pkg.mod:func' or 'file.py::NAME' (default: the reference); one per run",
    )

    f = sub.add_parser(
        "fuzz", parents=[impl, where], help="fuzz targets (default: every built-in target's reference)"
    )
    f.add_argument(
        "targets", nargs="*", metavar="TARGET", help="target names, 'pkg.mod:ATTR' or file.py paths"
    )
    f.add_argument(
        "--max-examples",
        type=_positive_int,
        default=None,
        help="examples per target (default: the profile's; never fewer than the target's covering rows, "
        "which run first: docs/explanation/covering-rows.md); the search's budget: shrinking a finding "
        "runs more, which the examples printed count. With --duration, the campaign stops at whichever "
        "comes first: these examples in all its runs, or the time",
    )
    f.add_argument(
        "--duration",
        type=_duration,
        default=None,
        metavar="TIME",
        help="fuzz each target for TIME (90s, 10m, 1.5h): successive Hypothesis runs with fresh seeds, "
        "on past a finding (later runs search elsewhere for other bugs; Ctrl-C stops, keeping it)",
    )
    f.add_argument(
        "--stop-at-first",
        action="store_true",
        help="with --duration: end the campaign after the run that made its first finding (shrunk "
        "and saved), not at the end of the duration",
    )
    f.add_argument(
        "--finish-shrink",
        type=_finish_time,
        default=None,
        metavar="TIME",
        help="after --duration, shrink findings whose shrink the deadline cut for up to TIME more "
        "(0: not at all; default: a quarter of the duration, at most 2 min)",
    )
    f.add_argument(
        "--world-sizes",
        type=_world_sizes,
        default=None,
        metavar="N,N,...",
        help="restrict the world sizes drawn, e.g. 2,3 (default: each target's own, up to SHARDFUZZ_MAX_WORLD)",
    )
    f.add_argument(
        "--dtypes",
        type=_dtypes,
        default=None,
        metavar="DTYPE,...",
        help="the dtypes drawn, e.g. float32,bfloat16 (default: each target's own)",
    )
    f.add_argument(
        "--exclude",
        type=_exclude,
        action="append",
        default=[],
        metavar="EXPR",
        help="set aside cases of a known failure, e.g. \"options['smoothing'] > 0\" or \"'empty "
        "DTensor shard' in triggers\": comparisons, and, or, not, in, arithmetic and the calls "
        f"{', '.join(sorted(CALLS))}() on the case's fields (no methods; inf and nan name the floats) "
        "(repeatable; excluded cases are counted and shown)",
    )
    f.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="pin a target option, e.g. lse_grad=False (a Python literal of the kind the target draws "
        "there, a bare word is a string, and inf, -inf or nan a float where the target draws one; repeatable): the contract choice of an implementation that "
        "supports only that value. A string the target never draws, where it draws a few, is warned about. "
        "A value profile's parameter (scale, grid, edge, edge_exp, edge_slot) puts every case in that "
        "profile (scale=1e3: large values; grid=0.5: ties)",
    )
    f.add_argument(
        "--profile",
        default="shardfuzz-dev",
        choices=PROFILES,
        help="the Hypothesis settings: shardfuzz-ci is what CI runs (30 examples, derandomized: the same "
        "cases on every run, the first of any larger --max-examples; no database), shardfuzz-dev 100 "
        "examples with the local database, shardfuzz-fuzz 2000 with it too (each run replays what "
        "earlier runs saved there, right after the target's covering rows: their failures and the "
        "cases nearest one)",
    )
    f.add_argument(
        "--failures-dir",
        default=None,
        metavar="DIR",
        help="where failure files go (default: .shardfuzz/failures)",
    )
    f.add_argument(
        "--database",
        type=_database,
        default=None,
        metavar="DIR|redis://HOST:PORT/N",
        help="where examples are kept; a Redis URL shares them and the findings with a fleet of workers "
        "(default: $SHARDFUZZ_DATABASE, else the profile's local database)",
    )
    f.add_argument("--fleet", type=_fleet, default=None, metavar="NAME", help=FLEET_HELP)
    f.add_argument(
        "--jobs", type=_positive_int, default=1, help="targets fuzzed side by side in child processes"
    )
    f.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="fleet workers of each target on this machine, each its own process (as N machines would "
        "be), sharing examples and findings through --database redis://...",
    )
    f.add_argument(
        "--rank-budget",
        type=_positive_int,
        default=None,
        help="ranks in use at once across jobs (default: the number of cores)",
    )
    f.add_argument(
        "--progress-every",
        type=_positive_float,
        default=2.0,
        metavar="SECONDS",
        help="how often a progress line is printed where there is no live display",
    )
    f.add_argument(
        "--no-progress",
        action="store_true",
        help="plain progress lines on a terminal too, instead of the live display (off a terminal, "
        "as in a CI log, the lines are always plain); NO_COLOR=1 turns colour off",
    )
    f.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="write DIR/index.html: a self-contained page of the campaign (every finding with its "
        "report and plot, trigger coverage, throughput over time, the closest pass)",
    )
    f.add_argument("--pictures", action="store_true", help=argparse.SUPPRESS)  # a job of a --report
    f.add_argument("--summary-json", default=None, help=argparse.SUPPRESS)
    # child jobs: the parent's RunConfig, and the parent to die with
    f.add_argument("--config-json", default=None, help=argparse.SUPPRESS)
    f.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)

    c = sub.add_parser(
        "case", parents=[impl, where], help="rerun exactly one case (the last line of a report)"
    )
    c.add_argument("target", metavar="TARGET")
    c.add_argument("case", metavar="CASE", help="Case(...) as printed in a report")
    c.add_argument("--trace", action="store_true", help="print the collectives each rank entered, in order")
    c.add_argument(
        "--recheck",
        action="store_true",
        help="judge with the noise estimate a failure gets before it is reported (more samples): the "
        "figure a clean run's closest pass gives in brackets (without it, a pass at 0.5 or more "
        "prints that figure on a line of its own)",
    )
    c.add_argument(
        "--comm",
        action="store_true",
        help="print collectives and bytes sent/received per rank and op, and each collective's "
        "alpha-beta estimate (ring and tree)",
    )
    c.add_argument(
        "--alpha", type=_alpha, default=5e-6, metavar="TIME", help="latency per step (default 5us)"
    )
    c.add_argument("--beta", type=_beta, default=200e9, metavar="RATE", help="bandwidth (default 200GB/s)")
    c.add_argument("--algorithm", choices=ALGORITHMS, default="both", help="estimate ring, tree or both")
    c.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="on a mismatch, draw the oracle, the result, the error/tolerance and the shard boundaries "
        'of each mismatching output into FILE.png (needs matplotlib: pip install "shardfuzz[plot]")',
    )
    c.add_argument("--plot-output", default=None, metavar="OUTPUT", help="with --plot: draw only this output")

    r = sub.add_parser("replay", parents=[where], help="rerun the cases in failure files or of a fleet")
    r.add_argument(
        "paths",
        nargs="*",
        metavar="FILE|DIR|redis://...",
        help="failure files, folders of them, or a fleet's database (none: $SHARDFUZZ_DATABASE's fleet, "
        "which keeps a password out of ps)",
    )
    r.add_argument("--fleet", type=_fleet, default=None, metavar="NAME", help=FLEET_HELP)
    r.add_argument("--finding", default=None, metavar="ID", help="with redis://...: replay only this finding")
    r.add_argument(
        "--debug-collectives",
        action="store_true",
        help="rerun with torch's collective checking (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
    )
    add_trust_option(r)

    rp = sub.add_parser("repro", help="write a torchrun script for one failure file")
    rp.add_argument("file", metavar="FILE")
    rp.add_argument(
        "-o",
        "--output",
        default=None,
        help="the script (default repro.py); with --standalone, a folder (default repro)",
    )
    rp.add_argument(
        "--standalone",
        action="store_true",
        help="a script that needs nothing but torch, to attach to an upstream issue: inputs, the "
        "implementation's source and the oracle's values inlined",
    )
    add_search_path_option(rp)
    add_trust_option(rp)

    for name, what in (("findings", "list a fleet's findings"), ("status", "show a fleet's workers")):
        fl = sub.add_parser(name, help=what)
        fl.add_argument(
            "url",
            type=_redis_url,
            nargs="?",
            default=None,
            metavar="redis://HOST:PORT/N",
            help="the fleet's database (default: $SHARDFUZZ_DATABASE, which keeps a password out of ps)",
        )
        fl.add_argument("--fleet", type=_fleet, default=None, metavar="NAME", help=FLEET_HELP)
    sub.choices["findings"].add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="write DIR/index.html: the fleet's page (its workers and every finding with its report)",
    )
    p.commands = dict(sub.choices)
    return p
