"""Where the ranks' collective sequences part: the first divergent collective.

Each rank's trace (:mod:`shardfuzz.ranks.trace`) lists the collectives it entered. Per group, the
members must enter the same collectives in the same order: the ``i``-th collective on a group
(``#i``, counted from 1, like torch's sequence numbers) must be the same op, dtype and, where the
op needs it, the same shapes on every member. Point-to-point operations pair up per (sender,
receiver): the ``k``-th send from ``a`` to ``b`` meets the ``k``-th receive on ``b`` from ``a``,
with as many elements of the same dtype. An all-to-all's members must also agree on what goes
between each pair: what rank ``a`` sends to ``b`` is what ``b`` receives from ``a``; and each
all_to_all_single's splits must add up to its tensor (equal splits of a dim 0 the group does not
divide do not).

:func:`first_divergence` finds every place where that breaks and reports the one a rank reached
first: a hang's or a rank error's report names it, and a mismatch's report says whether the
sequences agreed at all.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from shardfuzz.ranks.trace import POINT_TO_POINT, Collective

#: ops whose members must contribute the same shapes (an all-to-all's splits may differ, and a
#: gather's or scatter's lists exist on the root only)
SAME_SHAPES = frozenset(
    """all_reduce all_reduce_coalesced broadcast reduce all_gather all_gather_into_tensor
    reduce_scatter reduce_scatter_tensor all_gather_into_tensor_coalesced
    reduce_scatter_tensor_coalesced""".split()
)
Traces = Mapping[int, Sequence[Collective]]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where the sequences part: ``where`` is the rank-local position the first rank reached it at
    (what orders two divergences), ``text`` the sentence for the report, ``op`` the collective the
    ``entered`` ranks entered there, ``others`` the ranks that entered another one or none."""

    where: int
    text: str
    op: str
    entered: tuple[int, ...]
    others: tuple[int, ...]
    #: False where every rank entered the same collective but an all-to-all's splits do not pair
    #: up or do not add up to its tensor, and for point-to-point operations
    sequences_differ: bool = True
    #: a send without its receive (``send``) or a receive without its send (``recv``), else ""
    unmatched: str = ""


def _agree_key(c: Collective) -> tuple:
    shapes = c.shapes if c.op in SAME_SHAPES else ()
    return (c.op, c.dtype, shapes, c.peer if c.op in ("broadcast", "reduce", "gather", "scatter") else None)


def _ranks(rs: Sequence[int]) -> str:
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _on_groups(traces: Traces) -> dict[tuple[int, ...], dict[int, list[Collective]]]:
    """Each group's collectives (point-to-point ones aside), per rank in the order entered: the
    ``i``-th of a rank's list is its ``#i + 1`` on that group."""
    on_group: dict[tuple[int, ...], dict[int, list[Collective]]] = defaultdict(lambda: defaultdict(list))
    for r, events in traces.items():
        for c in events:
            if c.op not in POINT_TO_POINT and c.group:
                on_group[c.group][r].append(c)
    return on_group


def _group_divergences(traces: Traces) -> list[Divergence]:
    on_group = _on_groups(traces)
    found = []
    for group, per_rank in on_group.items():
        members = [r for r in group if r in traces]  # ranks whose trace we have
        longest = max(len(per_rank[r]) for r in members)
        for i in range(longest):
            at = {r: per_rank[r][i] for r in members if i < len(per_rank[r])}
            keys = {_agree_key(c) for c in at.values()}
            if len(keys) == 1 and len(at) == len(members):
                unpaired = _unpaired_splits(group, at)
                why = _uncovered_splits(at) or (unpaired and f"their splits do not pair up: {unpaired}")
                if not why:
                    continue
                first = next(iter(at.values()))
                text = f"{_ranks(members)} entered #{i + 1} {first.op} on group {list(group)}, but {why}"
                where = min(c.seq for c in at.values())
                found.append(Divergence(int(where), text, first.op, tuple(sorted(members)), (), False))
                break
            by_sig: dict[tuple, list[int]] = defaultdict(list)
            for r, c in at.items():
                by_sig[_agree_key(c)].append(r)
            order = sorted(by_sig.values(), key=lambda rs: (-len(rs), rs))
            first = at[order[0][0]]
            parts = [f"{_ranks(order[0])} entered #{i + 1} {first.signature()} on group {list(group)}"]
            parts += [f"{_ranks(rs)}'s #{i + 1} is {at[rs[0]].signature()}" for rs in order[1:]]
            missing = [r for r in members if r not in at]
            for r in missing:
                last = per_rank[r][-1].signature() if per_rank[r] else None
                parts.append(
                    f"rank {r} never reached a #{i + 1}"
                    + (
                        f" (its last on this group: #{len(per_rank[r])} {last})"
                        if last
                        else " (none on this group)"
                    )
                )
            # a rank that stopped at the differing one, where the others went on (all stopping
            # there, as when the mismatch killed a rank, is no rank lagging: a new user read
            # "never reached a #8" beside "collectives entered: rank 0: 7, rank 1: 7")
            went_on = any(len(per_rank[r]) > i + 1 for r in order[0])
            for rs in order[1:]:
                for r in rs:
                    if went_on and len(per_rank[r]) == i + 1:
                        parts.append(f"rank {r} never reached a #{i + 2}")
            where = min([c.seq for c in at.values()] + [len(traces[r]) for r in missing])
            others = tuple(sorted(r for r in members if r not in order[0]))
            found.append(Divergence(int(where), "; ".join(parts), first.op, tuple(order[0]), others))
            break
    return found


