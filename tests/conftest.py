import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# a suite started in the background by a non-interactive shell (``pytest ... &``, some CI runners)
# inherits SIGINT ignored, and so would every process it starts: its CLI processes would never see
# the Ctrl-C that the interrupt tests send them. Restored here, for this process and its children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: the one slack factor on every wall-time upper bound of a ``timing`` test: 1 here (the bounds as
#: written); ``SHARDFUZZ_TIMING_SLACK=3`` widens them all at once on a loaded machine. A lower
#: bound (a wait that must happen) is never scaled.
TIMING_SLACK = float(os.environ.get("SHARDFUZZ_TIMING_SLACK", "1"))


@pytest.fixture
def slack():
    """:data:`TIMING_SLACK`, for the tests marked ``timing`` (and only those: see below)."""
    return TIMING_SLACK


@pytest.fixture(scope="session", autouse=True)
def _state_in_tmp(tmp_path_factory):
    """Failure files and Hypothesis databases go under pytest's temporary directory, for this
    process and every subprocess it starts (CLI runs, pytester runs): never into the checkout. So
    do temporary folders (``TMPDIR``): a driver a test kills with SIGKILL cannot remove its pools'
    folders, and each suite run left a dozen in /tmp; pytest keeps its last three runs' only."""
    import tempfile

    from hypothesis import configuration

    root = tmp_path_factory.mktemp("shardfuzz-state")
    (root / "tmp").mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("TMPDIR", str(root / "tmp"))
    mp.setattr(tempfile, "tempdir", None)  # read TMPDIR again at the next use
    mp.setenv("SHARDFUZZ_FAILURES_DIR", str(root / "failures"))
    mp.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(root / "hypothesis"))
    configuration.set_hypothesis_home_dir(root / "hypothesis")
    yield root
    configuration.set_hypothesis_home_dir(None)
    mp.undo()


