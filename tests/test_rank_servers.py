"""Rank servers that torchrun starts (issue 28), end to end on one machine: two torchrun agents as
two nodes (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on localhost) serve a driver that
finds, shrinks and replays planted bugs (a mismatch, a rank's own error, code written for the
default group); the handshake, the sealed messages and the world-size rule without torchrun.
Under ``-m slow`` (each 8-70 s of torchrun starts and stated waits): a wrong secret, a node that
never joins, a killed driver, a rank killed from outside, a killed agent, a hang across nodes and
pytest's ``--shardfuzz-ranks``. Each test starts its own agents in their own sessions and kills
whatever is left of them at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardfuzz
from shardfuzz import Case, InfrastructureError, RunConfig, Runner
from shardfuzz.engine import failures
from shardfuzz.frontends.testing import budget
from shardfuzz.ranks import pool_cache
from shardfuzz.repro.replay import replay_one
from shardfuzz.spec.registry import get_target

SECRET = "a-test-secret-of-32-characters!!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_processes(sid: int) -> list[int]:
    """The live processes of session ``sid`` (an agent and everything it started)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != b"Z":  # field 6 (session), after the state
            pids.append(int(name))
    return pids


class Nodes:
    """``count`` torchrun agents of one world of ``nnodes`` nodes (fewer started: a node that never
    joins), each serving ``nproc`` ranks to the driver at ``port``."""

    def __init__(self, tmp_path, port: int, *, count: int = 2, nnodes: int = 2, nproc: int = 2,
                 secret: str = SECRET, max_restarts: int = 0) -> None:  # fmt: skip
        rdzv = free_port()
        #: the agents' and servers' temporary folders (torchrun's logs, each server's output)
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {**os.environ, "SHARDFUZZ_SECRET": secret, "OMP_NUM_THREADS": "1", "TMPDIR": str(self.tmp)}
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}",
            "--max-restarts", str(max_restarts), "-m", "shardfuzz.ranks.serve",
            "--driver", f"127.0.0.1:{port}", "--wait", "60",
        ]  # fmt: skip
        self.logs = [tmp_path / f"node{i}.log" for i in range(count)]
        self.agents = [
            subprocess.Popen(
                cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
            )
            for log in self.logs
        ]

    def wait(self, timeout_s: float) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        for a in self.agents:
            try:
                a.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [a.poll() for a in self.agents]

    def left(self) -> list[int]:
        return [p for a in self.agents for p in session_processes(a.pid)]

    def output(self) -> str:
        return "\n".join(log.read_text() for log in self.logs)

    def end(self, wait_s: float = 60) -> tuple[Any, list[int | None], list[int]]:
        """Close the driver's world (its servers exit 0, and torchrun ends), wait for the agents,
        then kill what is left: the world, the agents' exit codes, the processes that were left."""
        world = pool_cache.use_remote(None)
        if world is not None:
            world.close()
        codes = self.wait(wait_s)
        left = self.left()
        self.kill()
        return world, codes, left

    def wait_running(self, run, errors: list) -> Any:
        """The driver's world once the campaign in thread ``run`` ran an example on it."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.is_alive():
            world = pool_cache.remote_world()
            if world is not None and world.alive and len(world.ran) > 0:
                return world
            time.sleep(0.2)
        pytest.fail(f"the campaign never ran on the servers ({errors}):\n" + self.output()[-3000:])

    def kill(self) -> None:
        for a in self.agents:
            try:
                os.killpg(a.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            a.wait()


@pytest.fixture
def driver(monkeypatch) -> Iterator[int]:
    """A free port for the driver, its secret, and the world closed at the end."""
    monkeypatch.setenv("SHARDFUZZ_SECRET", SECRET)
    yield free_port()
    world = pool_cache.use_remote(None)
    if world is not None:
        world.close()


def test_two_torchrun_nodes_find_shrink_and_replay_a_planted_bug(tmp_path, driver, capsys, proof):
    bug = get_target("tp_mlp").planted["missing_allreduce"]
    nodes = Nodes(tmp_path, driver)
    try:
        t0 = time.monotonic()
        kwargs = dict(
            profile="shardfuzz-ci", database=None, max_examples=budget(bug.p95), failures_dir=str(tmp_path)
        )
        remote = shardfuzz.run("tp_mlp", "missing_allreduce", ranks=str(driver), **kwargs)
        assert remote.found and remote.kind == "mismatch", remote.stats.summary()
        assert "shardfuzz: 4 rank servers joined from " in capsys.readouterr().err  # the driver says so
        assert f"--impl missing_allreduce --ranks {driver} " in remote.report  # reruns on the servers
        # the same search on local ranks (test_targets' proof, same settings, shared): the same minimal case
        (local,) = failures.find_files([str(proof("tp_mlp", "missing_allreduce"))])
        local_case = Case.from_dict(json.loads(Path(local).read_text())["case"])
        assert remote.case == local_case, (remote.case, local_case)
        (path,) = failures.find_files([str(tmp_path)])
        record = failures.load(path)
        assert record["rank_servers"] == {"rule": "first", "world_size": 4}
        again = replay_one(record, ranks=str(driver))  # on the same servers
        assert again.failed and again.kind == "mismatch" and "same cause" in again.line(), again.line()
        # a rank's own exception, over and over while it shrinks: the servers regroup in place
        raising = dict(profile="shardfuzz-ci", database=None, max_examples=30)
        remote = shardfuzz.run("ring_allreduce", "tensor_chunk", ranks=str(driver), **raising)
        local = shardfuzz.run("ring_allreduce", "tensor_chunk", **raising)
        assert remote.found and remote.kind == "rank-error" and remote.case == local.case, remote.report
        world = pool_cache.remote_world()
        assert world is not None and world.generation >= 1 and world.rebuilds == 0  # regrouped in place
        # code written for a world of its own (the default group, dist.get_world_size()) sees the
        # case's ranks on a torchrun world larger than the case, as on local ranks
        own = os.path.join(os.path.dirname(__file__), "data", "default_group_target.py")
        clean = shardfuzz.run(
            own, "reference", ranks=str(driver), profile="shardfuzz-ci", database=None, max_examples=40
        )
        assert not clean.found and clean.stats.passed >= 40, clean.report or clean.stats.summary()
        remote = shardfuzz.run(own, "mean_of_means", ranks=str(driver), **raising)
        local = shardfuzz.run(own, "mean_of_means", **raising)
        assert remote.found and remote.case == local.case and remote.case.world_size < 4, remote.report
        print(f"found, shrunk and replayed on 2 x 2 torchrun ranks in {time.monotonic() - t0:.0f} s")
    finally:
        world, codes, left = nodes.end()  # the servers' channels close: they exit 0, torchrun ends
    assert codes == [0, 0], nodes.output()[-3000:]
    assert left == []
    # a server removes its folder of output and trace as it leaves (each left one in /tmp)
    assert not list(nodes.tmp.glob("shardfuzz-serve-*")), sorted(p.name for p in nodes.tmp.iterdir())


def test_a_duration_bounds_the_wait_for_rank_servers(driver, monkeypatch):
    """Servers that never come: the driver waited $SHARDFUZZ_RANKS_WAIT (5 minutes by default)
    before a campaign of --duration 2s began; the duration bounds that wait too."""
    monkeypatch.setenv("SHARDFUZZ_RANKS_WAIT", "120")
    t0 = time.monotonic()
    with pytest.raises(InfrastructureError, match="within 2 s"):
        Runner("tp_mlp", "reference", RunConfig(ranks=str(driver), deadline=2.0))
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_a_server_with_another_secret_is_refused_and_says_why(tmp_path, driver, monkeypatch):
    monkeypatch.setenv(
        "SHARDFUZZ_RANKS_WAIT", "25"
    )  # torchrun and its servers start within it, even when loaded
    nodes = Nodes(tmp_path, driver, count=1, nnodes=1, secret="another-secret-of-32-characters!")
    try:
        t0 = time.monotonic()
        with pytest.raises(InfrastructureError, match="does not hold this driver's secret"):
            shardfuzz.run("tp_mlp", "reference", ranks=str(driver), max_examples=1, database=None)
        assert time.monotonic() - t0 < 60
        codes = nodes.wait(30)
        out = nodes.output()
    finally:
        nodes.kill()
    assert "refused this server: the secrets differ" in out, out[-3000:]
    assert codes == [1], out[-3000:]  # torchrun: a worker failed (exit 2), no restarts
    assert "Traceback" not in out.split("refused this server")[0][-500:]  # a message, not a crash


@pytest.mark.slow
def test_a_node_that_never_joins_is_a_clear_error_after_the_stated_wait(tmp_path, driver, monkeypatch):
    monkeypatch.setenv("SHARDFUZZ_RANKS_WAIT", "8")
    nodes = Nodes(tmp_path, driver, count=1, nnodes=2)  # the second node never starts
    try:
        t0 = time.monotonic()
        with pytest.raises(InfrastructureError, match=r"no rank server connected to .* within 8 s"):
            shardfuzz.run("tp_mlp", "reference", ranks=str(driver), max_examples=1, database=None)
        assert time.monotonic() - t0 < 20
    finally:
        nodes.kill()
    assert nodes.left() == []


@pytest.mark.slow
def test_killing_the_driver_stops_every_server(tmp_path, driver):
    nodes = Nodes(tmp_path, driver)
    cmd = [
        sys.executable,
        "-m",
        "shardfuzz.frontends.cli",
        "fuzz",
        "tp_mlp",
        "--ranks",
        str(driver),
        "--duration",
        "10m",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fuzz = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert fuzz.stdout is not None
        for line in fuzz.stdout:  # until examples run on the servers
            if " examples (" in line and not line.split("] ", 1)[-1].startswith("tp_mlp/reference: 0 "):
                break
        fuzz.kill()
        fuzz.wait()
        t0 = time.monotonic()
        codes = nodes.wait(60)
        took = time.monotonic() - t0
        left = nodes.left()
    finally:
        fuzz.kill()
        nodes.kill()
    assert codes == [0, 0] and left == [], nodes.output()[-3000:]
    print(f"every server and agent gone {took:.1f} s after the driver was killed")


@pytest.mark.slow
def test_a_rank_killed_from_outside_is_set_aside_and_the_world_rebuilt(tmp_path, driver):
    """A server killed mid-campaign: its channels close, the driver sends every server away,
    torchrun (--max-restarts) starts a fresh world that connects again, and the campaign goes on.
    Killed in an example it ran, it is a rank death whose case passes on the fresh world (an
    external fault, set aside); killed between examples (or idle: a case of fewer ranks), the
    world is rebuilt before the next one."""
    import threading

    nodes = Nodes(tmp_path, driver, max_restarts=3)
    results: list = []
    run = threading.Thread(
        target=lambda: results.append(
            shardfuzz.run("tp_mlp", "reference", ranks=str(driver), max_examples=60, database=None)
        )
    )
    try:
        run.start()
        world = nodes.wait_running(run, results)
        victim = world.servers[-1].hello.pid
        os.kill(victim, signal.SIGKILL)
        run.join(timeout=150)
        assert not run.is_alive(), "the driver hung after a rank was killed"
    finally:
        world, codes, left = nodes.end()
    (result,) = results
    assert not result.found, result.report
    assert world is not None and world.rebuilds == 1 and result.stats.external_faults <= 1, (
        result.stats.summary()
    )
    print(f"rebuilt once; external faults set aside: {result.stats.external_faults}")
    assert result.stats.examples >= 60, result.stats.summary()
    assert codes == [0, 0] and left == [], nodes.output()[-3000:]


@pytest.mark.slow
def test_a_killed_agent_is_a_clear_error_within_the_stated_wait(tmp_path, driver, monkeypatch):
    """A whole node gone (its torchrun agent killed: its servers go with it): a rank death, then a
    world that cannot be rebuilt within SHARDFUZZ_RANKS_WAIT is a clear error, never a hang. The
    other node's agent then waits in torchrun's own rendezvous (its --rdzv-conf join_timeout):
    the test ends it."""
    import threading

    nodes = Nodes(tmp_path, driver, max_restarts=3)
    errors: list = []

    def campaign() -> None:
        try:
            shardfuzz.run("tp_mlp", "reference", ranks=str(driver), max_examples=400, database=None)
        except InfrastructureError as e:
            errors.append(e)
        else:
            errors.append(None)  # ended without an error: the test fails below

    run = threading.Thread(target=campaign)
    try:
        run.start()
        nodes.wait_running(run, errors)
        monkeypatch.setenv("SHARDFUZZ_RANKS_WAIT", "15")  # read at each wait: this one is the rebuild's
        t0 = time.monotonic()
        os.kill(nodes.agents[1].pid, signal.SIGKILL)  # the agent alone: its servers follow it
        run.join(timeout=90)
        took = time.monotonic() - t0
        assert not run.is_alive(), "the driver hung after a node was killed"
    finally:
        world = pool_cache.use_remote(None)
        if world is not None:
            world.close()
        nodes.kill()
    (error,) = errors
    assert "did not come back after a rebuild" in str(error) and "within 15 s" in str(error), error
    assert took < 60, took
    assert nodes.left() == []


# -- the secret and the handshake, without torchrun ----------------------------------------------
def _handshake(driver_secret: bytes, server_secret: bytes) -> tuple[object, object]:
    """Both ends of one handshake on the loopback: each a Connection or the exception it raised."""
    import threading

    from shardfuzz.ranks import secret

    listener = socket.create_server(("127.0.0.1", 0))
    ends: dict[str, object] = {}

    def driver_side() -> None:
        sock, peer = listener.accept()
        try:
            ends["driver"] = secret.accept(sock, driver_secret, f"{peer[0]}:{peer[1]}")
        except Exception as e:  # noqa: BLE001 (the test looks at whatever it raised)
            ends["driver"] = e

    t = threading.Thread(target=driver_side)
    t.start()
    try:
        ends["server"] = secret.connect(listener.getsockname()[:2], server_secret, 5)
    except Exception as e:  # noqa: BLE001 (as above)
        ends["server"] = e
    t.join(10)
    listener.close()
    return ends["driver"], ends["server"]


def test_the_secret_is_proved_both_ways_and_never_sent():
    from shardfuzz.ranks.secret import Refused, SealedConnection

    d, s = _handshake(b"s" * 32, b"s" * 32)
    assert isinstance(d, SealedConnection) and isinstance(s, SealedConnection)
    s.send("hello")
    assert d.recv() == "hello"
    d.send({"task": 1})
    assert s.recv() == {"task": 1}
    d, s = _handshake(b"s" * 32, b"t" * 32)
    assert isinstance(d, Refused) and "does not hold this driver's secret" in str(d)
    assert isinstance(s, Refused) and "refused this server: the secrets differ" in str(s)


def test_a_server_refuses_a_driver_that_cannot_prove_the_secret():
    """An impostor that accepts any answer and sends a made-up proof gets nothing run."""
    import threading

    from shardfuzz.ranks import secret

    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def impostor() -> None:
        sock, _ = listener.accept()
        sock.sendall(secret.MAGIC + b"n" * secret.NONCE)
        seen.append(sock.recv(64))
        sock.sendall(b"A" + b"x" * 32)
        sock.close()

    t = threading.Thread(target=impostor)
    t.start()
    with pytest.raises(secret.Refused, match="did not prove the secret: it is not your driver"):
        secret.connect(listener.getsockname()[:2], b"s" * 32, 5)
    t.join(10)
    listener.close()
    assert b"s" * 32 not in seen[0]  # only an HMAC of the impostor's nonce and the server's own nonce


def test_secrets_come_from_a_private_file_or_the_environment(tmp_path, monkeypatch):
    from shardfuzz import InvalidArgument
    from shardfuzz.ranks.secret import load_secret

    path = tmp_path / "secret"
    path.write_text("p" * 40 + "\n")
    path.chmod(0o644)
    with pytest.raises(InvalidArgument, match=r"--secret-file='.*secret' has mode 644: others may read it"):
        load_secret(str(path))
    path.chmod(0o600)
    assert load_secret(str(path)) == b"p" * 40
    monkeypatch.delenv("SHARDFUZZ_SECRET", raising=False)
    with pytest.raises(InvalidArgument, match=r"no secret: set \$SHARDFUZZ_SECRET"):
        load_secret()
    monkeypatch.setenv("SHARDFUZZ_SECRET", "short")
    with pytest.raises(InvalidArgument, match=r"\$SHARDFUZZ_SECRET holds 5 characters; allowed: at least 16"):
        load_secret()


def test_world_sizes_above_the_torchrun_world_are_a_usage_error():
    """``--world-sizes 6`` on 4 rank servers was exit 3, "the fuzzer itself failed", on the first
    case of 6 ranks: the user's to fix, named before any case runs."""
    import types

    from shardfuzz import InvalidArgument, RunConfig, Runner

    runner = Runner("tp_mlp", None, RunConfig(world_sizes=(2, 6)))
    runner.rank_servers = types.SimpleNamespace(world_size=4)  # as if 4 servers had joined
    with pytest.raises(
        InvalidArgument,
        match=re.escape("world_sizes=[2, 6] on a torchrun world of 4 rank servers ([6] above it)"),
    ):
        runner.world_sizes()
    runner.config = RunConfig(world_sizes=(2, 4))
    assert runner.world_sizes() == (2, 4)


