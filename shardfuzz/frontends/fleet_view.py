"""The fleet view: ``shardfuzz findings redis://...``, ``shardfuzz status redis://...`` and the
fleet side of ``shardfuzz replay redis://...`` (its findings' failure files, checked by the same
loader as files on disk)."""

from __future__ import annotations

import copy
import shlex
import sys
from typing import Any

from shardfuzz.engine.failure_load import prepare
from shardfuzz.engine.fleet import FleetStore
from shardfuzz.engine.shared_db import env_fleet, redact
from shardfuzz.errors import InvalidArgument
from shardfuzz.report.closest_pass import margin_text


def _store(url: str, fleet: str | None) -> FleetStore:
    return FleetStore(url, fleet or env_fleet(), "URL")


def rerun_command(url: str, fleet: str, fid: str) -> str:
    """The line that replays finding ``fid``: a URL with a password is left out, for
    ``$SHARDFUZZ_DATABASE`` to give (written with *** it asked the reader to type the password on a
    command line, where ps shows it)."""
    secret = redact(url) != url
    parts = ["shardfuzz", "replay", *([] if secret else [url]), "--finding", fid]
    if fleet != "default":
        parts += ["--fleet", fleet]
    line = " ".join(shlex.quote(p) for p in parts)
    return f"{line}   (the URL from $SHARDFUZZ_DATABASE)" if secret else line


def format_findings(store: FleetStore, docs: list[dict[str, Any]]) -> str:
    lines = [
        f"fleet {store.fleet!r} at {store.shown_url}: {len(docs)} finding{'' if len(docs) == 1 else 's'}"
    ]
    for d in docs:
        margin = f", margin {margin_text(d['margin'])}" if isinstance(d.get("margin"), (int, float)) else ""
        again = sum(d["seen"].values())
        shrink_again = sum(d["shrink_again"].values())
        v = d["versions"]
        lines += [
            f"\n{d['id']}  {d['kind']} of {d['target']}/{d['impl']} on {d['backend']}{margin}",
            f"  smallest case its finder reached: {d['case']}",
            f"  signature (v{d['signature_version']}): {d['signature']}",
            f"  found by {d['found_by']} at {d['found_at']} (shrink {d['shrink_seconds']:.1f}s), with "
            f"shardfuzz {v.get('shardfuzz')}, torch {v.get('torch')}",
            f"  found again {again:.0f} times, {shrink_again:.1f}s of shrinking spent on them"
            + (": " + ", ".join(f"{w} {n:.0f}x" for w, n in sorted(d["seen"].items())) if again else ""),
            f"  rerun: {rerun_command(store.url, store.fleet, d['id'])}",
        ]
    if docs and redact(store.url) != store.url:  # a pasted rerun line met "Redis refused the password"
        lines.append(
            "\n(the URL holds a password: a rerun line reads it from $SHARDFUZZ_DATABASE, "
            "export SHARDFUZZ_DATABASE='redis://:PASSWORD@...' first)"
        )
    return "\n".join(lines)


def cmd_findings(url: str, fleet: str | None) -> int:
    store = _store(url, fleet)
    print(format_findings(store, store.findings()))
    return 0