@pytest.fixture(scope="session")
def proof(tmp_path_factory):
    """``proof(target, name)``: the search that proves a built-in target's planted bug or expected
    failure (found and shrunk to its declared case: ``assert_planted_bug_found``), run once per
    session, across pytest-xdist workers too: a worker that asks for a proof another worker is
    running waits for it (a lock file in the folder the workers share, as pytest-xdist's docs do
    it) and reuses it. It returns the folder of the finding's failure file, so a test that needs a
    real finding of that record (a standalone reproducer) reuses the search. A proof that failed is
    not kept: the next test that asks runs it again, and fails the same way."""
    from shardfuzz.frontends.testing import assert_planted_bug_found
    from shardfuzz.spec.registry import get_target

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "proofs"
    shared.mkdir(exist_ok=True)

    def prove(target: str, name: str) -> Path:
        folder = shared / f"{target}-{name}"
        with open(shared / f"{target}-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
            if not (folder / "proved").exists():
                t = get_target(target)
                rec = t.planted.get(name) or t.expected_failures[name]
                shutil.rmtree(folder, ignore_errors=True)  # what a failed try left
                folder.mkdir()
                assert_planted_bug_found(target, name, rec.expect, p95=rec.p95, failures_dir=str(folder))
                (folder / "proved").touch()
        return folder

    return prove


class ScriptRanks:
    """Scripts run on ranks forked as torchrun starts them (tests/data/script_ranks.py), through
    one server per test process that imports torch once for the session (a launch costs a fork,
    not an interpreter and an import of torch: about 2 CPU-s each). Started at its first use."""

    SCRIPT = Path(__file__).resolve().parent / "data" / "script_ranks.py"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.server: subprocess.Popen | None = None

    def run(
        self, n: int, argv: list[str], env: dict, cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess:
        """``argv`` on ``n`` ranks in ``env`` and ``cwd``: its exit code and output, as
        ``subprocess.run(capture_output=True, text=True)`` gives them. ``env`` is the ranks'
        ``os.environ``; what Python and torch read at start is the server's (started with this
        process's environment, ``PYTHONPATH`` removed and one thread). A launch whose free port was
        taken before rank 0 bound it (another test's process got it: EADDRINUSE, the race torchrun
        --standalone has too) runs again on a new one, at most twice: seen once under pytest -n 2."""
        for _ in range(2):
            run = self._launch(n, argv, env, cwd, timeout)
            if run.returncode == 0 or "EADDRINUSE" not in run.stderr:
                return run
        return self._launch(n, argv, env, cwd, timeout)

    def _launch(
        self, n: int, argv: list[str], env: dict, cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess:
        import socket

        sock = self.folder / "script_ranks.sock"
        if self.server is None or self.server.poll() is not None:
            sock.unlink(missing_ok=True)
            sock.with_name(sock.name + ".new").unlink(missing_ok=True)
            clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COV_CORE_SOURCE")}
            with open(self.folder / "script_ranks.log", "ab") as log:
                self.server = subprocess.Popen(
                    [sys.executable, str(self.SCRIPT), "--serve", str(sock)],
                    env={**clean, "OMP_NUM_THREADS": "1"}, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                )  # fmt: skip
            deadline = time.monotonic() + 120
            while not sock.exists():
                assert self.server.poll() is None and time.monotonic() < deadline, (
                    self.folder / "script_ranks.log"
                ).read_text()
                time.sleep(0.05)
        out, err = cwd / "script_ranks.stdout", cwd / "script_ranks.stderr"
        request = dict(
            n=n, argv=[str(a) for a in argv], env=env, cwd=str(cwd), stdout=str(out), stderr=str(err)
        )
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock))
            stream = conn.makefile("rw")
            stream.write(json.dumps(request) + "\n")
            stream.flush()
            launcher = self._reply(stream)
            try:
                code = self._reply(stream)
            except TimeoutError:
                os.kill(launcher, signal.SIGKILL)  # its ranks die with it; the server goes on
                raise
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())

    def _reply(self, stream) -> int:
        line = stream.readline()
        assert line, (
            f"the script_ranks server ended: {(self.folder / 'script_ranks.log').read_text()[-3000:]}"
        )
        return int(line)

    def close(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()


@pytest.fixture(scope="session")
def script_ranks(tmp_path_factory):
    """The session's :class:`ScriptRanks`."""
    launcher = ScriptRanks(tmp_path_factory.mktemp("script-ranks"))
    yield launcher
    launcher.close()


@pytest.fixture
def inprocess(pytester, monkeypatch):
    """``pytester`` for ``runpytest_inprocess`` runs that run cases: in this process the pools are
    warm (a fresh pytest process costs 8-12 CPU-s of start-up). pytester restores ``sys.modules``
    after each run, so a module first imported inside it (a lazy torch module, a part of
    shardfuzz) would be imported again by the next run, beside objects that hold the old one
    (pickling a ``Task`` then fails: "not the same object"). Here only the run's own files (its
    test modules, under ``pytester.path``) are dropped, as a fresh process would not have them. A
    run's Hypothesis plugin loads its ``--hypothesis-profile`` here and never undoes it: the
    profile before the test is loaded again after it."""
    from _pytest.pytester import SysModulesSnapshot
    from hypothesis import settings

    from shardfuzz.engine.settings import current_profile_name

    root = str(pytester.path)

    def keep(name: str) -> bool:
        return not (getattr(sys.modules.get(name), "__file__", None) or "").startswith(root)

    # both snapshots: each run's, and the test's own (restored at its teardown); monkeypatch raises
    # if pytest renames them, so this can never silently fall back to fresh imports
    snapshot = lambda: SysModulesSnapshot(preserve=keep)
    monkeypatch.setattr(pytester, "_Pytester__take_sys_modules_snapshot", snapshot)
    monkeypatch.setattr(pytester, "_sys_modules_snapshot", snapshot())
    profile = current_profile_name()
    yield pytester
    settings.load_profile(profile or "default")


@pytest.fixture
def checkout_off_sys_path(monkeypatch):
    """sys.path without the checkout's own folder, which is there where it is the current directory
    (pytest-xdist workers): what a user's installed shardfuzz sees."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != checkout])


def _state(pid: int) -> str:
    """The process's one-letter state ("T": stopped, "Z": exited), "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except FileNotFoundError:
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z")  # a zombie has exited


def _wait_states(pids, state: str, seconds: float = 5.0) -> list[str]:
    """Each process's state once all are in ``state`` or ``seconds`` passed (a signal takes effect
    when its process is next scheduled)."""
    deadline = time.monotonic() + seconds
    while {_state(p) for p in pids} != {state} and time.monotonic() < deadline:
        time.sleep(0.01)
    return [_state(p) for p in pids]


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().split(") ")[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, IndexError, ValueError):
                pass
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children_of(todo.pop())
        out += kids
        todo += kids
    return out


def _wait_gone(pids, seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA: skipped cleanly (and said so) on machines without it. A test that
    asserts on wall time is marked ``timing`` and takes ``slack``, both or neither."""
    unmatched = [
        item.nodeid
        for item in items
        if (item.get_closest_marker("timing") is None) != ("slack" not in getattr(item, "fixturenames", ()))
    ]
    if unmatched:
        raise pytest.UsageError(f"timing marker and slack fixture go together: {unmatched}")
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (run bash .ci/gpu-checks on a GPU machine)")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture
def procs():
    """Helpers to find a process's descendants and wait for them to be gone (Linux /proc)."""
    return types.SimpleNamespace(
        alive=_alive, descendants=_descendants, wait_gone=_wait_gone, state=_state, wait_states=_wait_states
    )


class Background:
    """A command running in the background; every wait on it has a deadline.

    Two threads read its stdout and stderr line by line, so waiting for a line never blocks past
    the deadline, and a child that exits early fails the wait with everything it printed."""

    def __init__(self, command, env=None, cwd=None):
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.pid = self.proc.pid
        self.out: list[str] = []
        self.err: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out, True), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err, False), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream, into, announce):
        for line in stream:
            into.append(line)
            if announce:
                self._lines.put(line)
        if announce:
            self._lines.put(None)  # end of output

    def output(self) -> str:
        return "".join(self.out) + "\n--- stderr ---\n" + "".join(self.err)

    def wait_line(self, predicate, seconds: float) -> str:
        """The first stdout line (from here on) that satisfies ``predicate``; fails with the
        command's output if it exits first or ``seconds`` pass."""
        end = time.monotonic() + seconds
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no such line within {seconds} s; output so far:\n{self.output()}")
            if line is None:
                self.proc.wait(timeout=10)
                pytest.fail(f"exited ({self.proc.returncode}) before such a line:\n{self.output()}")
            if predicate(line):
                return line

    def signal(self, signum) -> None:
        self.proc.send_signal(signum)

    def finish(self, seconds: float) -> tuple[int, str, str]:
        """Wait for the command to exit (failing after ``seconds``): (exit code, stdout, stderr)."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running after {seconds} s; output:\n{self.output()}")
        for t in self._readers:
            t.join(timeout=10)
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            rest = _descendants(self.pid)
            self.proc.kill()
            self.proc.wait(timeout=10)
            for p in rest:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def start_process():
    """Start a command in the background (a :class:`Background`); killed, with whatever it
    started, at the end of the test if still running."""
    started = []

    def start(command, env=None, cwd=None):
        proc = Background(command, env=env, cwd=cwd)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def start_cli(start_process):
    """Start ``shardfuzz ARGS...`` in the background (see :func:`start_process`)."""
    return lambda *args, env=None, cwd=None: start_process(
        [sys.executable, "-m", "shardfuzz.frontends.cli", *args], env=env, cwd=cwd
    )
