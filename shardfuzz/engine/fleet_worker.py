"""One campaign as a worker of a fleet: heartbeats, and its findings settled against the fleet's.

A worker is a plain ``shardfuzz fuzz TARGET --duration 8h --database redis://...`` process. Each of
its distinct findings (by :func:`shardfuzz.engine.fleet.signature_of`, after the shrink: a shrink the
deadline cut is finished first, and one Ctrl-C or SIGTERM cut is never offered) is offered to the
fleet's store: the first worker to store it owns it (a new finding); every later copy is counted as
a rediscovery of that worker, with the shrink time it spent on it (from the run's first failing
example to the run's end, shared among the run's findings). Redis going away mid-campaign is said
once (:class:`~shardfuzz.engine.shared_db.RedisLost`); the campaign goes on with its local database and
failure files.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
from typing import Any

from shardfuzz.engine.failures import versions
from shardfuzz.engine.fleet import FleetStore, finding_doc, finding_id, worker_name
from shardfuzz.engine.hooks import RunHooks
from shardfuzz.engine.shared_db import RedisLost, is_redis_url
from shardfuzz.errors import Finding
from shardfuzz.limits import env_int


def heartbeat_seconds() -> int:
    """``$SHARDFUZZ_HEARTBEAT``: seconds between a worker's heartbeats (default 10)."""
    return env_int("SHARDFUZZ_HEARTBEAT", 10, 1)


class FleetWorker(RunHooks):
    """The fleet side of one campaign (a hook: it notes when each run's first failure is seen)."""

    def __init__(self, url: str, fleet: str) -> None:
        self.store = FleetStore(url, fleet)
        self.name = worker_name()
        self.interval = heartbeat_seconds()
        self.run_failing_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beating = False

    @classmethod
    def for_config(cls, config: Any) -> FleetWorker | NoFleet:
        """A worker of the configuration's fleet (connected now: an unreachable Redis is a usage
        error before any fuzzing), or :class:`NoFleet` without a Redis database."""
        return cls(config.database, config.fleet) if is_redis_url(config.database) else NoFleet()

    # -- hook -----------------------------------------------------------------------------------------
    def on_finding(self, context: Any, finding: Finding) -> None:  # noqa: ARG002 (the hook signature)
        if self.run_failing_since is None:
            self.run_failing_since = time.perf_counter()

    def begin_run(self) -> None:
        self.run_failing_since = None

    def run_shrink_seconds(self, findings: int) -> float:
        """This run's time from its first failing example to now, shared among ``findings``."""
        if self.run_failing_since is None or findings < 1:
            return 0.0
        return (time.perf_counter() - self.run_failing_since) / findings

    # -- findings ------------------------------------------------------------------------------------
    def settle(
        self, identity: str, finding: Finding, path: str | None, locally_new: bool, shrink: float
    ) -> dict[str, Any]:
        """Offer ``finding`` to the fleet; what the fleet says of it: ``{"id", "fleet": "new" |
        "known" | "lost", "found_by", "found_at"}``."""
        fid = finding_id(identity, finding)
        note: dict[str, Any] = {"id": fid}
        if RedisLost.lost is not None:
            return {**note, "fleet": "lost"}
        if locally_new:
            doc = finding_doc(identity, finding, _record(path), self.name, shrink)
            stored = self.store.publish(doc)
            if RedisLost.lost is not None:
                return {**note, "fleet": "lost"}
            if stored is None:
                return {**note, "fleet": "new", "found_by": self.name, "found_at": doc["found_at"]}
        else:
            stored = {}
        self.store.rediscovered(fid, self.name, shrink)
        return {
            **note,
            "fleet": "known",
            "found_by": stored.get("found_by"),
            "found_at": stored.get("found_at"),
        }

    def defer(self, identity: str, finding: Finding) -> dict[str, Any]:
        """The note of a finding whose shrink was cut, not offered yet: the campaign offers it
        (:meth:`settle`) once it is shrunk further, or says why it never is (interrupted). Offered
        at once, its unshrunk case was a fleet finding of its own beside the bug's shrunk one."""
        return {"id": finding_id(identity, finding), "fleet": "pending"}

    def improve(self, identity: str, finding: Finding, path: str | None, fid: str, shrink: float) -> bool:
        """``finding``, shrunk further here after it was stored as fleet finding ``fid`` by this
        worker, replaces the fleet's copy when its signature is still ``fid``'s; True if it did."""
        if RedisLost.lost is not None or finding_id(identity, finding) != fid:
            return False
        return self.store.improve(finding_doc(identity, finding, _record(path), self.name, shrink))

    # -- heartbeats ----------------------------------------------------------------------------------
    def start(self, describe: Any) -> None:
        """Heartbeat ``describe()`` (a dict) every interval until :meth:`stop`."""
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self._describe = describe
        self._beating = True  # before the first beat: a stop from here on writes the last one
        self._beat("running")

        def loop() -> None:
            while not self._stop.wait(self.interval):
                self._beat("running")

        self._thread = threading.Thread(target=loop, daemon=True, name="shardfuzz-heartbeat")
        self._thread.start()

    def stop(self, state: str = "finished") -> None:
        self._stop.set()
        if not self._beating:  # never started: no state of it to end
            return
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
        self._beat(state)

    def _beat(self, state: str) -> None:
        fields = {
            **self._describe(),
            "state": state,
            "started": self.started,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "versions": versions(),
        }
        self.store.heartbeat(self.name, fields, self.interval)


def _record(path: str | None) -> dict[str, Any] | None:
    """The failure file this worker just wrote (its own: read back as written)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None  # the finding is stored without its file rather than not at all
    return data if isinstance(data, dict) else None


class NoFleet(RunHooks):
    """A campaign without a fleet: every fleet step does nothing (one code path in the campaign)."""

    def begin_run(self) -> None:
        pass

    def run_shrink_seconds(self, findings: int) -> float:  # noqa: ARG002 (the worker's signature)
        return 0.0

    def settle(self, *args: Any) -> None:  # noqa: ARG002 (the worker's signature)
        return None

    def defer(self, *args: Any) -> None:  # noqa: ARG002 (the worker's signature)
        return None

    def improve(self, *args: Any) -> bool:  # noqa: ARG002 (the worker's signature)
        return False

    def start(self, describe: Any) -> None:
        pass

    def stop(self, state: str = "finished") -> None:
        pass
