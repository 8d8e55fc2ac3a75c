"""A campaign's report as one self-contained HTML page (``shardfuzz fuzz ... --report DIR``).

The page needs no network to open: its style is inline, its charts are inline SVG drawn here, and
each mismatch's plot (``shardfuzz[plot]``, matplotlib) is an inline PNG. It is written from the
campaign's summary rows (``campaign.Outcome.row(pictures=True)``), so a fleet's parent, which only
has its workers' rows, writes it the same way. Everything a row carries that came from a run
(reports, cases, names) is escaped: a report quotes the implementation's own exception text.
"""

from __future__ import annotations

import datetime
import html
import os
import re
import uuid
from typing import Any

from shardfuzz.report.closest_pass import closest_pass_words, margin_text

#: the page's file name inside the report folder
PAGE = "index.html"
#: what an inline plot must be: base64 and nothing else (it goes into an attribute)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
.found { color: #b00020; font-weight: bold; } .clean { color: #1b7f3b; font-weight: bold; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }
.bar { display: inline-block; height: 10px; background: #3a7bd5; }
.track { display: inline-block; width: 120px; height: 10px; background: #e4e4e4; vertical-align: middle; }
.note { color: #666; }
"""


def write_report(directory: str, rows: list[dict[str, Any]], command: str = "") -> str:
    """Write the page of a campaign's ``rows`` into ``directory`` (made if missing); its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, PAGE)
    tmp = os.path.join(directory, f".{PAGE}.{uuid.uuid4().hex[:16]}.tmp")
    # 0o666, the umask applied: a page to share is readable as any new file is (mkstemp's is 0600)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w", encoding="utf-8") as f:
        f.write(render(rows, command))
    os.replace(tmp, path)  # whole or not at all: a page being read is never half written
    return path


def render(rows: list[dict[str, Any]], command: str = "") -> str:
    """The page: an overview table, then a section per target and implementation."""
    when = datetime.datetime.now().isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>shardfuzz campaign report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>shardfuzz campaign report</h1>",
        f'<p class="note">{_e(command)} &middot; written {_e(when)}</p>',
        _overview(rows),
    ]
    parts += [_section(i, r) for i, r in enumerate(rows)]
    parts.append("</body></html>")
    return "\n".join(parts)


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _overview(rows: list[dict[str, Any]]) -> str:
    head = "<tr><th>target</th><th>implementation</th><th>examples</th><th>ex/s</th><th>result</th></tr>"
    body = []
    for i, r in enumerate(rows):
        found = r.get("found")
        result = f"FOUND {len(r.get('findings', []))} distinct" if found else "nothing found"
        body.append(
            f'<tr><td><a href="#row{i}">{_e(r["target"])}</a></td><td>{_e(r["impl"])}</td>'
            f"<td>{r['examples']}</td><td>{r['per_second']:.1f}</td>"
            f'<td class="{"found" if found else "clean"}">{_e(result)}</td></tr>'
        )
    return f"<table>{head}{''.join(body)}</table>"


def _section(i: int, r: dict[str, Any]) -> str:
    parts = [f'<h2 id="row{i}">{_e(r["target"])} / {_e(r["impl"])}</h2>']
    took = f" in {r['seconds']:.1f} s" if isinstance(r.get("seconds"), (int, float)) else ""
    parts.append(
        f"<p>{r['examples']} examples{took} ({r['per_second']:.1f}/s), {r.get('runs', 1)} run(s)</p>"
    )
    if r.get("interrupted"):  # a page of an interrupted campaign read as a finished one
        parts.append('<p class="note">interrupted (Ctrl-C): the examples above are those run before it</p>')
    if r.get("cut_short"):
        parts.append('<p class="note">shrinking cut short: a finding may not be minimal</p>')
    if not r.get("found"):  # as the terminal's summary: a failing run has its findings' margins
        parts.append(_closest(r))
    parts += [_finding(f) for f in r.get("findings", [])]
    parts.append(_set_aside(r))
    parts.append("<h3>Trigger conditions reached</h3>" + _coverage(r))
    parts.append("<h3>Throughput</h3>" + _throughput(r.get("timeline", [])))
    return "\n".join(parts)


def _set_aside(r: dict[str, Any]) -> str:
    """The cases excluded as known failures and rejected as unsupported, by reason (as the summary
    table gives them): not examples, and never passed silently."""
    out = []
    for key, words in (
        ("excluded", "excluded as known failures"),
        ("unsupported", "rejected as unsupported"),
    ):
        reasons = r.get(f"{key}_reasons") or {}
        total = r.get(key) or 0
        if not total and not reasons:
            continue
        items = "".join(f"<li><code>{_e(k)}</code> x{v}</li>" for k, v in reasons.items())
        more = total - sum(reasons.values())
        items += f"<li>{more} more, for reasons not shown</li>" if more > 0 else ""
        out.append(f"<p>{total} cases {words} (not examples):</p><ul>{items}</ul>")
    return "\n".join(out)


def _closest(r: dict[str, Any]) -> str:
    if "closest_pass" not in r:  # a fleet worker's heartbeat does not carry it
        return '<p class="note">closest pass: not recorded</p>'
    if not r.get("closest_pass_case"):
        return '<p class="note">no example passed</p>'
    words = closest_pass_words(
        r.get("closest_pass", 0.0),
        bool(r.get("closest_pass_upper_bound")),
        r.get("closest_pass_measured"),
        r.get("closest_pass_rerun_failed"),
        r.get("measured_pass_ratio", 0.0),
        r.get("closest_pass_rechecked"),
    )
    return f"<p>closest pass: error/tolerance {_e(words)} at <code>{_e(r['closest_pass_case'])}</code></p>"


def _finding(f: dict[str, Any]) -> str:
    why = f.get("margin_why") if isinstance(f.get("margin_why"), str) else None
    margin = f", margin {margin_text(f['margin'], why)}" if isinstance(f.get("margin"), (int, float)) else ""
    parts = [
        f'<h3 class="found">{_e(f["kind"])}{_e(margin)}</h3>',
        f"<p>case: <code>{_e(f['case'])}</code></p>",
    ]
    if f.get("file"):
        parts.append(f"<p>failure file: <code>{_e(f['file'])}</code></p>")
    if isinstance(f.get("plot"), str) and _BASE64.fullmatch(f["plot"]):
        parts.append(
            f'<img alt="mismatch plot" src="data:image/png;base64,{f["plot"]}" style="max-width:100%">'
        )
    elif f.get("plot_missing"):
        parts.append(f'<p class="note">{_e(f["plot_missing"])}</p>')
    parts.append(f'<pre class="report">{_e(f.get("report", ""))}</pre>')
    return "\n".join(parts)


def _coverage(r: dict[str, Any]) -> str:
    n, rows = r.get("examples", 0), []
    for name, hits in r.get("triggers", {}).items():
        share = hits / n if n else 0.0
        rows.append(
            f'<tr><td>{_e(name)}</td><td><span class="track"><span class="bar" '
            f'style="width:{100 * share:.0f}%"></span></span></td><td>{100 * share:.0f}%</td></tr>'
        )
    return f"<table>{''.join(rows)}</table>" if rows else '<p class="note">none recorded</p>'


def _throughput(timeline: list[list[float]]) -> str:
    """Examples run over time, as an inline SVG line (the rate is its slope)."""
    if len(timeline) < 2:
        return '<p class="note">too short to draw</p>'
    w, h, pad = 600, 180, 40
    t_max = max(p[0] for p in timeline) or 1.0
    n_max = max(p[1] for p in timeline) or 1
    pts = " ".join(
        f"{pad + (w - 2 * pad) * t / t_max:.1f},{h - pad - (h - 2 * pad) * n / n_max:.1f}"
        for t, n, *_ in timeline
    )
    return (
        f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="examples over time">'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#888"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#888"/>'
        f'<polyline fill="none" stroke="#3a7bd5" stroke-width="2" points="{pts}"/>'
        f'<text x="{pad}" y="{h - 10}" font-size="12">0 s</text>'
        f'<text x="{w - pad - 40}" y="{h - 10}" font-size="12">{t_max:.0f} s</text>'
        f'<text x="4" y="{pad - 8}" font-size="12">{n_max} examples</text></svg>'
    )
