"""Fleets against a real ``redis-server`` (Debian's package; ``.ci/run`` installs it): workers as
separate processes sharing one Redis, the fleet view, findings stored once, Redis lost mid-campaign,
and bad URLs. Without redis-server these tests skip locally (and fail in CI: they must run there).

Budget: the two multi-process tests are the whole cost (a tiny target whose two planted bugs are
found in a few examples); the rest run in this process.
"""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from shardfuzz.engine.fleet import GONE_AFTER
from shardfuzz.errors import InvalidArgument
from shardfuzz.frontends import cli
from shardfuzz.frontends.testing import run_cli
from shardfuzz.signature import SIGNATURE_VERSION

pytest_plugins = ["pytester"]
HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "data", "toy_target.py")
BUGS = os.path.join(HERE, "data", "fleet_impls.py") + "::parity_bugs"
IN_CI = os.environ.get("CI", "").lower() == "true"
INSTALL = "install it with: apt-get install redis-server (and pip install 'shardfuzz[redis]')"


def _needs(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is missing in CI, where the fleet tests must run; .ci/run installs it")
    pytest.skip(f"{what} is not installed: {INSTALL}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server on a free port, its files in ``directory``, stopped with :meth:`stop`."""

    def __init__(self, directory, *extra: str) -> None:
        if shutil.which("redis-server") is None:
            _needs("redis-server")
        try:
            import redis  # noqa: F401
        except ImportError:
            _needs("the redis client")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", *args, "--dir", str(directory), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > end or self.proc.poll() is not None:
                    self.stop()
                    pytest.fail(f"redis-server did not start on port {self.port}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


def _client(url):
    import redis

    return redis.Redis.from_url(url)


def _worker(start_cli, url, fleet, failures_dir, *budget):
    """A worker on the toy target with two planted bugs (every case fails one way or the other, so
    a few examples find both); ``budget``: ``--duration T`` or ``--max-examples N``."""
    return start_cli(
        "fuzz", TOY, "--impl", BUGS, "--world-sizes", "2", *budget,
        "--database", url, "--fleet", fleet, "--failures-dir", str(failures_dir),
        "--summary-json", str(failures_dir / "summary.json"), "--progress-every", "1",
        env={**os.environ, "SHARDFUZZ_HEARTBEAT": "1"},
    )  # fmt: skip


def _notes(failures_dir):
    rows = json.loads((failures_dir / "summary.json").read_text())
    return [(f["id"], f["fleet"]) for r in rows for f in r["findings"]]


def _worker_doc(url, fleet, pid):
    """The heartbeat key of the worker of process ``pid`` (its name: host, pid, a random suffix)."""
    for key in _client(url).scan_iter(match=f"shardfuzz:{fleet}:worker:*"):
        if re.search(rf"-{pid}-[0-9a-f]+$", key.decode()):
            return key.decode()
    return None


def test_three_workers_share_two_findings_and_a_killed_worker_is_gone(redis_server, start_cli, tmp_path):
    """Done-when of issue 27: three workers (separate processes, one killed mid-run) and two
    planted bugs: two findings, each stored once, every other copy a rediscovery; a worker started
    later reports neither as new; ``replay redis://`` reproduces both; the killed worker shows as
    gone and lost nothing."""
    url, fleet = redis_server.url, "three"
    dirs = [tmp_path / f"w{i}" for i in range(4)]
    for d in dirs:
        d.mkdir()
    # two of them from one `--workers 2` (its children are the workers), one on its own
    pair = _worker(
        start_cli,
        url,
        fleet,
        dirs[0],
        "--max-examples",
        "10",
        "--workers",
        "2",
        "--report",
        dirs[0] / "report",
    )
    # the doomed worker starts once both jobs are past replaying the (empty) store: a worker that
    # replays a stored finding first stops there (Hypothesis' reuse phase), so a doomed worker
    # that stored one before the jobs began could leave them nothing else to find (seen under load)
    started: set[str] = set()
    while len(started) < 2:
        line = pair.wait_line(lambda line: re.search(r"\[job [12]\].*: [1-9][0-9]* examples", line), 120)
        started.add(re.search(r"\[job ([12])\]", line).group(1))
    doomed = _worker(start_cli, url, fleet, dirs[2], "--duration", "300s")
    # killed once it has failing examples, while the pair still runs: the others go on without it
    doomed.wait_line(lambda line: re.search(r", [1-9][0-9]* failing", line), 120)
    doomed_key = _worker_doc(url, fleet, doomed.pid)
    assert doomed_key is not None, doomed.output()
    doomed.kill()  # SIGKILL, with its ranks: mid-run, maybe mid-write
    killed_at = time.monotonic()
    code, out, err = pair.finish(240)
    assert code == 1, out + err
    assert "running 2 jobs, up to 2 at once" in out, out
    summary_rows = json.loads((dirs[0] / "summary.json").read_text())
    assert [r["job"] for r in summary_rows] == [1, 2]  # a row per worker, named as its lines are
    assert "parity_bugs [job 1]" in out and "parity_bugs [job 2]" in out, out
    page = (dirs[0] / "report" / "index.html").read_text()  # the parent's page, from its workers' rows
    # each job's findings are on it, whichever of the two bugs a job met (the fleet shares them, so
    # under load both jobs may meet the same one)
    headline = {"mismatch": "outputs mismatch the oracle", "rank-error": "rank 1 raised an exception"}
    kinds = {f["kind"] for r in summary_rows for f in r["findings"]}
    assert page.count('<h2 id="row') == 2 and kinds and kinds <= set(headline), (kinds, page[:2000])
    assert all(headline[k] in page for k in kinds), (kinds, page[:2000])

    store = _client(url)
    stored = sorted(
        k.decode().rsplit(":", 1)[1] for k in store.scan_iter(match=f"shardfuzz:{fleet}:finding:*")
    )
    assert len(stored) == 2, stored
    notes = _notes(dirs[0])
    assert {fid for fid, _ in notes} <= set(stored), (notes, stored)
    for fid in stored:
        doc = json.loads(store.get(f"shardfuzz:{fleet}:finding:{fid}"))  # whole: it parses, all fields
        by_doomed = doc["found_by"].endswith(f"-{doomed.pid}")
        assert notes.count((fid, "new")) + by_doomed == 1, (notes, doc["found_by"])
        seen = {k.decode(): int(v) for k, v in store.hgetall(f"shardfuzz:{fleet}:seen:{fid}").items()}
        assert sum(seen.values()) >= notes.count((fid, "known")), (seen, notes)
        assert {k.decode() for k in store.hgetall(f"shardfuzz:{fleet}:shrink:{fid}")} == set(seen)
        assert doc["failure_file"]["kind"] == doc["kind"] and doc["signature_version"] == SIGNATURE_VERSION
        assert doc["versions"]["torch"] and doc["versions"]["shardfuzz"]
    # the killed worker lost nothing: its failure files are there, whole
    kept = list(dirs[2].glob("*parity_bugs-gloo-*.json"))
    assert kept and all(json.loads(p.read_text())["kind"] for p in kept)

    listed = run_cli("findings", url, "--fleet", fleet, "--report", tmp_path / "fleet-report")
    assert listed.returncode == 0, listed.stderr
    assert f"'{fleet}' at {url}: 2 findings" in listed.stdout
    assert listed.stdout.count("rerun: shardfuzz replay") == 2
    # the fleet's page: every worker that beat, each finding with the report of its failure record
    page = (tmp_path / "fleet-report" / "index.html").read_text()
    # two findings with their reports, and each rediscovery under the worker that made it
    found = page.count('<h3 class="found">')
    assert found == 2 + page.count("a rediscovery (") and page.count("outputs mismatch the oracle") >= 1, (
        page[:3000]
    )
    assert all(f"fleet finding {fid}" in page for fid in stored) and "rank 1 raised" in page, page[:3000]

    # a worker started after both are stored reports neither as new (the corpus replays them)
    late = dirs[3]
    code = run_cli(
        "fuzz", TOY, "--impl", BUGS, "--world-sizes", "2", "--max-examples", "5", "--database", url,
        "--fleet", fleet, "--failures-dir", late, "--summary-json", late / "summary.json",
    ).returncode  # fmt: skip
    assert code == 1
    assert {n for _, n in _notes(late)} == {"known"} and {i for i, _ in _notes(late)} == set(stored)

    # a record from the store may name only shardfuzz's own code unless --trust-refs (docs/trust.md)
    refused = run_cli("replay", url, "--fleet", fleet)
    assert refused.returncode == 2 and "a record from a store of findings" in refused.stderr, refused.stderr
    replayed = run_cli("replay", url, "--fleet", fleet, "--trust-refs")
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "2 replayed: 2 fail, 0 pass" in replayed.stdout
    one = run_cli("replay", url, "--fleet", fleet, "--finding", stored[0], "--trust-refs")
    assert "1 replayed: 1 fail, 0 pass" in one.stdout, one.stdout + one.stderr
    assert f"replaying fleet finding {stored[0]} ..." in one.stderr, one.stderr  # which one, by its id

    # "gone" means no heartbeat for 3 intervals (1 s here): with warm pools everything above can
    # take less than that, and the last beat before the kill would still read as running
    time.sleep(max(0.0, killed_at + GONE_AFTER * 1 + 1.5 - time.monotonic()))
    status = run_cli("status", url, "--fleet", fleet)
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[3:-1] if line.strip()}
    assert rows[doomed_key.rsplit(":", 1)[1]] == "gone", status.stdout
    assert sorted(rows.values()).count("finished") == 3, status.stdout
    assert "fleet total:" in status.stdout.splitlines()[-1]


def test_redis_lost_mid_campaign_keeps_findings_locally(tmp_path, monkeypatch):
    """Redis killed while a campaign runs: it finishes, says so once, and its findings are in its
    failure files (in this process: its pools are the other tests')."""
    from shardfuzz.engine.hooks import Deadline
    from shardfuzz.frontends import campaign

    server = RedisServer(tmp_path)
    client = _client(server.url)

    class DeadlineAfterTheKill(Deadline):
        """The campaign's --duration, brought forward to 3 s after Redis is killed (what it must
        show happens by then; the rest of the 12 s was fuzzing the toy for nothing)."""

        def before_example(self, runner, case):
            if killed_at:
                self.at = min(self.at, killed_at[0] + 3.0)
            super().before_example(runner, case)

    monkeypatch.setattr(campaign, "Deadline", DeadlineAfterTheKill)

    def kill_once_fuzzing():  # once the worker's heartbeat shows examples, kill Redis
        end = time.monotonic() + 120
        while time.monotonic() < end and server.proc.poll() is None:
            for key in client.scan_iter(match="shardfuzz:lost:worker:*"):
                if json.loads(client.get(key) or "{}").get("examples", 0) > 0:
                    server.stop()
                    killed_at.append(time.perf_counter())  # the Deadline's clock
                    return
            time.sleep(0.2)

    killed_at: list[float] = []
    killer = threading.Thread(target=kill_once_fuzzing)
    killer.start()
    try:
        out = run_cli(
            "fuzz", TOY, "--impl", BUGS, "--world-sizes", "2", "--duration", "12s", "--database", server.url,
            "--fleet", "lost", "--failures-dir", tmp_path, env={"SHARDFUZZ_HEARTBEAT": "1"},
        )  # fmt: skip
    finally:
        killer.join()
        server.stop()
    assert out.returncode == 1, out.stdout + out.stderr
    assert server.proc.poll() is not None and killed_at, "Redis was not killed while the campaign ran"
    assert out.stderr.count("lost the shared database redis://127.0.0.1") == 1, out.stderr
    assert f"its findings are in the failure files under {tmp_path}" in out.stderr
    written = sorted(tmp_path.glob("*parity_bugs-gloo-*.json"))
    assert written and all(f"failure file: {p}" in out.stdout for p in written), out.stdout
    # the corpus was multiplexed with Hypothesis' own local directory (not one in the checkout)
    local = pathlib.Path(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"]) / "examples"
    assert any(local.iterdir()), local
    assert not list(pathlib.Path.cwd().glob("<hypothesis*")), "a local database named by an object's repr"


def _finding_doc(found_by: str = "w") -> dict:
    """A fleet finding's stored document, every field valid, no failure record."""
    from shardfuzz.engine.fleet import FORMAT

    return {
        "format": FORMAT, "id": "0123456789abcdef", "signature_version": 1, "signature": "('x',)",
        "identity": "t/i/gloo", "kind": "mismatch", "target": "t", "impl": "i", "backend": "gloo",
        "case": "Case()", "found_by": found_by, "found_at": "now", "shrink_seconds": 0.0, "versions": {},
        "failure_file": None,
    }  # fmt: skip


def test_two_fleets_never_mix_and_a_finding_is_stored_exactly_once(redis_server):
    from shardfuzz.engine.fleet import FleetStore

    a, b = FleetStore(redis_server.url, "race-a"), FleetStore(redis_server.url, "race-b")
    doc = _finding_doc()
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(a.publish(dict(doc)))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(None) == 1 and len(results) == 8  # one stored it; seven found it there
    assert [d["id"] for d in a.findings()] == [doc["id"]]
    assert b.findings() == []


def test_the_findings_list_says_a_rerun_lines_password_is_masked(redis_server):
    """A rerun line pasted from ``findings`` met "Redis refused the password": it shows ``***``."""
    import types

    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.engine.shared_db import redact
    from shardfuzz.frontends.fleet_view import format_findings

    store = FleetStore(redis_server.url, "masked")
    store.publish(_finding_doc())
    docs = store.findings()
    assert "shows as ***" not in format_findings(store, docs)  # no password: nothing to say
    url = redis_server.url.replace("redis://", "redis://:pw@")
    text = format_findings(types.SimpleNamespace(url=url, fleet="masked", shown_url=redact(url)), docs)
    # a rerun line leaves a URL with a password out, for $SHARDFUZZ_DATABASE (with *** it asked the
    # reader to type the password on a command line, where ps shows it)
    rerun = next(line for line in text.splitlines() if "rerun:" in line)
    assert "rerun: shardfuzz replay --finding" in rerun and "redis://" not in rerun, text
    assert "pw@" not in text and "(the URL from $SHARDFUZZ_DATABASE)" in text, text
    assert text.endswith(
        "a rerun line reads it from $SHARDFUZZ_DATABASE, export SHARDFUZZ_DATABASE='redis://:PASSWORD@...' first)"
    ), text
    # and replay reads it there
    out = run_cli("replay", "--fleet", "masked", env={**os.environ, "SHARDFUZZ_DATABASE": redis_server.url})
    assert "fleet finding 0123456789abcdef has no failure record" in out.stderr, out.stdout + out.stderr


def test_a_stored_finding_is_untrusted_input(redis_server):
    from shardfuzz.engine.fleet import FORMAT, FleetStore

    store = FleetStore(redis_server.url, "untrusted")
    client = _client(redis_server.url)
    client.set("shardfuzz:untrusted:finding:feedface", b"{not json")
    with pytest.raises(InvalidArgument, match=r"fleet finding .feedface.*not valid JSON"):
        store.findings()
    client.set("shardfuzz:untrusted:finding:feedface", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidArgument, match=r"not valid JSON \(maximum recursion depth"):
        store.findings()  # a RecursionError traceback before
    client.set("shardfuzz:untrusted:worker:deep-1", "[" * 100_000 + "]" * 100_000)
    assert {"worker": "deep-1", "state": "unreadable"} in store.workers()  # `status` goes on
    client.delete("shardfuzz:untrusted:worker:deep-1")
    client.set("shardfuzz:untrusted:finding:feedface", json.dumps({"format": "other"}))
    with pytest.raises(InvalidArgument, match="field 'format'"):
        store.findings()
    out = run_cli("findings", redis_server.url, "--fleet", "untrusted")
    assert out.returncode == 2 and "feedface" in out.stderr
    doc = {
        "format": FORMAT, "id": "feedface", "signature_version": 1, "signature": "('x',)",
        "identity": "t/i/gloo", "kind": "mismatch", "target": "t", "impl": "i", "backend": "gloo",
        "case": "Case()", "found_by": "w", "found_at": "now", "shrink_seconds": 0.0, "versions": {},
        "failure_file": {"format": "shardfuzz-failure", "version": 1, "case": "__import__('os')"},
    }  # fmt: skip
    client.set("shardfuzz:untrusted:finding:feedface", json.dumps(doc))
    with pytest.raises(InvalidArgument, match=r"'feedface'.*field 'failure_file'.*field '\w+' is missing"):
        store.findings()


def test_a_stores_strings_are_printed_escaped_and_its_numbers_checked(redis_server):
    # a security review: terminal escapes in a finding's fields and in a worker's name and heartbeat
    # reached the terminal raw (title set, screen cleared, fake lines), and a heartbeat whose
    # per_second was "fast" crashed `status` with a traceback
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.frontends.fleet_view import format_findings, format_status

    escape = "\x1b]0;owned\x07\x1b[2J\x1b[31mFAKE"
    store = FleetStore(redis_server.url, "escapes")
    client = _client(redis_server.url)
    doc = {
        **_finding_doc(found_by=escape),
        "kind": escape,
        "impl": escape,
        "case": escape,
        "versions": {"torch": escape},
    }
    client.set("shardfuzz:escapes:finding:0123456789abcdef", json.dumps(doc))
    client.hset("shardfuzz:escapes:seen:0123456789abcdef", escape, 2)
    beat = {
        "state": escape,
        "target": escape,
        "impl": "i",
        "examples": 3,
        "per_second": 1.5,
        "heartbeat": time.time(),
    }
    client.set(f"shardfuzz:escapes:worker:{escape}", json.dumps(beat))
    client.set("shardfuzz:escapes:worker:fast", json.dumps({**beat, "per_second": "fast"}))
    # numbers out of any worker's range: a rate of 1e308 printed 300 digits into the table, and a
    # count of -5 was added to the fleet's total (a new user's audit)
    client.set("shardfuzz:escapes:worker:huge", json.dumps({**beat, "per_second": 1e308}))
    client.set("shardfuzz:escapes:worker:minus", json.dumps({**beat, "examples": -5}))
    text = format_findings(store, store.findings()) + format_status(store, store.workers())
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert "\\x1b]0;owned\\x07" in text  # shown, escaped
    assert "fast                         unreadable heartbeat" in text, text
    assert "huge                         unreadable heartbeat" in text, text
    assert (
        "minus                        unreadable heartbeat" in text and "fleet total: 3 examples" in text
    ), text
    for command in ("findings", "status"):
        out = run_cli(command, redis_server.url, "--fleet", "escapes")
        assert out.returncode == 0 and "\x1b" not in out.stdout + out.stderr, out.stdout + out.stderr
    client.set("shardfuzz:escapes:finding:0123456789abcdef", json.dumps({**doc, "margin": "big"}))
    with pytest.raises(InvalidArgument, match="field 'margin' is 'big', expected a number"):
        store.findings()


@pytest.mark.parametrize(
    "url, message",
    [
        ("redis://:hunter2@127.0.0.1:notaport/0", "not a valid Redis URL"),
        ("ftp://127.0.0.1/0", "unknown scheme 'ftp'"),
        ("redis://127.0.0.1:6379/zero", "database 'zero' is not a number"),
        ("redis:/bad", "a Redis URL is redis://HOST:PORT/N (two slashes)"),  # was a folder 'redis:'
        ("redis::hunter2@localhost:6390", "a Redis URL is redis://HOST:PORT/N (two slashes)"),
        ("redis://:hunter2@127.0.0.1:1/0", "cannot connect to Redis"),
        ("rediss://127.0.0.1:1/0", "or does it take TLS (rediss://)?"),
    ],
)
def test_bad_database_url_exits_2_naming_it_without_the_password(url, message):
    if "connect" in message or "TLS" in message:  # the others are refused before the client is needed
        try:
            import redis  # noqa: F401
        except ImportError:
            _needs("the redis client")
    out = run_cli("fuzz", TOY, "--impl", "two_bugs", "--max-examples", "1", "--database", url)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "hunter2" not in out.stdout + out.stderr


def test_a_server_that_is_not_redis_is_a_usage_error_not_a_traceback():
    """An HTTP proxy on the fleet's address answered "400 Bad Request": status and fuzz --database
    crashed with redis-py's InvalidResponse traceback, exit 1 (which reads as a finding)."""
    import socketserver
    import threading

    class Http400(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(1024)
            self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    try:
        import redis  # noqa: F401
    except ImportError:
        _needs("the redis client")
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Http400) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"redis://:hunter2@127.0.0.1:{server.server_address[1]}/0"
        for args in (("status", url), ("fuzz", TOY, "--max-examples", "1", "--database", url)):
            out = run_cli(*args)
            said = out.stdout + out.stderr
            assert out.returncode == 2 and "does not speak Redis" in said, said
            assert "Traceback" not in said and "hunter2" not in said, said
        server.shutdown()


def test_a_bad_fleet_url_given_to_status_is_named_as_the_url_it_is():
    """``status`` has no --database option; its error named one."""
    out = run_cli("status", "redis://127.0.0.1:notaport/0")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "URL='redis://127.0.0.1:notaport/0' is not a valid Redis URL" in out.stderr, out.stderr
    assert "--database" not in out.stderr, out.stderr


def test_findings_and_status_read_the_url_from_the_environment_as_fuzz_does(redis_server, monkeypatch):
    # the docs advise $SHARDFUZZ_DATABASE to keep a password out of ps; these two required the URL
    from shardfuzz.engine.fleet import FleetStore

    FleetStore(redis_server.url, "from-env").publish(_finding_doc())
    monkeypatch.setenv("SHARDFUZZ_DATABASE", redis_server.url)
    for command in ("findings", "status"):
        out = run_cli(command, "--fleet", "from-env")
        assert out.returncode == 0 and "fleet 'from-env' at redis://" in out.stdout, out.stdout + out.stderr
    monkeypatch.delenv("SHARDFUZZ_DATABASE")
    out = run_cli("status")
    assert (
        out.returncode == 2
        and "needs the fleet's redis://HOST:PORT/N URL, as an argument or in" in out.stderr
    )


def test_wrong_password_exits_2(tmp_path):
    server = RedisServer(tmp_path, "--requirepass", "s3cret")
    try:
        url = f"redis://:hunter3@127.0.0.1:{server.port}/0"
        out = run_cli("status", url)
        anonymous = run_cli("findings", f"redis://127.0.0.1:{server.port}/0")
        # a password in the query (a form the docs list) was told "Redis asks for a password"
        queried = run_cli("status", f"redis://127.0.0.1:{server.port}/0?password=hunter3")
        far = run_cli("status", f"redis://:s3cret@127.0.0.1:{server.port}/99")
    finally:
        server.stop()
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"URL='redis://:***@127.0.0.1:{server.port}/0': Redis refused the password" in out.stderr
    assert "hunter3" not in out.stdout + out.stderr
    assert anonymous.returncode == 2 and "Redis asks for a password" in anonymous.stderr, anonymous.stderr
    assert queried.returncode == 2 and "Redis refused the password" in queried.stderr, queried.stderr
    assert "hunter3" not in queried.stdout + queried.stderr
    assert far.returncode == 2 and "databases 0 to 15" in far.stderr, far.stderr


def test_workers_get_the_database_url_through_the_environment_never_the_command_line(tmp_path, monkeypatch):
    """Each ``--workers`` job's start line and ``ps`` showed the URL, password and all."""
    from shardfuzz.frontends import cli

    server = RedisServer(tmp_path, "--requirepass", "s3cret")
    jobs = []
    monkeypatch.setattr(cli, "run_jobs", lambda js, *a, **k: (jobs.extend(js), ([], [], False))[1])
    monkeypatch.setenv("SHARDFUZZ_DATABASE", "")  # so that what the run sets is undone after the test
    monkeypatch.delenv("SHARDFUZZ_DATABASE")
    url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
    try:
        out = run_cli("fuzz", TOY, "--workers", "2", "--duration", "1s",
                      "--database", url, "--failures-dir", str(tmp_path / "f"))  # fmt: skip
    finally:
        server.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(jobs) == 2 and not any("s3cret" in arg for job in jobs for arg in job), jobs
    assert os.environ.get("SHARDFUZZ_DATABASE") == url  # what the children read


@pytest.mark.parametrize(
    "command,url,said",
    [  # an unknown scheme said "does not exist" with the password; a query string crashed
        ("replay", "redi://:pw42@127.0.0.1:1/0", "unknown scheme 'redi'"),
        ("status", "redis://:pw42@127.0.0.1:1/0?foo=bar", "unknown parameter 'foo'"),
        (
            "findings",
            "redis://:pw42@127.0.0.1:1/0?socket_timeout=abc",
            "socket_timeout='abc' is not a number",
        ),
        ("status", "unix:///tmp/no.sock?db=0&password=pw42", "cannot connect"),
    ],
)
def test_a_bad_url_is_a_usage_error_that_never_shows_its_password(command, url, said):
    out = run_cli(command, url)
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in out.stderr and "pw42" not in out.stdout + out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_missing_redis_client_names_the_extra(monkeypatch):
    from shardfuzz.engine import shared_db

    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(InvalidArgument, match=r"pip install 'shardfuzz\[redis\]' \(redis>=3.0.0\)"):
        shared_db.redis_module()


def test_database_from_every_front_end(monkeypatch):
    from shardfuzz import RunConfig

    assert RunConfig(database="redis://h:1/0", fleet="nightly").fleet == "nightly"
    monkeypatch.setenv("SHARDFUZZ_DATABASE", "redis://h:1/0")
    monkeypatch.setenv("SHARDFUZZ_FLEET", "ci")
    assert (RunConfig().database, RunConfig().fleet) == ("redis://h:1/0", "ci")
    monkeypatch.setenv("SHARDFUZZ_DATABASE", "redis://:pw@h:x/0")
    with pytest.raises(InvalidArgument, match=r"SHARDFUZZ_DATABASE='redis://:\*\*\*@h:x/0'"):
        RunConfig()
    with pytest.raises(InvalidArgument, match="fleet='a b'"):
        RunConfig(database="d", fleet="a b")


def test_pytest_option_and_ini_key(pytester):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    bad = pytester.runpytest_inprocess("--shardfuzz-database=ftp://u:hunter2@h/0", "-q")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--shardfuzz-database='ftp://u:***@h/0': unknown scheme 'ftp'" in bad.stderr.str()
    pytester.makeini("[pytest]\nshardfuzz_database = redis://127.0.0.1:6379/zero\n")
    assert "database 'zero' is not a number" in pytester.runpytest_inprocess("-q").stderr.str()
    pytester.makeini("[pytest]\nshardfuzz_fleet = no spaces\n")
    assert "--shardfuzz-fleet='no spaces'" in pytester.runpytest_inprocess("-q").stderr.str()


def test_workers_need_a_shared_database(monkeypatch, capsys):
    monkeypatch.delenv("SHARDFUZZ_DATABASE", raising=False)
    assert cli.main(["fuzz", "tp_mlp", "--workers", "2"]) == 2
    assert "--workers 2: fleet workers share their examples and findings through a Redis database" in (
        capsys.readouterr().err
    )
    # one that cannot be reached is a usage error before any worker starts (each worker's exit 2
    # read as "the fuzzer itself failed", exit 3)
    monkeypatch.setattr(cli, "_fuzz_jobs", lambda *a: pytest.fail("a worker started"))
    assert cli.main(["fuzz", "tp_mlp", "--workers", "2", "--database", "redis://:pw9@127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert "--database='redis://:***@127.0.0.1:1/0': cannot connect to Redis" in err and "pw9" not in err, err


def test_an_unreachable_url_from_the_environment_is_named_as_the_variable_it_came_from(monkeypatch, capsys):
    """A user who set only $SHARDFUZZ_DATABASE was told to fix a --database they never gave."""
    monkeypatch.setenv("SHARDFUZZ_DATABASE", "redis://:pw9@127.0.0.1:1/0")
    monkeypatch.setattr(cli, "_fuzz_jobs", lambda *a: pytest.fail("a worker started"))
    assert cli.main(["fuzz", "tp_mlp", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "SHARDFUZZ_DATABASE='redis://:***@127.0.0.1:1/0': cannot connect to Redis" in err, err
    assert "--database" not in err and "pw9" not in err, err
    # given on the command line, the option is named (the variable may hold another URL)
    argv = ["fuzz", "tp_mlp", "--workers", "2", "--database", "redis://127.0.0.1:2/0"]
    assert cli.main(argv) == 2
    assert "--database='redis://127.0.0.1:2/0': cannot connect" in capsys.readouterr().err


def test_workers_draw_fresh_seeds_even_under_a_derandomized_profile(redis_server, monkeypatch, tmp_path):
    """Derandomized workers (the ci profile, or any profile under CI=true) would all run the same
    examples: the children get a configuration with derandomize off, and one child per worker."""
    handed = {}

    def fake_jobs(args, targets, config):
        handed.update(targets=targets, config=config)
        return 0

    monkeypatch.setattr(cli, "_fuzz_jobs", fake_jobs)
    argv = ["fuzz", TOY, "--workers", "3", "--profile", "shardfuzz-ci", "--database", redis_server.url]
    assert cli.main([*argv, "--failures-dir", str(tmp_path)]) == 0
    assert handed["targets"] == [TOY] * 3
    assert handed["config"].derandomize is False


def test_a_finding_its_finder_shrank_further_replaces_the_fleets_copy(redis_server, tmp_path):
    """A finding stored as the deadline cut its shrink, then shrunk further by its finder (a cut
    shrink finished), replaces the fleet's copy when its signature is unchanged: ``replay
    redis://`` then reruns the smallest case. Another worker never replaces it, nor does a finding
    of another signature."""
    import copy
    import dataclasses

    import shardfuzz
    from shardfuzz import Runner
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.engine.fleet_worker import FleetWorker
    from shardfuzz.frontends import campaign

    result = shardfuzz.run(
        TOY, BUGS, world_sizes=(2,), profile="shardfuzz-ci", database=None,
        failures_dir=str(tmp_path / "unused"),
    )  # fmt: skip
    small, crash = result.failures  # its two planted bugs: two signatures
    large = copy.copy(small)
    large.case = dataclasses.replace(small.case, seed=small.case.seed + 4242)  # as the deadline left it
    runner = Runner(TOY, BUGS)
    worker, other = FleetWorker(redis_server.url, "improve"), FleetWorker(redis_server.url, "improve")
    other.name = "elsewhere-1"
    note = worker.settle(campaign.stable_identity(runner), large, None, True, 1.0)
    assert note["fleet"] == "new"
    store = FleetStore(redis_server.url, "improve")
    (stored,) = store.findings()
    out = campaign.Outcome(
        "toy", runner=runner, findings=[(small, None)], fleet=[{**note, "offered_case": repr(large.case)}]
    )
    campaign._improve_fleet_copies(out, runner, other, 0.5)  # not its finding: left as it is
    assert store.findings()[0]["case"] == repr(large.case)
    campaign._improve_fleet_copies(out, runner, worker, 0.5)
    (now,) = store.findings()
    assert now["case"] == repr(small.case) and now["id"] == note["id"]
    assert now["found_at"] == stored["found_at"] and now["shrink_seconds"] == 1.5
    assert out.fleet[0]["offered_case"] == repr(small.case)  # no "offered ... as" line any more
    # another signature: another finding, never written over this one
    assert not worker.improve(campaign.stable_identity(runner), crash, None, note["id"], 0.0)
    assert store.findings()[0]["case"] == repr(small.case)


def test_replay_of_an_empty_fleet_names_the_fleet(redis_server):
    """'no failure files (*.json) or findings in ['redis://...']': a Python list, and no fleet."""
    out = run_cli("replay", redis_server.url, "--fleet", "nosuch")
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"or findings in fleet 'nosuch' at {redis_server.url}" in out.stderr, out.stderr


def test_the_fleet_page_shows_a_worker_that_rediscovered_a_finding_as_finding_it(redis_server):
    """A worker that printed 'FOUND mismatch' (a rediscovery) was shown as 'nothing found'."""
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.frontends.fleet_view import fleet_rows

    store = FleetStore(redis_server.url, "again")
    doc = _finding_doc(found_by="first")
    assert store.publish(doc) is None
    for worker in ("first", "second", "idle"):
        store.heartbeat(worker, {"target": "t", "impl": "i", "examples": 5, "state": "running"}, 60.0)
    store.rediscovered(doc["id"], "second", 1.5)
    rows = {r["impl"].split("(worker ")[1].split(",")[0]: r for r in fleet_rows(redis_server.url, "again")}
    assert rows["first"]["found"] and "(no failure record)" in rows["first"]["findings"][0]["report"]
    assert rows["second"]["found"], rows["second"]
    assert rows["second"]["findings"][0]["report"].startswith(
        "a rediscovery (1 time(s)) of fleet finding 0123456789abcdef, first found by first"
    )
    assert not rows["idle"]["found"] and rows["idle"]["findings"] == []


def test_a_finding_the_deadline_cut_is_offered_only_once_shrunk_and_an_interrupted_one_never(
    redis_server, tmp_path, monkeypatch
):
    """Offered as the deadline cut it, an unshrunk finding was a fleet finding of its own ("shrink
    0.0s", world 4, hidden 11) beside the bug's shrunk one, and one Ctrl-C cut too (a new user's
    two-machine nightly): the fleet holds the case the campaign finished shrinking, or nothing."""
    import io

    from shardfuzz import RunConfig
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.engine.hooks import Deadline
    from shardfuzz.frontends import campaign

    class DeadlineAtFirstFinding(Deadline):  # the shrink is cut before its first step
        def on_finding(self, context, finding):
            self.at = min(self.at, time.perf_counter())

    monkeypatch.setattr(campaign, "Deadline", DeadlineAtFirstFinding)
    published, publish = [], FleetStore.publish
    monkeypatch.setattr(
        FleetStore, "publish", lambda self, doc: published.append(doc["case"]) or publish(self, doc)
    )
    causes = os.path.join(HERE, "data", "cause_impls.py") + "::slow_wrong"
    config = RunConfig(
        deadline=120, finish_shrink=60, world_sizes=(2,), failures_dir=str(tmp_path),
        database=redis_server.url, fleet="deferred",
    )  # fmt: skip
    out = campaign.fuzz_one(TOY, causes, config, stream=io.StringIO())
    [(finding, _)] = out.findings
    [done] = out.finished
    assert done.complete and done.cut_case != finding.case  # shrunk further after the deadline
    [stored] = FleetStore(redis_server.url, "deferred").findings()
    assert published == [repr(finding.case)], published  # offered once, shrunk: never the cut case
    assert stored["case"] == repr(finding.case), stored["case"]
    assert out.fleet[0]["fleet"] == "new" and out.fleet[0]["id"] == stored["id"]

    # Ctrl-C while the campaign finishes the cut shrink: the finding kept, not offered, no traceback
    def interrupted(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(campaign, "finish_shrink", interrupted)
    other_db = redis_server.url.rsplit("/", 1)[0] + "/1"  # not the corpus that holds the shrunk case
    stopped = campaign.fuzz_one(TOY, causes, config.replace(database=other_db), stream=io.StringIO())
    assert stopped.interrupted and len(stopped.findings) == 1, stopped.findings
    assert stopped.fleet[0]["fleet"] == "not offered", stopped.fleet
    assert not FleetStore(other_db, "deferred").findings()
    # and status says so: the last heartbeat came after the finishing phase (it said "finished")
    assert [w["state"] for w in FleetStore(other_db, "deferred").workers()] == ["interrupted"]

    import copy

    as_left = copy.copy(finding)
    as_left.cut_short = "interrupted"  # Ctrl-C in the search's own shrink
    cut = campaign.Outcome("t", runner=out.runner, findings=[(as_left, None)], interrupted=True)
    cut.fleet = [{"id": "x", "fleet": "pending"}]
    campaign._offer_deferred(cut, out.runner, campaign.FleetWorker(redis_server.url, "stopped"), 0.0)
    assert cut.fleet[0]["fleet"] == "not offered" and not FleetStore(redis_server.url, "stopped").findings()
    assert "the campaign was stopped while it shrank" in campaign.fleet_note(cut.fleet[0])


def test_ctrl_c_as_the_campaign_offers_its_finding_keeps_it_and_says_interrupted(redis_server, monkeypatch):
    """A Ctrl-C or SIGTERM past the finishing phase's own catch (while the fleet is offered the
    finding) escaped as exit 130 with no report, and the worker read "finished"."""
    import io

    from shardfuzz import RunConfig
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.frontends import campaign

    def offered(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(campaign, "_offer_deferred", offered)
    config = RunConfig(max_examples=20, world_sizes=(2,), database=redis_server.url, fleet="offer-ki")
    out = campaign.fuzz_one(TOY, "wrong_rank1", config, stream=io.StringIO())
    assert out.interrupted and out.findings, out.findings
    assert [w["state"] for w in FleetStore(redis_server.url, "offer-ki").workers()] == ["interrupted"]


def test_a_worker_whose_search_raised_says_failed_and_the_error_goes_on(redis_server, monkeypatch):
    """Whatever else ends a campaign's search (here an error of the engine's own) reaches the caller
    as it was, and the worker's last heartbeat says it failed, not that it runs or finished."""
    import io

    from shardfuzz import RunConfig
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.frontends import campaign

    def broken(*_args, **_kw):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(campaign, "search", broken)
    config = RunConfig(max_examples=5, world_sizes=(2,), database=redis_server.url, fleet="broken-worker")
    with pytest.raises(RuntimeError, match="the engine broke"):
        campaign.fuzz_one(TOY, None, config, stream=io.StringIO())
    assert [w["state"] for w in FleetStore(redis_server.url, "broken-worker").workers()] == ["failed"]


def test_a_worker_stopped_by_ctrl_c_inside_its_search_says_interrupted(redis_server, monkeypatch):
    """A worker stopped by SIGINT or SIGTERM read `finished` in `status`: the search's own
    interruption was read only after the last heartbeat."""
    import io

    from shardfuzz import RunConfig
    from shardfuzz.engine.fleet import FleetStore
    from shardfuzz.engine.search import Result
    from shardfuzz.errors import Finding
    from shardfuzz.frontends import campaign

    kept = Finding("a wrong sum, as Ctrl-C left its shrink")
    kept.cut_short = "interrupted"

    def stopped(runner, *_args, **_kw):  # Ctrl-C in the shrink: the finding kept, the run interrupted
        return Result(
            runner.target.name, runner.impl_name, runner.backend, found=True, failures=[kept],
            shrink_cut_short=True, interrupted=True,
        )  # fmt: skip

    monkeypatch.setattr(campaign, "search", stopped)
    config = RunConfig(deadline=60, world_sizes=(2,), database=redis_server.url, fleet="stopped-worker")
    out = campaign.fuzz_one(TOY, None, config, stream=io.StringIO())
    assert out.interrupted
    [worker] = FleetStore(redis_server.url, "stopped-worker").workers()
    assert worker["state"] == "interrupted", worker
    assert (
        out.fleet[0]["fleet"] == "not offered"
        and not FleetStore(redis_server.url, "stopped-worker").findings()
    )


def test_a_run_replays_the_smallest_of_a_large_shared_corpus_and_all_of_the_others():
    # a new user's fleet: 666 primary entries after 130 runs (each run's shrink saves its own), and
    # a worker started later replayed them all for 2 m 42 s before it searched
    from hypothesis.database import InMemoryExampleDatabase

    from shardfuzz.engine.database import PRIMARY_REPLAYED, keyed_database

    db = keyed_database(InMemoryExampleDatabase(), "t/i/gloo")
    entries = [bytes([i % 7]) * (1 + i % 40) + i.to_bytes(2, "big") for i in range(600)]
    for e in entries:
        db.save(b"key", e)
        db.save(b"key.secondary", e)
    replayed = list(db.fetch(b"key"))
    assert replayed == sorted(entries, key=lambda v: (len(v), v))[:PRIMARY_REPLAYED]
    assert sorted(db.fetch(b"key.secondary")) == sorted(entries)  # Hypothesis samples that one itself
    small = keyed_database(InMemoryExampleDatabase(), "t/i/gloo")
    for e in entries[:5]:
        small.save(b"key", e)
    assert sorted(small.fetch(b"key")) == sorted(entries[:5])  # a machine's own corpus: every entry


def test_two_workers_of_one_host_name_and_pid_are_two_workers(monkeypatch):
    """Two containers with the same hostname and pid (unshare --pid) counted as one worker: status
    showed one, and each was told it had rediscovered its own finding."""
    from shardfuzz.engine.fleet import worker_name

    monkeypatch.setattr("socket.gethostname", lambda: "worker")
    monkeypatch.setattr("os.getpid", lambda: 3)
    a, b = worker_name(), worker_name()
    assert a != b and a.startswith("worker-3-") and b.startswith("worker-3-"), (a, b)


def test_a_failing_example_another_worker_saved_is_shrunk_again_not_reported_as_it_is():
    """Hypothesis reports a failing entry of its primary corpus as already shrunk, and a fleet
    worker saves its shrink steps there as it goes: two workers started together stored a case
    shrunk 0.1 s as a second "distinct" finding of one bug. The shared store's primary entries are
    fetched as the secondary corpus, which Hypothesis shrinks."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis.database import InMemoryExampleDatabase, MultiplexedDatabase, choices_to_bytes

    from shardfuzz.engine.shared_db import _fallible_class

    shared, local, seen = InMemoryExampleDatabase(), InMemoryExampleDatabase(), []

    @settings(
        database=MultiplexedDatabase(local, _fallible_class()(shared, "redis://shared")), max_examples=50
    )
    @given(st.integers(0, 1000))
    def worker(x):
        seen.append(x)
        assert x < 10

    with pytest.raises(AssertionError):  # a first run, for the key Hypothesis saves this test under
        worker()
    (primary,) = [k for k in local.data if not k.endswith((b".secondary", b".pareto"))]
    local.data.clear()
    shared.data.clear()
    shared.save(primary, choices_to_bytes((50,)))  # another worker's shrink step: 10 is minimal
    seen.clear()
    with pytest.raises(AssertionError):
        worker()
    assert seen[0] == 50 and seen[-1] == 10, seen  # replayed first, then shrunk: 10 is what is reported
    # a large shared primary corpus still gives only its smallest entries (KeyedDatabase's limit:
    # a later worker spent 2 m 42 s replaying 666 of them)
    from shardfuzz.engine.database import PRIMARY_REPLAYED

    for x in range(200):
        shared.save(b"k", choices_to_bytes((x,)))
    served = list(_fallible_class()(shared, "redis://shared").fetch(b"k.secondary"))
    assert sorted(served) == sorted(choices_to_bytes((x,)) for x in range(PRIMARY_REPLAYED)), len(served)