def _uncovered_splits(at: Mapping[int, Collective]) -> str | None:
    """Where an all_to_all_single's splits do not add up to its tensor (None where they do): split
    sizes that miss rows, or none given for a dim 0 the group does not divide (torch then splits it
    equally, and gloo fails or hangs on sizes its peers do not expect)."""
    for r, c in sorted(at.items()):
        if c.op != "all_to_all_single" or c.splits is None:
            continue
        for side, counts, shapes in (("input", c.splits[0], c.shapes), ("output", c.splits[1], c.out_shapes)):
            if len(shapes) != 1 or sum(counts) == math.prod(shapes[0]):
                continue
            return (
                f"rank {r}'s {side} {c.dtype}[{', '.join(map(str, shapes[0]))}] holds "
                f"{math.prod(shapes[0])} element(s), but its splits cover {sum(counts)} ({list(counts)}): split "
                f"sizes that do not add up to dim 0, or none given for a dim 0 the group does not divide"
            )
    return None


def _unpaired_splits(group: tuple[int, ...], at: Mapping[int, Collective]) -> str | None:
    """Where an all-to-all's members disagree on what goes between two of them (None where every
    pair agrees): what rank ``a`` sends to ``b`` must be what ``b`` receives from ``a``."""
    splits = {r: c.splits for r, c in at.items() if c.splits is not None and len(c.splits[0]) == len(group)}
    if len(splits) != len(at):
        return None  # not an all-to-all, or one whose splits were not traced
    index = {r: k for k, r in enumerate(group)}
    for a, (sends, _) in sorted(splits.items()):
        for b, (_, receives) in sorted(splits.items()):
            sent, expected = sends[index[b]], receives[index[a]]
            if sent != expected:
                to, back = ("itself", "") if a == b else (f"rank {b}", f" from rank {a}")
                return (
                    f"rank {a} sends {sent} element(s) to {to}, which expects {expected}{back} (in "
                    f"elements, rank {a} sends {list(sends)}, rank {b} receives {list(receives)}"
                    f"{_in_rows(at[a], at[b], sends, receives)})"
                )
    return None


def _in_rows(sender: Collective, receiver: Collective, sends: Sequence[int], receives: Sequence[int]) -> str:
    """The same splits in rows of dim 0, where both tensors have rows of one size above 1 (the
    split sizes an all_to_all_single call is given; a new user's d_model of 4 made every element
    count 4 times theirs)."""
    rows = {
        math.prod(shape[1:]) for shape in (*sender.shapes[:1], *receiver.out_shapes[:1]) if len(shape) > 1
    }
    if len(rows) != 1 or (row := rows.pop()) <= 1 or any(n % row for n in (*sends, *receives)):
        return ""
    return f"; in rows of {row} elements, [{', '.join(str(n // row) for n in sends)}] and [{', '.join(str(n // row) for n in receives)}]"


