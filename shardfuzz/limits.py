"""Limits and switches of the whole engine, validated in one place: the backends and devices, the
largest world size, and every ``SHARDFUZZ_*`` environment variable (:data:`ENVIRONMENT`).

Core: imported by every stage, imports nothing of shardfuzz but the errors. A variable read anywhere
in the engine is listed in :data:`ENVIRONMENT` (``tests/test_config.py`` checks that against the
source), so that the reference of environment variables is generated from one table."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardfuzz.errors import InvalidArgument

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")


#: the largest world size shardfuzz starts without being told (``SHARDFUZZ_MAX_WORLD``), and the
#: share of the cores it may use: each rank is a process, and more than 4 per core only thrashes
MAX_WORLD_SIZE = 16
RANKS_PER_CORE = 4
#: an example still running this long after a campaign's deadline is abandoned
#: (``$SHARDFUZZ_GRACE`` changes it); docs/how-to/campaigns.md promises ``--duration D`` ends by D + 30 s
GRACE_S = 20.0

#: integer environment variables: name -> (default, minimum)
ENV_INTS = {
    "SHARDFUZZ_MAX_POOL_RANKS": (12, 1),
    "SHARDFUZZ_WORKER_THREADS": (1, 1),
    "SHARDFUZZ_DRIVER_THREADS": (1, 1),
    "SHARDFUZZ_MAX_WORLD": (0, 1),  # 0: not set (see max_world_size)
    "SHARDFUZZ_SPARE_POOLS": (1, 0),  # 0: no warm spare after a failure (benchmarks' "before")
    "SHARDFUZZ_REGROUP": (1, 0),  # 0: a pool whose rank raised is discarded (benchmarks' "regroup off")
    "SHARDFUZZ_SUSPEND_IDLE": (1, 0),  # 0: idle pools keep running (benchmarks' "before")
    "SHARDFUZZ_MAX_INPUT_BYTES": (2**30, 1),  # a hand-made case's inputs (shardfuzz.engine.input_bounds)
    "SHARDFUZZ_HEARTBEAT": (10, 1),  # seconds between a fleet worker's heartbeats
    "SHARDFUZZ_RANKS_WAIT": (300, 1),  # seconds the driver waits for its rank servers (--ranks)
}


def env_int(name: str, default: int, minimum: int = 0) -> int:
    """The integer environment variable ``name`` (``default`` when unset or empty); InvalidArgument,
    naming the variable, its value and what is allowed, for anything but an int >= ``minimum``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidArgument(f"environment variable {name}={text!r}; must be an integer >= {minimum}")
    return value


def check_environment() -> None:
    """Validate every shardfuzz environment variable that holds a number (RunConfig does, so each
    front end refuses a bad one before fuzzing)."""
    for name, (default, minimum) in ENV_INTS.items():
        env_int(name, default, minimum)


def max_world_size() -> int:
    """The largest world size allowed: ``$SHARDFUZZ_MAX_WORLD`` when set, else
    ``min(MAX_WORLD_SIZE, RANKS_PER_CORE * cores)``."""
    explicit = env_int("SHARDFUZZ_MAX_WORLD", 0, 1)
    return explicit or min(MAX_WORLD_SIZE, RANKS_PER_CORE * (os.cpu_count() or 1))


def check_world_size(world_size: int, what: str = "world_size") -> None:
    """InvalidArgument for a world size above :func:`max_world_size` (every rank is a process)."""
    limit = max_world_size()
    if world_size > limit:
        why = (
            "set by SHARDFUZZ_MAX_WORLD"
            if os.environ.get("SHARDFUZZ_MAX_WORLD", "").strip()
            else f"min({MAX_WORLD_SIZE}, {RANKS_PER_CORE} x {os.cpu_count() or 1} cores)"
        )
        raise InvalidArgument(
            f"{what}={world_size!r} is above the largest world size allowed here, {limit} ({why}); every "
            "rank is a process: set SHARDFUZZ_MAX_WORLD=N to allow more"
        )


def default_device(backend: str) -> str:
    """The one device default rule: nccl runs on CUDA, gloo on the CPU."""
    return "cuda" if backend == "nccl" else "cpu"


@dataclass(frozen=True)
class EnvVar:
    """One environment variable shardfuzz reads: what it holds, its default, what it changes."""

    name: str
    kind: str  # "int >= N", "seconds", "path", "paths", "0 or 1"
    default: str
    meaning: str