@pytest.mark.parametrize("bad", ["nope", "host:", ":1234x", "1.2.3.4:70000", "[::1]"])
def test_a_bad_ranks_address_names_the_argument(bad):
    from shardfuzz import InvalidArgument, RunConfig

    with pytest.raises(InvalidArgument, match=re.escape(f"ranks={bad!r}; expected HOST:PORT or PORT")):
        RunConfig(ranks=bad)
    assert RunConfig(ranks="29600").ranks == "29600"


@pytest.mark.slow
def test_pytest_runs_a_target_on_rank_servers(tmp_path, driver):
    """``pytest --shardfuzz-ranks HOST:PORT``: a test_for test runs on one torchrun node's ranks
    and fails on the planted bug with the usual report."""
    nodes = Nodes(tmp_path, driver, count=1, nnodes=1, nproc=2)
    (tmp_path / "test_mine.py").write_text(
        "import shardfuzz\ntest_bug = shardfuzz.test_for('tp_mlp', 'missing_allreduce', world_sizes=(2,))\n"
    )
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", str(tmp_path / "test_mine.py"),
        "--hypothesis-profile=ci", f"--shardfuzz-ranks={driver}", f"--shardfuzz-failures-dir={tmp_path / 'f'}",
    ]  # fmt: skip
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path)
        codes = nodes.wait(60)  # the pytest process ended: its servers leave
        left = nodes.left()
    finally:
        nodes.kill()
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 of 6 outputs mismatch the oracle" in run.stdout, run.stdout[-3000:]
    assert f"--shardfuzz-ranks={driver}" in run.stdout  # the header's reproduce line
    assert codes == [0] and left == [], nodes.output()[-3000:]