def _p2p_divergences(traces: Traces) -> list[Divergence]:
    """Sends and receives paired in order per (sender, receiver, tag): a send matches only a
    receive of its own tag (a new user's pipeline sent a gradient with the wrong tag and hung, and
    the report said every rank entered the same sequence)."""
    sends: dict[tuple[int, int, int], list[Collective]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[Collective]] = defaultdict(list)
    for r, events in traces.items():
        for c in events:
            tag = c.tag if c.tag is not None else 0  # a trace of an older version: none recorded
            if c.op == "send" and c.peer is not None:
                sends[(r, c.peer, tag)].append(c)
            elif c.op == "recv" and c.peer is not None:
                recvs[(c.peer, r, tag)].append(c)
    tagged = any(key[2] for key in (*sends, *recvs))  # said only where some tag is not 0
    found = []
    for a, b, tag in sorted(set(sends) | set(recvs)):
        if a not in traces or b not in traces:
            continue
        s, v = sends[(a, b, tag)], recvs[(a, b, tag)]
        with_tag = f" with tag {tag}" if tagged else ""
        for k in range(max(len(s), len(v))):
            ck, rk = (s[k] if k < len(s) else None), (v[k] if k < len(v) else None)
            if ck is not None and rk is not None:
                if (ck.dtype, math.prod(ck.shapes[0]) if ck.shapes else 0) == (
                    rk.dtype,
                    math.prod(rk.out_shapes[0]) if rk.out_shapes else 0,
                ):
                    continue
                text = (
                    f"rank {a}'s send #{k + 1} to rank {b} is {ck.signature()}, but rank {b}'s receive "
                    f"#{k + 1} from rank {a} is {rk.signature()}: the sizes differ"
                )
                found.append(Divergence(min(ck.seq, rk.seq), text, "send", (a,), (b,), False))
            elif ck is not None:
                text = (
                    f"rank {a}'s send #{k + 1} to rank {b}{with_tag} ({ck.signature()}) has no matching "
                    f"receive: rank {b} posted {len(v)} receive(s) from rank {a}{with_tag}"
                    + _other_tags(recvs, a, b, tag, "receive")
                )
                # a blocking send waits for its receive (an isend does not): only those make a cycle
                found.append(
                    Divergence(
                        ck.seq, text, "send", (a,), (b,), False, "send" if ck.call == "send" else "isend"
                    )
                )
            else:
                assert rk is not None
                text = (
                    f"rank {b}'s receive #{k + 1} from rank {a}{with_tag} ({rk.signature()}) has no matching "
                    f"send: rank {a} posted {len(s)} send(s) to rank {b}{with_tag}"
                    + _other_tags(sends, a, b, tag, "send")
                )
                found.append(Divergence(rk.seq, text, "recv", (b,), (a,), False, "recv"))
            break
    return found


def _other_tags(
    ops: Mapping[tuple[int, int, int], list[Collective]], a: int, b: int, tag: int, what: str
) -> str:
    """``"; and 1 send with tag 7"``: what rank ``a`` to rank ``b`` posted under other tags."""
    other = {t: len(v) for (x, y, t), v in ops.items() if (x, y) == (a, b) and t != tag and v}
    if not other:
        return ""
    return "; and " + ", ".join(f"{n} {what}(s) with tag {t}" for t, n in sorted(other.items()))


#: how many other unmatched point-to-point operations a report names beside the first
UNMATCHED_NAMED = 3


def first_divergence(traces: Traces) -> Divergence | None:
    """The divergence the ranks reached first, or None where every group's sequences agree. A
    point-to-point one names the other unmatched operations too (a deadlock has one per rank, and
    the first alone can name the victim of a wrong send, not the send), and a cycle of sends that
    wait for their receives as such."""
    p2p = _p2p_divergences(traces)
    found = _group_divergences(traces) + p2p
    if not found:
        return None
    first = min(found, key=lambda d: (d.where, d.text))
    if not first.unmatched:
        return first
    others = sorted((d for d in p2p if d.unmatched and d is not first), key=lambda d: (d.where, d.text))
    text = first.text
    if others:
        named = "; ".join(d.text for d in others[:UNMATCHED_NAMED])
        more = len(others) - UNMATCHED_NAMED
        text += f"; also unmatched: {named}" + (f"; and {more} more" if more > 0 else "")
    waits = {d.entered[0]: d.others[0] for d in (first, *others) if d.unmatched == "send"}
    cycle = _cycle(waits)
    # every unmatched operation a blocking send of the cycle, between 2 ranks or more
    if len(cycle) >= 2 and len(waits) == len(others) + 1 and set(cycle) == set(waits):
        ring = " -> ".join(map(str, (*cycle, cycle[0])))
        text += f" (a cycle of blocking sends: ranks {ring} each wait to send to the next, which never posted a receive)"
    return dataclasses.replace(first, text=text)


def _cycle(waits: Mapping[int, int]) -> tuple[int, ...]:
    """A cycle of ranks each waiting on the next (``waits``: rank -> the rank it waits for), or ()."""
    for start in sorted(waits):
        path, r = [start], waits[start]
        while r in waits and r not in path:
            path.append(r)
            r = waits[r]
        if r == start:
            return tuple(path)
    return ()