#: every ``SHARDFUZZ_*`` variable the engine reads (the integers among them are checked by
#: :func:`check_environment` before any fuzzing)
ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(
        "SHARDFUZZ_MAX_WORLD",
        "int >= 1",
        f"min({MAX_WORLD_SIZE}, {RANKS_PER_CORE} x cores)",
        "the largest world size shardfuzz starts (every rank is a process)",
    ),
    EnvVar(
        "SHARDFUZZ_MAX_POOL_RANKS",
        "int >= 1",
        "12",
        "idle warm-pool ranks kept in all before the least recently used pool stops",
    ),
    EnvVar("SHARDFUZZ_SPARE_POOLS", "int >= 0", "1", "0: no warm spare pool started after a failure"),
    EnvVar(
        "SHARDFUZZ_REGROUP",
        "int >= 0",
        "1",
        "0: a pool whose rank raised is discarded, never regrouped in place",
    ),
    EnvVar(
        "SHARDFUZZ_SUSPEND_IDLE",
        "int >= 0",
        "1",
        "0: idle warm pools keep running (their gloo loop threads wake every 10 ms) instead of being "
        "stopped with SIGSTOP once unused for a second, until their next task (Linux)",
    ),
    EnvVar("SHARDFUZZ_WORKER_THREADS", "int >= 1", "1", "torch threads in each rank process"),
    EnvVar(
        "SHARDFUZZ_RANKS_WAIT",
        "int >= 1",
        "300",
        "seconds the driver waits for every rank server of --ranks to connect (and to come back after a rebuild)",
    ),
    EnvVar(
        "SHARDFUZZ_SECRET",
        "text",
        "",
        "the secret rank servers and their driver prove to each other (--ranks; at least 16 characters)",
    ),
    EnvVar("SHARDFUZZ_DRIVER_THREADS", "int >= 1", "1", "torch threads in the driver (the oracle)"),
    EnvVar(
        "SHARDFUZZ_GRACE",
        "seconds",
        f"{GRACE_S:g}",
        "how long an example may still run after a campaign's --duration before it is abandoned",
    ),
    EnvVar(
        "SHARDFUZZ_FAILURES_DIR", "path", ".shardfuzz/failures", "where failure files are written and found"
    ),
    EnvVar(
        "SHARDFUZZ_PATH",
        "paths",
        "",
        "folders where the files a failure file names are looked up, and trusted (docs/trust.md)",
    ),
    EnvVar(
        "SHARDFUZZ_MAX_INPUT_BYTES",
        "int >= 1",
        str(2**30),
        "the most bytes a failure file's (or shardfuzz case's) inputs may hold, measured before building",
    ),
    EnvVar(
        "SHARDFUZZ_DATABASE",
        "path or URL",
        "",
        "where examples are kept: a directory or a fleet's redis://HOST:PORT/N (--database)",
    ),
    EnvVar("SHARDFUZZ_FLEET", "name", "default", "the fleet's name on a shared Redis (--fleet)"),
    EnvVar("SHARDFUZZ_HEARTBEAT", "int >= 1", "10", "seconds between a fleet worker's heartbeats"),
)

#: the environment variables shardfuzz reads (or sets when unset) that are not its own; the docs'
#: reference of environment variables is generated from these two tables (``tests/test_readme.py``
#: checks that every variable the engine's source reads is in one of them)
OTHER_ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(
        "OMP_NUM_THREADS",
        "int",
        "1",
        "the `shardfuzz` command and torchrun reproducers set it to 1 when unset; the driver keeps one "
        "torch thread unless it is set (then SHARDFUZZ_DRIVER_THREADS decides); every rank sets it to "
        "SHARDFUZZ_WORKER_THREADS",
    ),
    EnvVar(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "int",
        "3",
        "set in each NCCL rank server when unset: a collective stuck past the group's timeout ends the process",
    ),
    EnvVar(
        "TORCHELASTIC_RESTART_COUNT",
        "int",
        "",
        "set by torchrun: a rank server keys its world's groups by it, so a restarted world starts afresh",
    ),
    EnvVar("NO_COLOR", "any", "", "set: no colour in a campaign's display and summary (honoured by rich)"),
    EnvVar(
        "PYTHONPATH",
        "paths",
        "",
        "Python's own; a report's `shardfuzz case` rerun line keeps it, after the folders a new shell "
        "lacks that the target's files import from (pytest's root, a script's folder, and those of "
        "this PYTHONPATH: the line runs pasted into a shell without it)",
    ),
    EnvVar(
        "TORCH_DISTRIBUTED_DEBUG",
        "DETAIL",
        "",
        "set to DETAIL in every rank by `shardfuzz replay --debug-collectives`",
    ),
    EnvVar(
        "CUBLAS_WORKSPACE_CONFIG",
        "string",
        ":4096:8",
        "set in each rank when unset (deterministic algorithms on CUDA need it)",
    ),
    EnvVar(
        "RANK",
        "int",
        "0",
        "under torchrun (`shardfuzz repro` scripts, `python -m shardfuzz.repro.torchrun`): this rank",
    ),
    EnvVar("WORLD_SIZE", "int", "1", "under torchrun: the number of ranks"),
    EnvVar("LOCAL_RANK", "int", "0", "under torchrun: the CUDA device of this rank (nccl)"),
    EnvVar(
        "LOCAL_WORLD_SIZE",
        "int",
        "WORLD_SIZE",
        "under torchrun: the ranks on this node, each needing a CUDA device of its own (nccl)",
    ),
    EnvVar("PYTEST_CURRENT_TEST", "string", "", "set by pytest: a failure file's `origin` names the test"),
    EnvVar(
        "PYTEST_XDIST_WORKER", "string", "", "set by pytest-xdist: a failure file's `origin` names the worker"
    ),
)