@pytest.mark.slow
def test_a_hang_across_nodes_is_reported_with_every_ranks_stack(tmp_path, driver):
    """A rank that skips a collective (tp_mlp's planted ``skip_empty_shard``) on 3 of 4 ranks over
    two nodes: the hang is found by the same evidence as on local ranks, reported with every
    rank's stack (asked over the control channels), and the world is rebuilt for what follows."""
    from shardfuzz import RunConfig, Runner
    from shardfuzz.errors import RankHang

    bug = get_target("tp_mlp").planted["skip_empty_shard"]
    local = shardfuzz.run("tp_mlp", "skip_empty_shard", profile="shardfuzz-ci", database=None,
                          max_examples=budget(bug.p95), timeout=3)  # fmt: skip
    assert local.found and local.kind == "hang", local.stats.summary()
    nodes = Nodes(tmp_path, driver, max_restarts=2)
    try:
        runner = Runner("tp_mlp", "skip_empty_shard", RunConfig(ranks=str(driver), timeout=3))
        t0 = time.monotonic()
        with pytest.raises(RankHang) as hang:
            runner.run_case(local.case)
        took = time.monotonic() - t0
        report = hang.value.report
        world = pool_cache.remote_world()
        assert world is not None and world.rebuilds == 1 and world.alive  # rebuilt, and back
        assert runner.run_case(dataclasses.replace(local.case, world_size=2, mesh=(2,))) < 1  # it goes on
    finally:
        world, codes, left = nodes.end()
    for r in range(local.case.world_size):
        assert f"rank {r}" in report, report
    assert report.count('File "') >= local.case.world_size, report  # a Python stack per rank
    assert took < 60, took
    assert codes == [0, 0] and left == [], nodes.output()[-3000:]