def describe_sequences(traces: Traces) -> str:
    """One line for a report: the sequences agree (with counts), or where they first part."""
    if not traces or not any(traces.values()):
        # a DDP hang said "none entered" flatly: its reducer's all-reduces come from C++
        return (
            "collectives: none entered on any rank from Python (those C++ issues on its own, such as "
            "DistributedDataParallel's reducer in backward, are not traced: the rank stacks show them)"
        )
    d = first_divergence(traces)
    counts = ", ".join(f"rank {r}: {len(t)}" for r, t in sorted(traces.items()))
    if d is None:
        if len({len(t) for t in traces.values()}) > 1:  # a pipeline's sends and receives, most often
            # "every rank entered the same sequence" beside counts that differ read as wrong
            return (
                "collectives: no divergence: each group's collectives agree, and every send has its "
                f"receive (entered: {counts})"
            )
        return f"collectives: every rank entered the same sequence (collectives entered: {counts})"
    differ = "the ranks' sequences differ; " if d.sequences_differ else ""
    return f"first divergent collective: {d.text}\n  ({differ}collectives entered: {counts})"


#: how many collectives with a non-contiguous tensor a report names (the rest are counted)
LAYOUTS_NAMED = 3


def _layout(c: Collective) -> str:
    shapes = (*c.shapes, *c.out_shapes)
    parts = [
        f"{c.dtype}[{', '.join(map(str, shape))}] strides {tuple(st)}"
        for shape, st in zip(shapes, c.strides)
        if st is not None
    ]
    return "; ".join(parts)


def describe_layouts(traces: Traces) -> str | None:
    """Lines for a report where a rank handed a non-contiguous tensor to a collective (None where
    none did): which rank, which collective (``#i`` on its group, as :func:`first_divergence`
    counts), the strides, and whether the other members' layouts differed. On gloo, torch's c10d
    collectives use such a tensor's memory as if it were contiguous (measured on torch 2.13 for
    all_reduce, examples/upstream/gloo_all_reduce_non_contiguous.py: wrong sums where the ranks'
    layouts differ or a tensor is not dense); NCCL refuses it."""
    by_position: dict[tuple[tuple[int, ...], int], dict[int, Collective]] = defaultdict(dict)
    for group, per_rank in _on_groups(traces).items():
        for r, events in per_rank.items():
            for i, c in enumerate(events, 1):
                by_position[(group, i)][r] = c
    lines: list[str] = []
    c10d = False
    strided = [(key, ranks) for key, ranks in by_position.items() if any(c.strides for c in ranks.values())]
    for (group, i), ranks in sorted(strided, key=lambda kv: min(c.seq for c in kv[1].values())):
        bad = sorted(r for r, c in ranks.items() if c.strides)
        c10d = c10d or any(ranks[r].api == "c10d" for r in bad)
        if len(lines) >= LAYOUTS_NAMED:
            continue
        first = ranks[bad[0]]
        where = f"{first.op} #{i} on group {list(group)}"
        what = ", ".join(f"rank {r}: {_layout(ranks[r])}" for r in bad)
        layouts = {ranks[r].strides for r in ranks}
        others = sorted(set(ranks) - set(bad))
        rest = (
            f"; {_ranks(others)} passed contiguous tensors: the layouts differ" if others else
            ("; the same strides on every rank" if len(layouts) == 1 else "; the strides differ between ranks")
        )  # fmt: skip
        lines.append(f"  {where}: non-contiguous on {what}{rest}")
    if not strided:
        return None
    more = len(strided) - len(lines)
    if more > 0:
        lines.append(f"  ... and {more} more collective(s) with a non-contiguous tensor")
    head = "layouts: a rank handed a non-contiguous tensor to a collective"
    if c10d:
        head += (
            " (on gloo, torch's c10d collectives read and write its memory as if it were contiguous, so"
            " the values can be silently wrong: pytorch/pytorch#192920; NCCL refuses it; pass"
            " .contiguous() and copy the result back)"
        )
    return "\n".join([head, *lines])


def format_trace(traces: Traces, limit: int = 200) -> str:
    """Each rank's trace, one collective per line (``shardfuzz case --trace``), numbered from 1 as
    reports number them (``entered #1 all_reduce``: a new user matched 0-based lines to it); a
    report counts per group, so on a 2-D mesh its #N is the Nth of that group's lines."""
    lines = []
    for r, events in sorted(traces.items()):
        lines.append(f"--- rank {r}: {len(events)} collective(s) ---")
        for c in events[:limit]:
            extra = f" peer {c.peer}" if c.peer is not None else ""
            # elements to and from each group rank: torch's input_split_sizes and output_split_sizes
            # times a row's elements ("out" read as torch's output: it was what the rank sent)
            extra += f" sends {list(c.splits[0])} receives {list(c.splits[1])}" if c.splits else ""
            extra += f" non-contiguous: {_layout(c)}" if c.strides else ""
            lines.append(
                f"  #{c.seq + 1:<3d} {c.signature()} on group {list(c.group)}{extra}  [{c.api}.{c.call}]"
            )
        if len(events) > limit:
            lines.append(f"  ... {len(events) - limit} more")
    return "\n".join(lines)
