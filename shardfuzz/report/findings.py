"""Report text, and one raise site per finding kind.

Hypothesis tells distinct bugs apart by exception type *and* raise site, so each kind is raised
from its own method below; a shared raise site lets a shrink drift from one bug into another.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from shardfuzz.case import Case
from shardfuzz.errors import (
    CommunicationExceeded,
    IgnoredCollective,
    ImplementationReturnError,
    LayoutMismatch,
    Mismatch,
    RankError,
    RankHang,
)
from shardfuzz.protocol import Hung, RankDied, RankFailed
from shardfuzz.report import mismatch_map
from shardfuzz.report.divergence import Traces, describe_layouts, describe_sequences
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.report.tracebacks import rank_stack
from shardfuzz.signature import cause_of, raised_in_torch
from shardfuzz.spec.tolerance import UNIT_ROUNDOFF, Tolerance
from shardfuzz.verdict.comm import CommBudget, format_comm
from shardfuzz.verdict.compare import WORST_SHOWN, OutputDiff, RankDiff
from shardfuzz.verdict.judge import DTYPE_ONLY, NEVER_COMPUTED, RETURNED_NONE, Verdict

#: the note of a finding on 1 rank: the strategy lets the shrinker run a failure found on 2+ ranks
#: on 1 rank with the same global sizes (``shardfuzz.strategies``), so this is its minimal world
#: a 1-rank case has no peer: what fails there is a rank's own work, which includes what it hands to
#: a collective (a cast before an all_gather fails on 1 rank too; "not a distribution bug" sent a
#: user away from the collective path) and what it does with what comes back (a scan that adds
#: its own total to its carry fails on 1 rank: "not in how the ranks combine the work" was wrong)
ONE_RANK_NOTE = (
    "fails on 1 rank, with no peer to exchange with: the bug needs no other rank's data; it is in "
    "code every rank runs: which part of the inputs it takes (its shard's offsets and order), its "
    "math (or a kernel it calls), its random draws (an RNG state not restored for a recompute, a "
    "draw the oracle does not make) or its code around the collectives (what it hands to one, what "
    "it does with the result, an async one's result read before its wait())"
)

#: a rank error raised inside torch itself: the one-rank note's "its math" may be torch's (a new
#: user's parallelize_module plan failed in DTensor's sharding propagation on 1 rank, and the note
#: sent them to their own code)
TORCH_RAISED = (
    "raised inside torch ({where}): where the implementation hands the case to torch's own sharded "
    "code (DTensor, parallelize_module, FSDP2), this can be torch refusing the case or torch's bug; "
    "docs/how-to/fuzz-pytorch.md lists the known ones and how to set one aside (--exclude)"
)

#: the summary's word for it, beside each finding (the whole note is in the report: a new user
#: found 450 characters repeated under every finding hard to scan)
ONE_RANK_SHORT = "fails on 1 rank, with no peer to exchange with: the report says where to look"


#: the significant bits of each narrower dtype (its mantissa and the implicit one)
NARROW_BITS = {"bfloat16": 8, "float16": 11}


def narrower_note(diffs: Sequence[Any], case: Case, judged: str) -> str | None:
    """Where every wrong element of a float32 or float64 case is exactly a value of a narrower
    dtype (two or more, not all integers, off the ``ties`` and ``edge`` grids): code that computes
    or sends them in that dtype, by design or not (a new user's FSDP2 reduce_dtype=bfloat16 was
    sent by the 1-rank note to the math; a float32 value is a bfloat16 one by chance 1 in 65,536).
    Only elements whose low bits are free count: where the noise says the value is a cancellation
    of far larger terms (within ``2**(bits + 2)`` times the noise there), it is a small multiple of
    those terms' spacing, with few significant bits, and as often a bfloat16 value as not (a new
    user's float32 LayerNorm gradients, 2 wrong elements of a summing bug, were said to be bfloat16
    values: 461 of 1,000 such gradients are)."""
    if judged not in ("float32", "float64") or case.profile in ("ties", "edge"):
        return None
    for narrow, bits in NARROW_BITS.items():
        got = _wrong_values(diffs, 2.0 ** (bits + 2))
        if got.numel() < 2 or bool((got == got.round()).all()):
            continue
        if bool((got.to(getattr(torch, narrow)).double() == got).all()):
            return (
                f"every wrong element ({got.numel()}) is exactly a {narrow} value: code that computes "
                f"or sends these values in {narrow}. If it does so by design (a compressed all-reduce, "
                f"FSDP's reduce_dtype), judge it at that precision: --precision {narrow} "
                "(docs/explanation/noise-model.md); if not, that cast is the bug"
            )
    return None


def _wrong_values(diffs: Sequence[Any], few_bits: float) -> torch.Tensor:
    """The finite wrong values of ``diffs``' floating pieces (float64), but those within
    ``few_bits`` times the noise there (a cancellation's few significant bits)."""
    values = []
    for d in diffs:
        for r in d.ranks:
            local, wrong = getattr(r, "local", None), getattr(r, "wrong", None)
            if not isinstance(local, torch.Tensor) or not isinstance(wrong, torch.Tensor):
                continue
            if not local.is_floating_point() or local.numel() != wrong.numel():
                continue
            mask = wrong.reshape(-1).to(local.device)
            noise = getattr(r, "noise", None)
            if isinstance(noise, torch.Tensor) and noise.numel() == local.numel():
                free = local.detach().double().abs().reshape(-1) > few_bits * noise.double().reshape(-1).to(
                    local.device
                )
                mask = mask & free
            values.append(local.detach().reshape(-1)[mask].cpu())
    got = torch.cat(values).double() if values else torch.empty(0)
    return got[torch.isfinite(got)]


def near_tie_note(diffs: Sequence[Any], dtype: str) -> str | None:
    """Where an exactly compared output is wrong at elements the oracle itself decides otherwise
    under the noise model's samples: a choice within rounding of a tie (a new user's k-means that
    chose clusters from its own bfloat16 distances was reported at inf with no word of it)."""
    found = []
    for d in diffs:
        flipped = getattr(d, "flipped", None)
        if flipped is None or not bool(flipped.any()):
            continue
        wrong = there = 0
        capped = False
        for r in d.ranks:
            mask = getattr(r, "wrong", None)
            if mask is None:
                continue
            at = mask.nonzero().tolist()
            capped |= len(at) > NEAR_TIE_LOOKS
            for idx in at[:NEAR_TIE_LOOKS]:
                wrong += 1
                there += bool(flipped[r.to_global(tuple(idx))])
        if there:
            looked = " looked at" if capped else ""
            found.append(f"{there} of the {wrong} wrong elements{looked} of {d.name!r}")
    if not found:
        return None
    return (
        f"decisions within rounding of a tie: at {', and '.join(found)}, the oracle itself decides "
        f"otherwise when its float64 results are moved by a {dtype} rounding (the noise model's "
        "samples). A decision made there from values computed otherwise than the oracle's (distances, "
        "scores or logits of the implementation's own, in the case dtype) goes either way, and an "
        "integer output is compared exactly. Where the contract fixes the choice (an exact tie with a "
        "stated rule), this is a bug; else make the decision the same on both sides: one function the "
        "oracle and every rank call on the same values, marked with shardfuzz.decision() "
        "(docs/reference/target-spec.md, discrete decisions)"
    )


def dtype_decision_note(diffs: Sequence[Any], dtype: str) -> str | None:
    """Where an exactly compared output that is wrong is one the oracle itself gives otherwise when
    run in the case dtype: its float64 run decides what the ranks, in the case dtype, cannot (a new
    user's loss scaler skipped a step on a float16 overflow that float64 never has, and the report
    sent them to the code every rank runs)."""
    names = [d.name for d in diffs if getattr(d, "dtype_decided", False)]
    if not names:
        return None
    return (
        f"the oracle run in {dtype} gives {', '.join(repr(n) for n in names)} otherwise than its "
        f"float64 run: a decision that depends on the dtype (an overflow check, a threshold on values "
        f"{dtype} rounds), which the ranks make in {dtype}. Where that is the code's contract, the "
        "oracle must decide it as the ranks do: compute the decision from the case-dtype values in "
        "one function both call, marked with shardfuzz.decision() "
        "(docs/reference/target-spec.md, discrete decisions)"
    )


#: the wrong elements of one rank a near-tie note looks at
NEAR_TIE_LOOKS = 10_000


#: what a layout finding's report says of the values it did not compare
#: under a shape that is not its layout's: a new user's target declared an output Replicate() that
#: its (correct) implementation returned sharded, and read the finding as a bug in the code
LAYOUT_DECLARED = (
    "a shape that is not the layout's: either the implementation returns that output laid out "
    "otherwise, or the target declares its layout wrong (Target(outputs=...)); where the target's "
    "reference implementation fails the same way, the declaration is what to fix"
)


LAYOUT_FIRST = (
    "values not compared: every output's local shapes and dtypes must match its layout first, so "
    "an output listed nowhere here may be wrong too"
)


#: the note of a mismatch whose case draws its values on a grid: a tie broken otherwise than the
#: oracle breaks it is two right answers (a new user's torch.topk router picked experts [6, 5] of
#: five equal logits where the oracle's stated rule picked [2, 4], and the report named no tie)
TIES_NOTE = (
    # the stated rule first: a new user whose oracle stated one (lowest id) read the note, which
    # led with "two right answers", as a hint that the finding was a false alarm
    "this case's values lie on a grid (profile=ties), so exact ties are common. Where the oracle "
    "states a tie rule (torch.argmax's: the lowest index), a tie broken otherwise is a bug. Where the "
    "contract leaves a tie open (a topk, argmax, sort or max whose order it does not fix), a tie "
    "broken otherwise than the oracle is two right answers: share the decision with the oracle or "
    "state one tie rule (docs/reference/target-spec.md, discrete decisions; torch.topk does not "
    "promise the lower index)"
)


#: a mismatch this close to its bound names the oracle's ops that got one rounding of their result
UNMODELLED_NOTE_BELOW = 100.0


def unmodelled_note(ops: Sequence[str]) -> str:
    """The note of a near mismatch whose oracle calls ops the noise model has no rule or
    decomposition for (a new user's correct EmbeddingBag was reported at 1.8x against
    F.embedding_bag, then without a rule, and nothing pointed at the op)."""
    names = ", ".join(f"aten.{op}" for op in ops)
    return (
        f"the noise model has no rule for {names} in the oracle: each got one rounding of its result, "
        "which underrates a cancellation inside it. Where the difference could be rounding, write "
        "that op's math out with plain ops in the oracle and rerun the case "
        "(docs/explanation/noise-model.md, where it can be wrong)"
    )


#: the note of a rank error that is the implementation's return value, not its work
CONTRACT_NOTE = (
    "the implementation's return value breaks its contract: every rank returns a dict of the "
    "target's outputs, {name: tensor, DTensor or None} (docs/tutorial/write-a-target.md)"
)


#: after a NotImplementedError: torch's way of saying "not supported" (ColwiseParallel on a Conv2d),
#: which a new user's report read as a bug in "its math" on 1 rank
REFUSAL_NOTE = (
    "if this is the code under test refusing such a case (torch's 'not supported', or a device or "
    "backend it needs), not a wrong result, catch it in the implementation and raise "
    "shardfuzz.Unsupported('why', reason='key'): the case is then rejected and counted "
    "(docs/how-to/fuzz-pytorch.md)"
)

#: how torch words a refusal, besides NotImplementedError: SyncBatchNorm's "expected input tensor
#: to be on GPU" (a ValueError), "only supports", "requires CUDA 11+ and NCCL 2.10+" (bf16 hooks)
REFUSAL_WORDS = re.compile(
    r"not (yet )?(supported|implemented)|only supports?\b|currently only|"
    r"expected .*\bto be on (GPU|CUDA)|requir(e|es|ed) (CUDA|NCCL|a GPU|GPU)",
    re.IGNORECASE,
)


def is_refusal(exc_type: str, traceback: str) -> bool:
    """Whether a rank's exception reads as the code under test refusing the case (its last line)."""
    lines = traceback.rstrip().splitlines()
    return exc_type == NotImplementedError.__name__ or bool(lines and REFUSAL_WORDS.search(lines[-1]))


@dataclasses.dataclass(frozen=True)
class Reporter:
    """Writes the reports of one (target, implementation, backend)."""

    target: str
    impl_name: str
    impl_ref: str
    backend: str
    rerun_prefix: str  # ``shardfuzz case TARGET --impl IMPL [--backend B]``
    tolerance: Tolerance
    self_oracle: bool = False  # the oracle is the implementation itself at world size 1
    #: option names whose values tell one bug from another (``Target(distinct=...)``): part of
    #: every finding's site, so a campaign keeps one finding per value (one per operator)
    distinct: tuple[str, ...] = ()
    #: the trigger conditions a case meets, named in its report (``shardfuzz.spec.triggers.conditions_met``)
    conditions: Callable[[Case], Sequence[str]] | None = None

    def _site(self, case: Case, site: tuple) -> tuple:
        if not self.distinct:
            return site
        return (*site, ("options", tuple((k, case.options.get(k)) for k in self.distinct)))

    def rerun_command(self, case: Case) -> str:
        return f"{self.rerun_prefix} {shell_quote(repr(case))}"

    def _header(self, what: str, case: Case, *, note_one_rank: bool = True) -> str:
        """The report's head; ``note_one_rank``: say when the case runs on 1 rank (not for a
        communication budget exceeded, which is about communication whatever the world)."""
        met = list(self.conditions(case)) if self.conditions is not None else []
        return (
            f"shardfuzz: {what}\n"
            f"target {self.target!r}, implementation {self.impl_name!r} ({self.impl_ref}), backend {self.backend}\n"
            f"{case!r}"
            + (f"\n{ONE_RANK_NOTE}" if note_one_rank and case.world_size == 1 else "")
            # what the shrunk case still has is what the bug needs (docs/triggers.md)
            + (f"\ntrigger conditions this case meets: {', '.join(met)}" if met else "")
        )

    def _non_finite_edge_note(self, case: Case, verdict: Verdict) -> str | None:
        """Where a non-finite mismatch shrank to an edge where the code has nothing to do (an empty
        shard, named where the case meets one; an empty chunk or batch): the shrinker prefers the
        smallest case, and a log(0) there can stand in for a bug every case has (a new user's
        vocab-parallel loss, wrong on every split at 9e6x, was reported on vocab 1 over 2 ranks at
        inf)."""
        floating_inf = any(od.bound is not None and math.isinf(od.max_ratio) for od in verdict.mismatched)
        if not floating_inf:  # (an integer output's mismatch is inf too)
            return None
        # the implementation's own values not finite: where only the oracle's are (a mean over no
        # token, 0/0 in the oracle), the implementation's outputs are finite and this says nothing
        shown = [e for od in verdict.mismatched for r in od.ranks for e in r.worst]
        if shown and all(math.isfinite(e.actual) for e in shown):
            return None
        met = self.conditions(case) if self.conditions is not None else ()
        empty = [c for c in met if c in ("empty shard", "empty DTensor shard")]
        if empty:
            return (
                f"the outputs are not finite on a case with an {empty[0]}: where this is the shrunk case "
                "(the smallest the shrinker found; `shardfuzz case` reruns one as given) and the bug "
                "should show with data on every rank too, run again with --exclude "
                f"\"'{empty[0]}' in triggers\" to see it there"
            )
        # a chunked loop that skipped its partial last chunk shrank to a shard of one partial
        # chunk: nothing processed, NaN, where larger shards gave finite wrong values. Said as a
        # possibility only: a log-sum-exp without its max, -inf on seq 2 with nothing empty, read
        # as blamed on an empty edge
        return (
            "the outputs are not finite in the smallest case the shrinker found: if the code has "
            "nothing to do there (a chunk, a shard or a batch with no elements), the same bug may give "
            "finite wrong values on larger cases: set that edge aside with --exclude (a size, an option) "
            "to see them; if it has, the values themselves did it (see the lines above)"
        )

    def _footer(self, case: Case, leaks: Sequence[str] = ()) -> str:
        """The rerun line, after the global state the example left behind (if any)."""
        rerun = f"Rerun this case: {self.rerun_command(case)}"
        if not leaks:
            return rerun
        note = "The example also left global state behind (restored or the pool restarted):"
        return note + "".join(f"\n  {leak}" for leak in leaks) + "\n" + rerun

    def raise_verdict(
        self, case: Case, verdict: Verdict, traces: Traces | None = None, leaks: Sequence[str] = ()
    ) -> None:
        """Raise the finding a failing verdict stands for (nothing when it passed). ``traces``: the
        collectives each rank entered (a mismatch's report says whether they agreed); ``leaks``:
        global state the example left behind (named above the rerun line)."""
        traces = dict(traces or {})
        if verdict.ignored:
            self.raise_ignored_collective(case, verdict, traces, leaks)
        if verdict.layout_problems:
            self.raise_layout(case, verdict, traces, leaks)
        if verdict.mismatched:
            self.raise_mismatch(case, verdict, traces, leaks)

    # -- raise sites, one per failure kind ----------------------------------------------------
    def raise_mismatch(self, case: Case, verdict: Verdict, traces: Traces, leaks: Sequence[str] = ()) -> None:
        bad = verdict.mismatched
        parts = [self._header(f"{len(bad)} of {len(verdict.diffs)} outputs mismatch the oracle", case)]
        parts.append(f"tolerance: {self.tolerance.describe(case.dtype)}")
        if self.self_oracle:
            parts.append(
                "oracle: the implementation itself at world size 1 in float64 (oracle='self'): "
                "a bug it also has at world size 1 cannot show"
            )
        if traces:
            parts.append(describe_sequences(traces))
            layouts = describe_layouts(traces)
            if layouts:
                parts.append(layouts)
        parts += [
            f"  except output {name!r}: {fixed.describe()}" for name, fixed in self.tolerance.per_output
        ]
        parts += [format_output_diff(d, case.rank_label) for d in bad]
        ok = [
            f"{d.name} (worst {d.max_ratio:.3g})"
            for d in verdict.diffs
            if not d.bad and sum(r.n for r in d.ranks) > 0
        ]
        if ok:
            parts.append("outputs within tolerance: " + ", ".join(ok))
        if case.profile == "ties":  # the shrinker leaves the grid only where the finding needs it
            parts.append(TIES_NOTE)
        near = near_tie_note(bad, case.dtype)
        if near:
            parts.append(near)
        decided = dtype_decision_note(bad, case.dtype)
        if decided:
            parts.append(decided)
        narrower = narrower_note(bad, case, self.tolerance.judged_dtype(case.dtype))
        if narrower:
            parts.append(narrower)
        edge = self._non_finite_edge_note(case, verdict)
        if edge:
            parts.append(edge)
        if verdict.unmodelled and verdict.worst < UNMODELLED_NOTE_BELOW:
            parts.append(unmodelled_note(verdict.unmodelled))
        parts.append(self._footer(case, leaks))
        wrong = {d.name: sorted(r.rank for r in d.ranks if r.bad and r.rank is not None) for d in bad}
        site = tuple((name, tuple(ranks)) for name, ranks in sorted(wrong.items()))
        err = Mismatch("\n".join(parts), case=case, ratio=verdict.worst, site=self._site(case, site))
        err.outputs, err.diffs, err.traces, err.leaks = wrong, bad, dict(traces), tuple(leaks)
        raise err

    def raise_layout(self, case: Case, verdict: Verdict, traces: Traces, leaks: Sequence[str] = ()) -> None:
        # a dtype alone is no rank's math: the 1-rank note would send the user there
        dtype_only = all(p.endswith(DTYPE_ONLY) for p in verdict.layout_problems)
        parts = [
            self._header(
                "local shapes/dtypes do not match the output layouts", case, note_one_rank=not dtype_only
            )
        ]
        parts += [f"  {p}" for p in verdict.layout_problems]
        if any(p.endswith(RETURNED_NONE) for p in verdict.layout_problems):
            parts.append(NEVER_COMPUTED)
        # a DTensor's layout is its placements, never the declared one
        if any(
            " holds " in p and "DTensor" not in p and not p.endswith(DTYPE_ONLY)
            for p in verdict.layout_problems
        ):
            parts.append(LAYOUT_DECLARED)
        # two new users read a layout report as the only thing wrong (a count beside it was too)
        parts.append(LAYOUT_FIRST)
        parts.append(self._footer(case, leaks))
        err = LayoutMismatch("\n".join(parts), case=case, site=self._site(case, ()))
        err.traces, err.leaks, err.problems = dict(traces), tuple(leaks), tuple(verdict.layout_problems)
        err.notes_one_rank = not dtype_only  # the summary's note points at the report's
        raise err

    def raise_rank_error(self, case: Case, outcome: RankFailed) -> NoReturn:
        # a return value that breaks the contract is not the rank's math, on 1 rank or 4
        contract = outcome.error.exc_type == ImplementationReturnError.__name__
        refusal = not contract and is_refusal(outcome.error.exc_type, outcome.error.traceback)
        one_rank = not (contract or refusal)
        parts = [self._header(f"rank {outcome.rank} raised an exception", case, note_one_rank=one_rank)]
        if refusal:
            parts.append(REFUSAL_NOTE)
        in_torch = raised_in_torch(outcome.error.traceback) if one_rank else None
        if in_torch is not None:
            parts.append(TORCH_RAISED.format(where=in_torch))
        if contract:  # shardfuzz's own frames would say nothing: the message names the return value
            last = outcome.error.traceback.rstrip().splitlines()[-1]
            parts += [CONTRACT_NOTE, f"rank {outcome.rank}: {last.removeprefix('shardfuzz.errors.')}"]
        else:
            parts.append(
                f"Rank {outcome.rank} terminated with the following error:\n{outcome.error.traceback.rstrip()}"
            )
        parts.append(describe_sequences(outcome.traces))
        parts += [t for t in outcome.output.values() if t]
        parts.append(self._footer(case))
        err = RankError(
            "\n".join(parts), case=case, site=self._site(case, cause_of(outcome.error.traceback).site())
        )
        err.traces, err.notes_one_rank = dict(outcome.traces), one_rank
        raise err

    def raise_rank_died(self, case: Case, outcome: RankDied) -> None:
        code = "unknown: not reported (a rank server's is in torchrun's log on its node)"
        code = code if outcome.exitcode is None else str(outcome.exitcode)
        # the C++ error an abort printed, in the head too: the summary row said only "exit code -6",
        # and a new user found gloo's "Received data size doesn't match expected size" 99 lines down
        said = abort_message("\n".join(t for t in outcome.output.values() if t))
        parts = [
            self._header(f"rank {outcome.rank} died (exit code {code})" + (f": {said}" if said else ""), case)
        ]
        parts.append(describe_sequences(outcome.traces))
        parts += [t for t in outcome.output.values() if t]
        parts.append(self._footer(case))
        err = RankError(
            "\n".join(parts), case=case, site=self._site(case, (f"exit code {outcome.exitcode}",))
        )
        err.traces = dict(outcome.traces)
        raise err

    def raise_hang(self, case: Case, outcome: Hung) -> None:
        o = outcome
        why = {
            "idle": f"no rank made progress (used CPU) for {o.window:g} s",
            "cap": f"still running at the hard cap of {o.cap:g} s"
            + (f"; ranks {list(o.busy)} were still using CPU (an endless loop?)" if o.busy else ""),
            "timeout": f"no result within {o.window:g} s (no CPU times on this system: a plain timeout)",
            "grace": f"ranks {list(o.stuck)} did not answer after a peer's collective failed",
        }.get(o.evidence, f"no result within {o.window:g} s")
        parts = [self._header(f"the example hung: {why}", case)]
        done = (
            f"ranks {list(o.finished)} finished the example" if o.finished else "no rank finished the example"
        )
        # the stuck ranks were stopped here; "(gloo timeout 120 s)" read as if that timeout had fired
        parts.append(
            f"{done}; ranks {list(o.stuck)} did not (stopped; a collective would wait for the process "
            f"group's timeout, {o.cap:g} s)"
        )
        parts.append(describe_sequences(o.traces))
        if o.cpu:
            parts.append(
                "CPU time in this example: "
                + ", ".join(f"rank {r} {t:.2f} s" for r, t in sorted(o.cpu.items()))
            )
        if o.timed_out:
            text = "\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(o.timed_out.items()))
            parts.append("Collectives that timed out inside ranks:\n" + text.rstrip())
        for r, stack in sorted(o.stacks.items()):
            if o.stuck and r not in o.stuck:  # its stack is the harness waiting for the next task
                parts.append(f"--- rank {r}: finished the example (waiting for the next task) ---")
            else:
                parts.append(f"--- rank {r} stack ---\n{rank_stack(stack).rstrip()}")
        parts += [t for t in o.output.values() if t]
        parts.append(self._footer(case))
        err = RankHang("\n".join(parts), case=case, site=self._site(case, ("stuck", tuple(o.stuck))))
        err.traces = dict(o.traces)
        raise err

    def raise_communication(
        self, case: Case, problem: str, budget: CommBudget, traces: Traces, leaks: Sequence[str] = ()
    ) -> None:
        what = "the implementation communicated more than its declared budget"
        parts = [self._header(what, case, note_one_rank=False)]
        parts.append(f"  {problem}")
        parts.append(f"  budget per rank: {budget.why or budget}")
        parts.append(
            "  the values were right (within tolerance); the trace, by the formulas of shardfuzz.verdict.comm:"
        )
        parts.append(format_comm(traces))
        parts.append(self._footer(case, leaks))
        over = tuple(int(w.split()[1]) for w in problem.split("; ") if w.startswith("rank "))
        err = CommunicationExceeded("\n".join(parts), case=case, site=self._site(case, ("over budget", over)))
        err.traces, err.leaks = dict(traces), tuple(leaks)
        raise err

    def raise_ignored_collective(
        self, case: Case, verdict: Verdict, traces: Traces, leaks: Sequence[str] = ()
    ) -> None:
        parts = [
            self._header(
                "autograd went through a collective with no autograd kernel (treated as identity)",
                case,
                note_one_rank=False,  # a pattern in the code, found on any world: not a rank's own math
            )
        ]
        for r, msgs in sorted(verdict.ignored.items()):
            parts.append(f"  {case.rank_label(r)}: {msgs[0].splitlines()[0][:300]}")
        parts.append(
            "  The values were not compared: this kind is reported whatever they are. An identity "
            "backward is right only where the collective's gradient is the identity (Megatron's g: "
            "an all-reduce in forward); say that in an autograd Function (Megatron's f/g pair) or use "
            "torch.distributed.nn.functional; see pytorch/pytorch#152127."
        )
        parts.append(self._footer(case, leaks))
        err = IgnoredCollective("\n".join(parts), case=case, site=self._site(case, ()))
        err.traces, err.leaks = dict(traces), tuple(leaks)
        raise err


def shell_quote(s: str) -> str:
    """Double quotes when they suffice (readable), else shlex."""
    if not any(c in s for c in '"$`\\!'):
        return f'"{s}"'
    return shlex.quote(s)


def _exact_worst(od: OutputDiff, r: RankDiff) -> list[str]:
    """The first wrong elements of an exactly compared tensor, at their global index: what the
    rank holds and what the oracle has there."""
    if r.wrong is None or r.local is None or r.to_global is None or od.ref is None:
        return []
    lines = ["first wrong elements (actual vs expected):"]
    for k in r.wrong.nonzero()[:WORST_SHOWN].tolist():
        at = r.to_global(tuple(k))
        lines.append(
            f"  [{', '.join(map(str, at))}]: {r.local[tuple(k)].item()} vs expected {od.ref[at].item()}"
        )
    return lines


def format_output_diff(od: OutputDiff, rank_label: Callable[[int], str]) -> str:
    """One output's mismatch in words: per rank, the elements wrong, the worst differences and
    the mismatch map."""
    lines = []
    total = sum(r.n for r in od.ranks)
    bad_ranks = [r for r in od.ranks if r.bad]
    pct = 100.0 * od.bad / total if total else 0.0
    # a replicated output is compared on every rank's copy: 4 / 4 of a 2-element value read as
    # a miscount (a new user's DTensor audit)
    copies = " of the ranks' copies" if od.ranks[0].rank is not None and total > math.prod(od.shape) else ""
    lines.append(
        f"output {od.name!r} ({od.layout}, {od.dtype}, global shape {list(od.shape)}): "
        f"mismatched elements: {od.bad} / {total}{copies} ({pct:.1f}%), on "
        + (
            f"{len(bad_ranks)} of {len(od.ranks)} ranks"
            if od.ranks[0].rank is not None
            else mismatch_map.assembled(od.layout)
        )
    )
    # wrong ranks whose account reads the same (a Replicate output every rank got equally wrong)
    # are told once: on 8 ranks that is 8 identical blocks otherwise (a clean rank is one line)
    alike: dict[tuple, tuple[list[str], list[int | None]]] = {}
    for r in od.ranks:
        account = _rank_account(od, r)
        key = tuple(account) if r.bad else (r.rank,)
        alike.setdefault(key, (account, []))[1].append(r.rank)
    for account, ranks in alike.values():
        if ranks[0] is None:
            who = mismatch_map.assembled(od.layout).removeprefix("the ")
        elif len(ranks) == 1:
            who = rank_label(ranks[0])
        else:
            who = f"ranks {', '.join(map(str, ranks))} (the same on each)"
        lines.append(f"  {who}: {account[0]}")
        lines.extend(account[1:])
    lines += mismatch_map.describe(od, rank_label)
    return "\n".join(lines)


def _difference(value: float, nan: bool) -> str:
    """A greatest difference as printed: a NaN on one side is ranked as infinitely wrong, and
    printed as what it is."""
    return "nan (a NaN on one side)" if nan else f"{value:.6g}"


def _rank_account(od: OutputDiff, r: RankDiff) -> list[str]:
    """What one rank's piece of a mismatching output shows: the first line (after the rank's
    name), then the lines below it."""
    if not r.bad:
        if r.n == 0:  # "ok (worst error/tolerance 0)" above a map that said "(empty)"
            return ["no element of the value (an empty or all-padding piece): nothing to compare"]
        return [f"ok (worst error/tolerance {r.max_ratio:.3g})"]
    lines = [f"{r.bad} / {r.n} elements wrong{r.note}"]
    if od.bound is None:  # compared exactly: no tolerance, so no ratio to it
        if r.max_abs:
            lines.append(
                f"    greatest difference: {r.max_abs:.6g} at index {r.max_abs_at} (compared exactly)"
            )
        return lines + [f"    {line}" for line in _exact_worst(od, r)]
    # the two figures can be of two elements: the largest difference may sit where more is allowed,
    # and even pass there (a new user read the index as the wrong element's)
    within = not r.max_abs_nan and r.max_abs <= r.max_abs_allowed
    allowed = (
        f"an element that passes: {r.max_abs_allowed:.3g} is allowed there; the worst element against "
        "its own tolerance, below, is"
        if within
        else f"up to {r.max_abs_allowed:.3g} allowed there; the worst element is"
    )
    lines.append(
        f"    greatest absolute difference: {_difference(r.max_abs, r.max_abs_nan)} at index {r.max_abs_at} "
        f"({allowed} {r.max_ratio:.3g}x its tolerance)"
    )
    zero = " (expected 0 there)" if r.max_rel_expected == 0 else ""
    rel = _difference(r.max_rel, r.max_rel_nan)
    lines.append(f"    greatest relative difference: {rel} at index {r.max_rel_at}{zero}")
    if r.worst:
        lines.append("    worst elements (actual vs expected, allowed = the tolerance there):")
        lines.extend(f"      {w.describe()}" for w in r.worst)
        lines += _non_finite_note(od, r)
    return lines


def _non_finite_note(od: OutputDiff, r: RankDiff) -> list[str]:
    """A line where a shown element is inf or NaN and the oracle's is finite: an overflow in the
    case dtype reads as "infx" otherwise (a new user's float16 GELU, whose ``x**3`` overflowed)."""
    if not any(not math.isfinite(w.actual) and math.isfinite(w.expected) for w in r.worst):
        return []
    # a floating dtype's name only: od.dtype may name a Python type ("float" is torch.float32 too)
    largest = (
        f" (its largest finite value is {torch.finfo(getattr(torch, od.dtype)).max:.6g})"
        if od.dtype in UNIT_ROUNDOFF
        else ""
    )
    # "or a narrower type": a new user's float32 norm, summed in float16, read as a float32 overflow
    return [
        f"    inf or NaN where the oracle is finite: did the implementation's arithmetic overflow "
        f"{od.dtype}{largest}, or a narrower type it computes in, or make a NaN (0 * inf, inf - inf)? "
        "Did a sum cancel to exactly 0 in the case dtype and then divide (a norm under an eps clamp, "
        "x / max(|x|, eps): a spectral norm whose partial sums cancelled)? Did an exp underflow to 0 "
        "and then meet a log or a division (a log-sum-exp without its max subtracted: log(exp(-334)) "
        "is -inf in float32)? Or is it an element the implementation never wrote (a buffer filled with NaN or left uninitialised, as torch.empty "
        "leaves it)? The float64 oracle's value is finite there"
    ]


#: a C++ exception's message as libstdc++ prints it before an abort, and a source-location prefix
_WHAT = re.compile(r"^\s*what\(\):\s*(.*\S)")
_WHERE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def abort_message(output: str) -> str | None:
    """The message of the C++ exception a dead rank printed (``what(): [pair.cc:553] Received data
    size doesn't match expected size``: its text, without the source location), else None."""
    for line in output.splitlines():
        m = _WHAT.match(line)
        if m:
            text = _WHERE.sub("", m.group(1)).strip()
            return text if len(text) <= 200 else text[:197] + "..."
    return None