def test_world_sizes_are_drawn_up_to_the_torchrun_worlds_size():
    """A world of 2 rank servers: the target's own world sizes up to 2, in the search and in the
    covering rows; a world that holds all of them leaves the draws as they are (the same cases as
    on local ranks)."""
    import types

    from shardfuzz import Runner
    from shardfuzz.engine.covering import rows_for

    runner = Runner("tp_mlp", "reference")
    runner.rank_servers = types.SimpleNamespace(world_size=2)  # what a RemoteWorld of 2 says
    assert runner.world_sizes() == (1, 2)
    assert {row.case.world_size for row in rows_for(runner)} <= {1, 2}
    runner.rank_servers = types.SimpleNamespace(world_size=8)
    assert runner.world_sizes() is None


def test_one_driver_per_torchrun_world(capsys):
    from shardfuzz.frontends import cli

    assert cli.main(["fuzz", "tp_mlp", "--ranks", "29999", "--jobs", "2"]) == cli.EXIT_USAGE
    assert "--ranks='29999' with --jobs 2: one driver serves one torchrun world" in capsys.readouterr().err


def test_a_message_without_the_connections_seal_is_never_unpickled():
    """A relay that passed the handshake on, then writes its own message (here: a pickle that
    would run code), or replays one: dropped before pickle sees it, and the channel closes."""
    import pickle

    d, s = _handshake(b"s" * 32, b"s" * 32)
    raw = d._conn  # the socket under the seal, as a relay on the path would hold it
    raw.send_bytes(b"x" * 32 + pickle.dumps(os.system))
    with pytest.raises(EOFError, match="failed its check"):
        s.recv()
    d2, s2 = _handshake(b"s" * 32, b"s" * 32)
    d2.send("first")
    assert s2.recv() == "first"
    d2._sent -= 1  # the same message again, with its old number: a replay
    d2.send("first")
    with pytest.raises(EOFError, match="failed its check"):
        s2.recv()


