"""The README's tables of planted bugs and expected failures, generated from the targets' records.

    python -m shardfuzz.frontends.doc_tables            # print every built-in target's table
    python -m shardfuzz.frontends.doc_tables --write README.md   # rewrite the tables between the markers

In the README each table sits between ``<!-- shardfuzz:table NAME -->`` and
``<!-- /shardfuzz:table -->``; ``tests/test_readme.py`` checks that they match the records.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from shardfuzz.spec.records import Expect
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

MARKER = re.compile(r"(<!-- shardfuzz:table (\w+) -->\n)(.*?)(<!-- /shardfuzz:table -->)", re.S)


def _link(link: str) -> str:
    return f" ({link})" if link else ""


def minimal_case(expect: Expect) -> str:
    """The declared shape of the minimal case: world size, mesh, uneven sizes."""
    worlds = expect.world_size if isinstance(expect.world_size, tuple) else (expect.world_size,)
    ranks = " or ".join(str(w) for w in worlds)
    parts = [f"{ranks} rank{'s' if worlds != (1,) else ''}"]
    if expect.mesh is not None and len(expect.mesh) > 1:
        parts.append(f"mesh {expect.mesh}")
    if expect.uneven:
        parts.append(f"uneven {', '.join(expect.uneven)}")
    if expect.note:
        parts.append(expect.note)
    if len(expect.needs) >= 2:
        parts.append("needs " + " and ".join(f"`{n}`" for n in expect.needs))
    return ", ".join(parts)


def finding(expect: Expect) -> str:
    wrong = expect.outputs if isinstance(expect.outputs, tuple) else ()
    return " or ".join(expect.kinds) + (f" ({', '.join(f'`{o}`' for o in wrong)})" if wrong else "")


def table(target: Any) -> str:
    """The markdown table of one target's planted bugs and expected failures."""
    rows = ["| implementation | models | minimal case | finding | p95 |", "|---|---|---|---|---|"]
    for rec in target.planted.values():
        rows.append(
            f"| `{rec.name}` | {rec.models}{_link(rec.link)} | {minimal_case(rec.expect)} "
            f"| {finding(rec.expect)} | {rec.p95} |"
        )
    for rec in target.expected_failures.values():
        rows.append(
            f"| `{rec.name}` | expected failure: {rec.reason}{_link(rec.link)} | {minimal_case(rec.expect)} "
            f"| {finding(rec.expect)} | {rec.p95} |"
        )
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """``text`` with every marked table regenerated."""
    return MARKER.sub(lambda m: m.group(1) + table(get_target(m.group(2))) + m.group(4), text)


def marked(text: str) -> list[str]:
    return [m.group(2) for m in MARKER.finditer(text)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardfuzz.frontends.doc_tables", description=__doc__)
    p.add_argument("--write", metavar="FILE", help="rewrite the marked tables of FILE in place")
    args = p.parse_args(argv)
    if args.write:
        with open(args.write) as f:
            text = f.read()
        with open(args.write, "w") as f:
            f.write(render(text))
        print(f"{args.write}: {len(marked(text))} tables written")
        return 0
    for name in sorted(BUILTIN_TARGETS):
        print(f"<!-- shardfuzz:table {name} -->\n{table(get_target(name))}<!-- /shardfuzz:table -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