def fleet_rows(url: str, fleet: str | None) -> list[dict[str, Any]]:
    """The fleet as the rows of a campaign's report (``findings --report``): a row per worker from
    its last heartbeat, each finding under the worker that found it (a row of its own where that
    worker's heartbeat has expired), with the report its failure record carries."""
    store = _store(url, fleet)
    rows: dict[str, dict[str, Any]] = {}
    for w in store.workers():
        if w.get("state") == "unreadable":
            continue
        n = int(w.get("examples") or 0)
        rows[w["worker"]] = {
            "target": str(w.get("target")),
            "impl": f"{w.get('impl')} (worker {w['worker']}, {w['state']})",
            "examples": n,
            "per_second": float(w.get("per_second") or 0.0),
            "runs": int(w.get("runs") or 0),
            "found": False,
            "findings": [],
            "triggers": {t: round(float(x) * n) for t, x in (w.get("triggers") or {}).items()},
        }
    for d in store.findings():
        row = rows.setdefault(
            d["found_by"],
            {"target": d["target"], "impl": f"{d['impl']} (worker {d['found_by']}, gone)", "examples": 0,
             "per_second": 0.0, "found": False, "findings": []},
        )  # fmt: skip
        record = d.get("failure_file") or {}
        rerun = f"fleet finding {d['id']}: {rerun_command(store.url, store.fleet, d['id'])}"
        row["found"] = True
        row["findings"].append(
            {
                "kind": d["kind"],
                "margin": d.get("margin"),
                "case": d["case"],
                "report": record.get("report", "(no failure record)"),
                "file": rerun,
            }
        )
        for worker, times in (d.get("seen") or {}).items():  # a worker that found it again found it
            if worker in rows and worker != d["found_by"]:
                rows[worker]["found"] = True
                rows[worker]["findings"].append(
                    {
                        "kind": d["kind"],
                        "margin": d.get("margin"),
                        "case": d["case"],
                        "report": f"a rediscovery ({times:g} time(s)) of fleet finding {d['id']}, first found "
                        f"by {d['found_by']}: its report is under that worker",
                        "file": rerun,
                    }
                )
    return list(rows.values())


def format_status(store: FleetStore, workers: list[dict[str, Any]]) -> str:
    head = f"{'worker':<28} {'state':<11} {'target/impl':<28} {'examples':>8} {'ex/s':>6}  {'heartbeat':>9}  triggers"
    lines = [f"fleet {store.fleet!r} at {store.shown_url}: {len(workers)} workers", head, "-" * len(head)]
    total, rate, running = 0, 0.0, 0
    for w in workers:
        if w.get("state") == "unreadable":
            lines.append(f"{w['worker']:<28} unreadable heartbeat")
            continue
        examples, per_second = int(w.get("examples") or 0), float(w.get("per_second") or 0.0)
        total += examples
        if w["state"] == "running":
            rate += per_second
            running += 1
        trig = ", ".join(f"{t} {100 * float(x):.0f}%" for t, x in sorted((w.get("triggers") or {}).items()))
        what = f"{w.get('target')}/{w.get('impl')}"
        lines.append(
            f"{w['worker']:<28} {w['state']:<11} {what:<28} {examples:>8} {per_second:>6.1f}  "
            f"{w['age']:>7.0f}s ago  {trig}"
        )
    lines.append(f"fleet total: {total} examples, {rate:.1f}/s over {running} running workers")
    seen = {tuple(sorted((w.get("versions") or {}).items())) for w in workers if w.get("versions")}
    if len(seen) > 1:
        lines.append("workers run different versions:")
        lines += [f"  {w['worker']}: {_versions(w)}" for w in workers if w.get("versions")]
    return "\n".join(lines)


def _versions(w: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(w["versions"].items()))


def cmd_status(url: str, fleet: str | None) -> int:
    store = _store(url, fleet)
    print(format_status(store, store.workers()))
    return 0


def fleet_records(
    url: str, fleet: str | None, finding: str | None, *, trust_refs: bool
) -> list[dict[str, Any]]:
    """The failure records of a fleet's findings (only ``finding`` when given), each checked as a
    record from a store of findings (:func:`shardfuzz.engine.failure_load.prepare` with no file: it may
    name only shardfuzz's own code unless ``trust_refs``)."""
    store = _store(url, fleet)
    docs = store.findings()
    if finding is not None:
        docs = [d for d in docs if d["id"] == finding]
        if not docs:
            raise InvalidArgument(
                f"--finding={finding!r}: fleet {store.fleet!r} at {store.shown_url} has no such finding"
            )
    out = []
    for d in docs:
        if d["failure_file"] is None:
            print(f"shardfuzz: fleet finding {d['id']} has no failure record (not replayed)", file=sys.stderr)
            continue
        try:
            record = prepare(copy.deepcopy(d["failure_file"]), None, trust_refs=trust_refs)
            record["fleet_id"] = d["id"]  # named when it is replayed ("replaying a fleet finding" was all)
            out.append(record)
        except InvalidArgument as e:
            raise InvalidArgument(f"fleet finding {d['id']} in {store.shown_url}: {e}") from None
    return out