def test_a_client_that_trickles_its_handshake_is_cut_off(monkeypatch):
    import threading

    from shardfuzz.ranks import secret

    monkeypatch.setattr(secret, "HANDSHAKE_S", 1.0)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname()[:2])
    sock, _ = listener.accept()
    t0 = time.monotonic()
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.3):
            with contextlib.suppress(OSError):
                client.send(b"x")

    threading.Thread(target=trickle, daemon=True).start()
    with pytest.raises(secret.Refused, match="did not finish the handshake within 1 s"):
        secret.accept(sock, b"s" * 32, "a slow client")
    stop.set()
    assert time.monotonic() - t0 < 3
    client.close()
    listener.close()


def test_a_question_a_server_cannot_answer_is_answered_with_none(tmp_path, capsys):
    """The control thread lives on: an unknown question, or a file it cannot read as a trace,
    gets (its number, None) and a line on the server's stderr."""
    from shardfuzz.protocol import Control
    from shardfuzz.ranks.serve import reply

    assert reply(Control("bogus", seq=7), str(tmp_path)) == (7, None)
    assert "could not answer Control(what='bogus'" in capsys.readouterr().err
    (tmp_path / "rank0.out").write_text("hello\n")
    assert reply(Control("tail", "rank0.out", 0, seq=8), str(tmp_path)) == (8, "hello\n")


