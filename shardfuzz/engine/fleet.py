"""A fleet's findings and workers in one shared Redis (``--database redis://...``, ``--fleet NAME``).

Keys (all under ``shardfuzz:FLEET:``, so fleets never mix; none of them expire, unlike the corpus):

* ``finding:ID``: one JSON document per distinct finding, written with ``SET NX`` (one command, so
  two workers that find the same bug at once leave exactly one, and a worker killed while writing
  leaves the whole finding or none): signature and its version, who found it and when, the
  versions it was found with, the shrink time its finder spent, and its failure file's content.
* ``seen:ID`` / ``shrink:ID``: per worker, how often it found that finding again, and the shrink
  seconds it spent on those rediscoveries (a signature is known only after the shrink, so a
  rediscovery is told apart after it: the time spent on it is counted, not saved).
* ``worker:WORKER``: each worker's heartbeat (examples, rate, trigger shares, versions, state);
  one whose heartbeat is older than :data:`GONE_AFTER` heartbeats is shown as gone.

The ID is a hash of the signature version, the target/implementation/backend and the signature
(:func:`signature_of`, the one place that says how findings are told apart). Everything read back
is untrusted: sizes are bounded, fields are type-checked, and the failure file is checked by the
same checks as a file on disk (:func:`shardfuzz.engine.failure_schema.validate_failure_record` when read,
:func:`shardfuzz.engine.failure_load.prepare` as a record of a store, with its trust rule, when replayed).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import secrets
import socket
import time
from typing import Any

from shardfuzz.engine.failure_schema import MAX_FILE_BYTES, printable, shown, validate_failure_record
from shardfuzz.engine.failures import versions
from shardfuzz.engine.shared_db import RedisLost, connect, fleet_prefix, redact, redis_errors
from shardfuzz.errors import Finding, InvalidArgument
from shardfuzz.signature import SIGNATURE_VERSION, finding_signature

FORMAT = "shardfuzz-fleet-finding"
#: the largest stored finding read back: a failure file's bound and room for the fleet's fields
MAX_FINDING_BYTES = MAX_FILE_BYTES + 64 * 1024
#: a worker whose last heartbeat is older than this many heartbeat intervals is shown as gone
GONE_AFTER = 3


def signature_of(finding: Finding) -> str:
    """What tells two shrunk findings apart: the versioned signature by cause
    (:func:`shardfuzz.signature.finding_signature`; its version is :data:`SIGNATURE_VERSION`, so
    entries of an older version are keyed apart from new ones and can be told from them)."""
    return finding_signature(finding)


def finding_id(identity: str, finding: Finding) -> str:
    """The fleet-wide id of ``finding`` of the target/implementation/backend ``identity``."""
    text = json.dumps([SIGNATURE_VERSION, identity, repr(signature_of(finding))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def worker_name() -> str:
    """The host, the process and a random suffix: two containers with the same hostname and the
    same pid (``unshare --pid``, pid 3 in each) counted as one worker, and each was told it had
    rediscovered its own finding."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class FleetStore:
    """The findings and workers of fleet ``fleet`` in the Redis at ``url``."""

    def __init__(self, url: str, fleet: str, what: str | None = None) -> None:
        self.url, self.shown_url, self.fleet = url, redact(url), fleet
        self.redis = connect(url, what)
        self.prefix = fleet_prefix(fleet)
        self.errors = redis_errors()

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    # -- writing (a worker): every Redis error is said once, and the worker goes on locally ---------
    def _safely(self, fn: Any, default: Any = None) -> Any:
        if RedisLost.lost is not None:
            return default
        try:
            return fn()
        except self.errors as e:
            RedisLost.note(self.shown_url, e)
            return default

    def publish(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        """Store ``doc`` as finding ``doc['id']`` unless the fleet has it; returns None when it was
        stored now (a new finding), else the stored one (a rediscovery; checked, may be {})."""
        key = self._key("finding", doc["id"])

        def put() -> dict[str, Any] | None:
            if self.redis.set(key, json.dumps(doc), nx=True):
                return None
            return self._read(doc["id"], self.redis.get(key)) or {}

        return self._safely(put, default=None)

    def improve(self, doc: dict[str, Any]) -> bool:
        """Replace finding ``doc['id']`` by ``doc`` (its case shrunk further, same signature) when
        ``doc['found_by']`` stored it; when it was found stays, the shrink times add up. True when
        replaced. Only its finder writes a stored finding (others only try ``publish``'s NX set),
        so reading and writing need no transaction."""
        key = self._key("finding", doc["id"])

        def put() -> bool:
            stored = self._read(doc["id"], self.redis.get(key))
            if stored is None or stored["found_by"] != doc["found_by"]:
                return False
            shrink = stored["shrink_seconds"] + doc["shrink_seconds"]
            self.redis.set(key, json.dumps({**doc, "found_at": stored["found_at"], "shrink_seconds": shrink}))
            return True

        return bool(self._safely(put, default=False))

    def rediscovered(self, fid: str, worker: str, shrink_seconds: float) -> None:
        def count() -> None:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hincrby(self._key("seen", fid), worker, 1)
            pipe.hincrbyfloat(self._key("shrink", fid), worker, round(shrink_seconds, 3))
            pipe.execute()

        self._safely(count)

    def heartbeat(self, worker: str, fields: dict[str, Any], interval: float) -> None:
        doc = {**fields, "heartbeat": time.time(), "interval": interval}
        key = self._key("worker", worker)
        self._safely(lambda: self.redis.set(key, json.dumps(doc), ex=7 * 24 * 3600))

    # -- reading (the fleet view): untrusted input ----------------------------------------------------
    def _scan(self, kind: str) -> list[str]:
        pattern = self._key(kind, "*")
        names = [k.decode() if isinstance(k, bytes) else k for k in self.redis.scan_iter(match=pattern)]
        return sorted(n[len(pattern) - 1 :] for n in names)

    def _read(self, fid: str, raw: Any) -> dict[str, Any] | None:
        where = f"fleet finding {fid!r} in {self.shown_url} (fleet {self.fleet!r})"
        if raw is None:
            return None
        if len(raw) > MAX_FINDING_BYTES:
            raise InvalidArgument(f"{where}: {len(raw)} bytes, more than the {MAX_FINDING_BYTES} allowed")
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep to decode
            raise InvalidArgument(f"{where}: not valid JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise InvalidArgument(f"{where}: field 'format' is not {FORMAT!r} (written by something else?)")
        for field, kind in FIELDS.items():
            if not isinstance(doc.get(field), kind):
                raise InvalidArgument(f"{where}: field {field!r} is {doc.get(field)!r}, expected {kind}")
        if doc["id"] != fid:
            raise InvalidArgument(f"{where}: field 'id' is {doc['id']!r}, not the key's id")
        if not isinstance(doc.get("margin"), (int, float, type(None))) or isinstance(doc.get("margin"), bool):
            raise InvalidArgument(f"{where}: field 'margin' is {shown(doc.get('margin'))}, expected a number")
        if doc["failure_file"] is not None:  # the schema of a failure file; imports nothing
            validate_failure_record(doc["failure_file"], f"{where}: field 'failure_file'")
        # every other string as it may be printed (the failure file's fields are printed by shown())
        return {k: v if k == "failure_file" else _printable(v) for k, v in doc.items()}

    def findings(self) -> list[dict[str, Any]]:
        """Every finding of the fleet, checked, with its rediscovery counts (oldest first)."""
        out = []
        for fid in self._scan("finding"):
            doc = self._read(fid, self.redis.get(self._key("finding", fid)))
            if doc is None:
                continue  # removed since the scan
            doc["seen"] = _printable(_numbers(self.redis.hgetall(self._key("seen", fid))))
            doc["shrink_again"] = _printable(_numbers(self.redis.hgetall(self._key("shrink", fid))))
            out.append(doc)
        return sorted(out, key=lambda d: (d["found_at"], d["id"]))

    def workers(self) -> list[dict[str, Any]]:
        out = []
        for name in self._scan("worker"):
            raw = self.redis.get(self._key("worker", name))
            try:
                doc = json.loads(raw) if raw is not None and len(raw) < MAX_FINDING_BYTES else None
            except (ValueError, RecursionError):
                doc = None
            try:  # the numbers the view computes with; any other value is shown, escaped
                if not isinstance(doc, dict):
                    raise TypeError(type(doc).__name__)
                heartbeat = _within(float(doc.get("heartbeat") or 0), 0.0, 1e11)
                interval = _within(float(doc.get("interval") or 10), 1e-3, 1e6)
                numbers = {
                    "examples": _within(int(doc.get("examples") or 0), 0, MAX_COUNT),
                    "per_second": _within(float(doc.get("per_second") or 0.0), 0.0, 1e9),
                    "runs": _within(int(doc.get("runs") or 0), 0, MAX_COUNT),
                    "heartbeat": heartbeat,
                    "interval": interval,
                    "triggers": {
                        str(t): _within(float(x), 0.0, 1.0)
                        for t, x in dict(doc.get("triggers") or {}).items()
                    },
                }
            except (TypeError, ValueError, OverflowError):  # a heartbeat another writer (or a forger) wrote
                out.append({"worker": printable(name), "state": "unreadable"})
                continue
            doc = {**_printable(doc), **_printable(numbers), "worker": printable(name)}
            doc["state"] = str(doc.get("state"))
            age = time.time() - heartbeat
            doc["age"] = age
            if doc["state"] == "running" and age > GONE_AFTER * interval:
                doc["state"] = "gone"
            out.append(doc)
        return out


#: the largest count a heartbeat may carry (examples, runs): more is no worker's
MAX_COUNT = 10**15


def _within(value: Any, low: Any, high: Any) -> Any:
    """``value`` where it is a number in ``[low, high]``, else ValueError: a forged heartbeat's
    ``per_second`` of 1e308 printed 300 digits into the status table, and ``examples: -5`` was
    added to the fleet's total."""
    if not low <= value <= high:  # NaN fails both
        raise ValueError(f"{value!r} is outside [{low}, {high}]")
    return value


def _printable(value: Any) -> Any:
    """``value`` with every string in it (keys too) escaped as :func:`printable` does: the fleet
    view prints what a store holds, and a store is written by other machines (a terminal escape in
    a worker's name set the reader's window title and cleared its screen)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "signature_version": int,
    "signature": str,
    "identity": str,
    "kind": str,
    "target": str,
    "impl": str,
    "backend": str,
    "case": str,
    "found_by": str,
    "found_at": str,
    "shrink_seconds": (int, float),
    "versions": dict,
    "failure_file": (dict, type(None)),
}


def _numbers(raw: dict) -> dict[str, float]:
    out = {}
    for k, v in raw.items():
        try:
            out[k.decode() if isinstance(k, bytes) else str(k)] = float(v)
        except (TypeError, ValueError):
            continue  # a count that is not a number is not counted
    return out


def finding_doc(
    identity: str, finding: Finding, record: dict[str, Any] | None, worker: str, shrink_seconds: float
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "id": finding_id(identity, finding),
        "signature_version": SIGNATURE_VERSION,
        "signature": repr(signature_of(finding)),
        "identity": identity,
        "kind": finding.kind,
        "target": identity.split("/", 1)[0],
        "impl": (record or {}).get("impl") or identity,
        "backend": identity.rsplit("/", 1)[-1],
        "margin": finding.ratio,
        "case": repr(finding.case),
        "found_by": worker,
        "found_at": _now(),
        "shrink_seconds": round(shrink_seconds, 3),
        "versions": versions(),
        "failure_file": record,
    }