def test_a_closed_world_lets_go_of_its_port_at_once():
    """A world closed while its accept thread waits (a rebuild that failed, the pools stopped after
    a deadline) left its port listening: the next world there failed "--ranks ...: cannot listen
    there (Address already in use)", exit 3 (2 of 8 of a new user's fault-injection runs)."""
    from shardfuzz.ranks.remote import RemoteWorld

    first = RemoteWorld(("127.0.0.1", 0), b"s" * 32, "gloo", "cpu")
    port = first.address[1]
    time.sleep(0.2)  # its accept thread is blocked in accept()
    first.close()
    again = RemoteWorld(("127.0.0.1", port), b"s" * 32, "gloo", "cpu")
    again.close()


def test_a_wait_for_rank_servers_says_so_then_names_what_is_missing(capsys):
    """The driver's wait for its rank servers (300 s by default) printed nothing until its error: a
    new user thought it hung. It says once what it waits for, then what never came."""
    from shardfuzz.errors import InfrastructureError
    from shardfuzz.ranks.remote import RemoteWorld

    world = RemoteWorld(("127.0.0.1", 0), b"s" * 32, "gloo", "cpu", wait_s=3.0)
    try:
        with pytest.raises(
            InfrastructureError, match=r"no rank server connected to 127\.0\.0\.1:.* within 3 s"
        ):
            world.start(10.0)
    finally:
        world.close()
    err = capsys.readouterr().err
    assert err.count("waiting up to 3 s for the rank servers to connect to 127.0.0.1:") == 1, err


def test_a_rebuild_after_servers_stopped_answering_names_them(capsys, monkeypatch):
    """A new user's lost node was never named: the driver said only "a rank server stopped
    answering" before each wait for the world to come back. It names the servers whose channels
    closed, with their pid, host and local rank."""
    from shardfuzz.protocol import Hello
    from shardfuzz.ranks.remote import RemoteWorld, Server

    world = RemoteWorld(("127.0.0.1", 0), b"s" * 32, "gloo", "cpu")
    try:
        hello = lambda r, host: Hello("task", r, 2, r % 2, host, 1000 + r)
        world.servers = [
            Server(hello(0, "node-a"), None, None),
            Server(hello(1, "node-b"), None, None, closed=True),
        ]
        world.world_size = 2
        monkeypatch.setattr(world, "rebuild", lambda: None)  # the wait for torchrun's new world
        world.pool(1)
    finally:
        world.servers = []
        world.close()
    err = capsys.readouterr().err
    assert "rank servers stopped answering (rank 1: pid 1001 on node-b, local rank 1)" in err, err
    assert "node-a" not in err, err
