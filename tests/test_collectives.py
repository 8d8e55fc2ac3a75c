"""The collective trace: what each rank entered, the first divergent collective of a hang or a rank
error, communication accounting against the handbook's formulas, and the ``communication``
finding."""

import dataclasses
import math
import os
import re

import pytest
import torch.distributed as dist

from shardfuzz import Case, RankError, RankHang, RunConfig, Runner
from shardfuzz.errors import CommunicationExceeded, InvalidArgument
from shardfuzz.frontends.testing import run_cli
from shardfuzz.ranks.trace import Collective
from shardfuzz.report.divergence import describe_sequences, first_divergence, format_trace
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target
from shardfuzz.verdict.comm import (
    CommBudget,
    CostModel,
    budget_violation,
    estimate,
    format_comm,
    parse_quantity,
    usage,
)

TOY = os.path.join(os.path.dirname(__file__), "data", "toy_target.py")
TOY_IMPLS = os.path.join(os.path.dirname(__file__), "data", "toy_impls.py")


def _c(seq, op, group, shape, dtype="float32", peer=None, out=()):
    return Collective(
        seq, op, tuple(group), (tuple(shape),) if shape is not None else (), dtype, out, None, peer
    )


# -- the first divergent collective ----------------------------------------------------------------
def test_the_issue_example_names_the_op_the_ranks_and_who_never_got_further():
    g = (0, 1, 2)
    same = [_c(0, "all_reduce", g, [4]), _c(1, "broadcast", g, [2], peer=0)]
    traces = {
        0: [*same, _c(2, "all_reduce", g, [4]), _c(3, "all_reduce", g, [1])],
        1: [*same, _c(2, "all_reduce", g, [4])],
        2: [*same, _c(2, "all_gather", g, [2])],
    }
    d = first_divergence(traces)
    assert d.op == "all_reduce" and d.entered == (0, 1) and d.others == (2,)
    assert "ranks 0, 1 entered #3 all_reduce(float32[4]) on group [0, 1, 2]" in d.text
    assert "rank 2's #3 is all_gather(float32[2])" in d.text
    assert "rank 2 never reached a #4" in d.text


def test_a_rank_that_stopped_early_and_a_shape_disagreement():
    g = (0, 1)
    stopped = {
        0: [_c(0, "all_reduce", g, [3]), _c(1, "all_reduce", g, [3])],
        1: [_c(0, "all_reduce", g, [3])],
    }
    d = first_divergence(stopped)
    assert (d.op, d.entered, d.others) == ("all_reduce", (0,), (1,))
    assert "rank 1 never reached a #2 (its last on this group: #1 all_reduce(float32[3]))" in d.text
    shapes = {0: [_c(0, "all_reduce", g, [3])], 1: [_c(0, "all_reduce", g, [2])]}
    assert first_divergence(shapes) is not None
    agree = {0: [_c(0, "all_reduce", g, [3])], 1: [_c(0, "all_reduce", g, [3])]}
    assert first_divergence(agree) is None
    assert describe_sequences(agree).startswith("collectives: every rank entered the same sequence")


def test_ranks_that_all_stopped_at_the_differing_collective_are_not_said_to_lag():
    """A new user's uneven all_gather_into_tensor killed a rank at #7: both ranks entered 7, and
    the line said "rank 1 never reached a #8" beside "collectives entered: rank 0: 7, rank 1: 7"."""
    g = (0, 1)
    same = [_c(k, "all_reduce", g, [3]) for k in range(6)]
    both_stopped = {
        0: [*same, _c(6, "all_gather_into_tensor", g, [1, 2, 3])],
        1: [*same, _c(6, "all_gather_into_tensor", g, [1, 1, 3])],
    }
    d = first_divergence(both_stopped)
    assert "rank 1's #7 is all_gather_into_tensor(float32[1, 1, 3])" in d.text
    assert "never reached" not in d.text, d.text
    went_on = {0: [*both_stopped[0], _c(7, "all_reduce", g, [3])], 1: both_stopped[1]}
    assert "rank 1 never reached a #8" in first_divergence(went_on).text


def test_an_all_to_all_whose_splits_do_not_pair_up_is_named():
    """Every rank entered the same all_to_all_single, but rank 0 sends what rank 1 does not expect
    (receive splits copied from the send splits: a new user's MoE bug)."""

    def a2a(seq, sends, receives):
        return Collective(
            seq, "all_to_all_single", (0, 1), ((sum(sends),),), "float32", (), (sends, receives)
        )

    uneven = {0: [a2a(0, (1, 3), (1, 2))], 1: [a2a(0, (2, 0), (3, 0))]}  # rank 0 sends 3 to 1, 1 expects 3
    assert first_divergence(uneven) is None
    swapped = {0: [a2a(0, (1, 3), (1, 3))], 1: [a2a(0, (2, 0), (2, 0))]}
    d = first_divergence(swapped)
    assert (d.op, d.entered, d.others) == ("all_to_all_single", (0, 1), ())
    assert "rank 0 sends 3 element(s) to rank 1, which expects 2 from rank 0" in d.text, d.text
    line = describe_sequences(swapped)
    assert "splits do not pair up" in line and "sequences differ" not in line, line
    assert "#1   all_to_all_single(float32[4]) on group [0, 1] sends [1, 3] receives [1, 3]" in format_trace(
        swapped
    )
    assert "in rows" not in d.text  # 1-D tensors: elements are rows
    # rows of 4 elements (d_model 4): the splits said in rows too, as all_to_all_single is given them
    rows = {
        r: [dataclasses.replace(c, shapes=((sum(c.splits[0]), 4),), splits=tuple(
            tuple(4 * n for n in part) for part in c.splits))]
        for r, (c,) in swapped.items()
    }  # fmt: skip
    d = first_divergence(rows)
    assert "rank 0 sends 12 element(s) to rank 1, which expects 8 from rank 0" in d.text, d.text
    assert "in rows of 4 elements, [1, 3] and [2, 0]" in d.text, d.text


def test_an_all_to_all_whose_splits_do_not_cover_its_tensor_is_named():
    """Equal splits assumed (no split sizes) for 1 row on 2 ranks: the trace's splits were [0, 0] on
    both sides, so they paired up, and a report named the next collective, which a rank that
    died in this one never reached (a new user's MoE bug)."""

    def a2a(rows, sends, receives, out_rows):
        return Collective(
            0, "all_to_all_single", (0, 1), ((rows, 1),), "float32", ((out_rows, 1),), (sends, receives)
        )

    cut = {0: [a2a(1, (0, 0), (0, 0), 1)], 1: [a2a(0, (0, 0), (0, 0), 0)]}
    d = first_divergence(cut)
    assert d is not None and (d.op, d.entered) == ("all_to_all_single", (0, 1)), d
    assert "rank 0's input float32[1, 1] holds 1 element(s), but its splits cover 0 ([0, 0])" in d.text, (
        d.text
    )
    even = {0: [a2a(2, (1, 1), (1, 1), 2)], 1: [a2a(2, (1, 1), (1, 1), 2)]}
    assert first_divergence(even) is None


def test_a_send_pairs_only_with_a_receive_of_its_own_tag():
    """A new user's interleaved pipeline sent its last gradient with the wrong tag and hung, and
    the report said every rank entered the same sequence: sends and receives paired by order alone.
    They pair per tag now, as gloo and NCCL match them; a trace line keeps the tag."""
    send = dataclasses.replace(_c(0, "isend", (0, 1), [6], peer=1), op="send", tag=7)
    recv = dataclasses.replace(_c(0, "irecv", (0, 1), None, peer=0, out=((6,),)), op="recv", tag=7)
    assert first_divergence({0: [send], 1: [recv]}) is None
    wrong = {0: [send], 1: [dataclasses.replace(recv, tag=8)]}
    d = first_divergence(wrong)
    assert d is not None, describe_sequences(wrong)
    assert (
        "rank 0's send #1 to rank 1 with tag 7 (send(float32[6])) has no matching receive: rank 1 "
        "posted 0 receive(s) from rank 0 with tag 7; and 1 receive(s) with tag 8" in d.text
    ), d.text
    assert Collective.from_json(send.to_json()) == send  # the tag travels in the trace file
    old = send.to_json().rsplit(",", 1)[0] + "]"  # a line written before tags: tag 0, as before
    assert Collective.from_json(old).tag is None
    assert (
        first_divergence({0: [dataclasses.replace(send, tag=None)], 1: [dataclasses.replace(recv, tag=0)]})
        is None
    )


def test_point_to_point_pairs_by_order_and_size():
    ok = {0: [_c(0, "send", (0, 1), [2, 3], peer=1)], 1: [_c(0, "recv", (0, 1), None, peer=0, out=((6,),))]}
    assert first_divergence(ok) is None  # same element count, another shape: gloo only sees bytes
    # a pipeline's middle stage enters more than its neighbours: no "same sequence" beside counts
    # that differ (a new user's pipeline audit read it as wrong)
    relay = {
        **ok,
        1: [*ok[1], _c(1, "send", (1, 2), [6], peer=2)],
        2: [_c(0, "recv", (1, 2), None, peer=1, out=((6,),))],
    }
    assert first_divergence(relay) is None
    assert describe_sequences(relay) == (
        "collectives: no divergence: each group's collectives agree, and every send has its receive "
        "(entered: rank 0: 1, rank 1: 2, rank 2: 1)"
    )
    size = {0: [_c(0, "send", (0, 1), [4], peer=1)], 1: [_c(0, "recv", (0, 1), None, peer=0, out=((2,),))]}
    d = first_divergence(size)
    assert d.entered == (0,) and d.others == (1,) and "the sizes differ" in d.text
    lost = {0: [_c(0, "send", (0, 1), [4], peer=1)], 1: []}
    d = first_divergence(lost)
    assert "has no matching receive: rank 1 posted 0 receive(s) from rank 0" in d.text

    # every rank sends before it receives: the report named rank 0's send alone, beside "the ranks'
    # sequences differ" (a new user's ring deadlock, on 2 and 3 ranks)
    def blocking(r, peer, call="send"):
        return dataclasses.replace(_c(0, "send", (0, 1, 2), [6], peer=peer), call=call)

    ring = {r: [blocking(r, (r + 1) % 3)] for r in range(3)}
    line = describe_sequences(ring)
    assert "also unmatched: rank 1's send #1 to rank 2" in line and "rank 2's send #1 to rank 0" in line, line
    assert "(a cycle of blocking sends: ranks 0 -> 1 -> 2 -> 0 each wait to send to the next" in line, line
    assert "sequences differ" not in line, line
    # isends do not wait for their receives: unmatched, but no cycle of waits (a reviewer's case)
    assert "cycle" not in describe_sequences({r: [blocking(r, (r + 1) % 3, "isend")] for r in range(3)})
    # a wrong send's victim waits in its receive: the unmatched send is named too, and no cycle
    wrong = {
        0: [_c(0, "recv", (0, 1, 2), None, peer=1, out=((1,),))],
        1: [_c(0, "send", (0, 1, 2), [1], peer=2)],
        2: [],
    }
    text = first_divergence(wrong).text
    assert (
        "rank 0's receive #1 from rank 1" in text and "also unmatched: rank 1's send #1 to rank 2" in text
    ), text
    assert "deadlock" not in text, text


# every planted hang and rank error of the built-in targets, on its minimal case: the named op, the
# ranks that entered it, and the ranks that did not (or entered another)
DIVERGENCES = {
    ("tp_mlp", "skip_empty_shard"): (
        Case(
            target="tp_mlp", world_size=3, mesh=(3,), split=("hidden",),
            sizes={"batch": 1, "seq": 1, "d_model": 1, "hidden": 4, "d_out": 1},
        ),
        "all_reduce", (0, 1), (2,),
    ),
    ("moe", "skip_empty_backward"): (
        Case(
            target="moe", world_size=2, mesh=(2,), split=("tokens", "experts"), seed=2,
            sizes={"tokens": 2, "experts": 2, "d_model": 1, "hidden": 1},
            options={"top_k": 1, "capacity_factor": None, "empty_experts": 0},
        ),
        "all_to_all_single", (0,), (1,),
    ),
    ("zero_adamw", "padding_on_last_rank"): (
        Case(
            target="zero_adamw", world_size=3, mesh=(3,), sizes={"numel": 1}, split=("numel",),
            options={"stage": 1, "clip_factor": None, "steps": 1, "grad_accum": 1},
        ),
        "all_to_all_single", (0,), (1, 2),
    ),
    # every rank raises before its first send (Tensor.chunk gave one piece for two ranks)
    ("ring_allreduce", "tensor_chunk"): (
        Case(target="ring_allreduce", world_size=2, mesh=(2,), sizes={"numel": 1}, split=("numel",)),
        None, (), (),
    ),
    # 3 stages: stage 2 sends its input gradient to stage 0, so stage 1 waits for one forever and
    # stage 0 for stage 1's
    ("pipeline_1f1b", "grad_to_next_stage"): (
        Case(
            target="pipeline_1f1b", world_size=3, mesh=(3,), split=("layers",),
            sizes={"layers": 3, "rows": 1, "hidden": 1}, options={"kind": "gpipe", "microbatches": 1},
        ),
        "recv", (0,), (1,),
    ),
    # stage 0 raises (no micro-batch 1). Its peers run on until the report is made, so how far
    # they got is a race (seen in clean-ci): stage 2 alone in the orders' all-gather, or a stage
    # still waiting for an activation its predecessor never sent. Each names a lower stage as the
    # one that did not keep up.
    ("pipeline_1f1b", "warmup_unclamped"): (
        Case(
            target="pipeline_1f1b", world_size=3, mesh=(3,), split=("layers",),
            sizes={"layers": 3, "rows": 1, "hidden": 1}, options={"kind": "1f1b", "microbatches": 1},
        ),
        [("all_gather_into_tensor", (2,), (0, 1)), ("recv", (2,), (1,)), ("recv", (1,), (0,))], None, None,
    ),
}  # fmt: skip


def test_every_planted_hang_and_rank_error_is_listed_here():
    listed = {
        (t, name)
        for t in BUILTIN_TARGETS
        for name, rec in get_target(t).planted.items()
        if set(rec.expect.kinds) & {"hang", "rank-error"}
    }
    assert listed == set(DIVERGENCES)


@pytest.mark.parametrize("target,bug", sorted(DIVERGENCES), ids=lambda x: str(x))
def test_planted_hangs_and_rank_errors_name_their_first_divergent_collective(target, bug):
    case, op, entered, others = DIVERGENCES[(target, bug)]
    with pytest.raises((RankHang, RankError)) as info:
        Runner(target, bug, RunConfig(timeout=2)).run_case(case)
    d = first_divergence(info.value.traces)
    if op is None:  # no rank entered a collective: nothing diverged, and the report says so
        assert d is None and "collectives: none entered on any rank" in info.value.report
        return
    allowed = op if isinstance(op, list) else [(op, entered, others)]
    assert (d.op, d.entered, d.others) in allowed, d.text
    assert f"first divergent collective: {d.text}" in info.value.report


def test_torch_context_parallel_abort_is_two_all_gathers_of_different_sizes():
    # the expected failure torch_cp_ring: on seq 3 over 2 ranks the ranks' K/V buffers differ
    case = Case(
        target="ring_attention", world_size=2, mesh=(2,), sizes={"batch": 1, "seq": 3, "heads": 1, "head_dim": 1},
        split=("seq",), options={"variant": "full", "lse_grad": False, "logit_scale": 1.0},
    )  # fmt: skip
    with pytest.raises(RankError) as info:
        Runner("ring_attention", "torch_cp_ring").run_case(case)
    d = first_divergence(info.value.traces)
    assert d.op == "all_gather_into_tensor" and len(d.entered) == 1 and len(d.others) == 1
    assert "float32[4]" in d.text and "float32[2]" in d.text


# -- communication accounting ------------------------------------------------------------------
#: per world size, numel: even, uneven, and with empty chunks (fewer elements than ranks)
RING_SIZES = {2: (4, 3, 1), 3: (6, 4, 5, 2), 4: (8, 5, 7, 3)}


@pytest.mark.parametrize("n", sorted(RING_SIZES))
def test_hand_written_ring_all_reduce_sends_2_n_minus_1_over_n_of_s(n):
    """The built-in ring_allreduce's trace: 2 (n-1)/n * S per rank on even sizes; on uneven ones
    rank r sends every chunk but r+1, then every chunk but r+2 (balanced chunks: S // n, the first
    S % n one more), at most 2 (n-1)/n of the size padded to a multiple of n."""
    runner = Runner("ring_allreduce")
    target = get_target("ring_allreduce")
    for numel in RING_SIZES[n]:
        case = Case(
            target="ring_allreduce", world_size=n, mesh=(n,), sizes={"numel": numel}, split=("numel",)
        )
        assert runner.run_case(case) < 1  # right values, and within its own budget
        c = [numel // n + (i < numel % n) for i in range(n)]
        sent = {r: 4 * (2 * numel - c[(r + 1) % n] - c[(r + 2) % n]) for r in range(n)}
        received = {r: 4 * (2 * numel - c[r] - c[(r + 1) % n]) for r in range(n)}
        used = usage(runner.last_traces)
        assert {r: u.sent for r, u in used.items()} == sent, (numel, c)
        assert {r: u.received for r, u in used.items()} == received, (numel, c)
        padded = -(-numel // n) * n
        for u in used.values():
            assert u.ops["send"][0] == u.ops["recv"][0] == 2 * (n - 1)
            assert u.sent <= 2 * (n - 1) / n * padded * 4
            if numel % n == 0:
                assert u.sent == pytest.approx(2 * (n - 1) / n * numel * 4)
        budget = target.comm["reference"](case)
        assert budget.sent == max(sent.values()) and budget.collectives == 4 * (n - 1)


def test_torch_all_reduce_and_padded_reduce_scatter_all_gather_pass_within_their_budgets():
    """torch's all-reduce sends 2 (n-1)/n * S by the formula; reduce-scatter + all-gather on the
    vector padded to a multiple of n sends 2 (n-1)/n of the padded size, more than the ring."""
    n = 3
    for impl in ("torch_all_reduce", "torch_rs_ag"):
        runner = Runner("ring_allreduce", impl)
        for numel in (6, 4, 2):
            case = Case(
                target="ring_allreduce", world_size=n, mesh=(n,), sizes={"numel": numel}, split=("numel",)
            )
            assert runner.run_case(case) < 1
            size = numel if impl == "torch_all_reduce" else -(-numel // n) * n
            for u in usage(runner.last_traces).values():
                assert u.sent == pytest.approx(2 * (n - 1) / n * size * 4), (impl, numel)


def test_a_run_whose_implementation_has_no_budget_says_its_bytes_went_unchecked():
    """Budgets are per implementation: one the target has no budget for (torch's redistribute
    here; a user's own implementation alike) is not checked, and the summary says so (a new user
    took silence for a pass)."""
    out = run_cli(
        "fuzz", "redistribute", "--impl", "torch_redistribute", "--max-examples", "3", "--no-progress"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    note = "communication not checked: no budget for torch_redistribute; the target has one for reference"
    assert note in out.stdout, out.stdout
    out = run_cli("fuzz", "redistribute", "--max-examples", "3", "--no-progress")
    assert out.returncode == 0 and "communication not checked" not in out.stdout, out.stdout


def test_tp_mlp_comm_prints_counts_bytes_per_rank_and_both_estimates():
    sizes = {"batch": 2, "seq": 3, "d_model": 4, "hidden": 6, "d_out": 5}
    case = Case(target="tp_mlp", world_size=2, mesh=(2,), sizes=sizes, split=("hidden",))
    res = run_cli("case", "tp_mlp", repr(case), "--comm", "--trace")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = 2 * 3
    per_rank = 2 * (2 - 1) / 2 * (rows * 5 + rows * 4) * 4  # g's all-reduce forward, f's backward
    totals = re.findall(rf"^\s+[01]\s+total\s+2\s+{per_rank:,.0f} B\s+{per_rank:,.0f} B$", res.stdout, re.M)
    assert len(totals) == 2, res.stdout
    assert res.stdout.count("all_reduce(float32[2, 3, 5]) on group [0, 1]") >= 3  # trace + estimate
    assert "ring " in res.stdout and "tree " in res.stdout
    runner = Runner("tp_mlp")
    runner.run_case(case)
    assert {r: u.sent for r, u in usage(runner.last_traces).items()} == {0: per_rank, 1: per_rank}


def test_alpha_beta_formulas_are_the_handbooks():
    m = CostModel()  # 5 us, 200 GB/s
    s = 1 << 20
    for n in (2, 3, 8):
        assert estimate("all_reduce", n, s, "ring", m) == pytest.approx(2 * (n - 1) * (5e-6 + s / n / 200e9))
        tree = 2 * math.ceil(math.log2(n)) * (5e-6 + s / 200e9)
        assert estimate("all_reduce", n, s, "tree", m) == pytest.approx(tree)
    assert estimate("send", 2, s, "ring", m) == pytest.approx(5e-6 + s / 200e9)
    slow = CostModel(alpha=1e-3, beta=1e9, algorithm="ring")
    assert estimate("all_gather_into_tensor", 4, 4e6, "ring", slow) == pytest.approx(3 * (1e-3 + 1e6 / 1e9))
    assert "tree" not in format_comm({0: [_c(0, "all_reduce", (0, 1), [8])]}, slow)


def test_comm_says_the_backward_of_functional_autograd_collectives_is_not_counted():
    """A new user's sequence-parallel MLP on functional collectives entered 5 collectives a rank;
    ``--comm`` listed the 3 of the forward and said nothing of the 2 its backward ran from C++."""
    import dataclasses

    gather = dataclasses.replace(
        _c(0, "all_gather_into_tensor", (0, 1), [2, 3]), api="functional", call="all_gather_tensor_autograd"
    )
    reduce = dataclasses.replace(_c(1, "all_reduce", (0, 1), [3]), api="functional", call="all_reduce")
    text = format_comm({0: [gather, reduce], 1: [gather, reduce]})
    assert (
        "not counted: the backward collectives of functional collectives with an autograd kernel "
        "(all_gather_tensor_autograd x2, all_reduce x2, over all ranks)"
    ) in text, text
    plain = format_comm({0: [_c(0, "all_reduce", (0, 1), [8])], 1: [_c(0, "all_reduce", (0, 1), [8])]})
    assert "not counted" not in plain


def test_bad_cost_model_and_units_name_the_argument():
    with pytest.raises(InvalidArgument, match="algorithm='fast'"):
        CostModel(algorithm="fast")
    with pytest.raises(InvalidArgument, match="beta=0"):
        CostModel(beta=0)
    assert parse_quantity("5us", {"us": 1e-6}, "--alpha") == pytest.approx(5e-6)
    with pytest.raises(InvalidArgument, match="--alpha='fast'"):
        parse_quantity("fast", {"us": 1e-6}, "--alpha")
    res = run_cli("case", "tp_mlp", "Case(target='tp_mlp', world_size=1)", "--beta", "0GB/s")
    assert res.returncode == 2 and "--beta='0GB/s'; must be > 0" in res.stderr, res.stderr


def test_a_budget_names_the_rank_and_how_far_over():
    traces = {0: [_c(0, "all_reduce", (0, 1), [8])], 1: [_c(0, "all_reduce", (0, 1), [8])]}
    assert budget_violation(CommBudget(sent=32), traces) is None
    text = budget_violation(CommBudget(sent=16, collectives=0), traces)
    assert "rank 0 sent 32 B, over the budget of 16 B (2x)" in text and "entered 1 collectives" in text


def test_a_budget_bounds_the_largest_single_collective():
    # two buckets of 2 float32 each, or one of 4: the same bytes, one collective twice as large
    two = [_c(0, "all_reduce", (0, 1), [2]), _c(1, "all_reduce", (0, 1), [2])]
    traces = {0: two, 1: two}
    assert budget_violation(CommBudget(sent=16, largest=8), traces) is None
    one = {r: [_c(0, "all_reduce", (0, 1), [4])] for r in (0, 1)}
    assert budget_violation(CommBudget(sent=16), one) is None
    text = budget_violation(CommBudget(sent=16, largest=8), one)
    assert "rank 0 entered all_reduce(float32[4]) of S = 16 B" in text and "allowed, 8 B" in text


def test_a_communication_finding_is_raised_on_right_values():
    case = Case(target="vocab_parallel", world_size=2, mesh=(2,), sizes={"batch": 1, "seq": 1, "d_model": 1, "vocab": 4},
                split=("vocab",), options={"smoothing": 0.0, "rule": "dtensor", "class_weight": False,
                                           "ignore_index": False, "reduction": "none"})  # fmt: skip
    assert Runner("vocab_parallel").run_case(case) < 1
    with pytest.raises(CommunicationExceeded) as info:
        Runner("vocab_parallel", "gathered_max").run_case(case)
    assert "the values were right" in info.value.report and "all_gather_into_tensor" in info.value.report
    assert info.value.kind == "communication" and info.value.site == ("over budget", (0, 1))


@pytest.mark.skipif(
    not hasattr(dist, "all_gather_single"), reason="torch before 2.13 has no all_gather_single"
)
def test_the_single_tensor_collectives_are_traced():
    """torch 2.13's ``all_gather_single`` and ``reduce_scatter_single`` (FSDP2's collectives, and
    what ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` now call): each entered once,
    under the names the communication model knows."""
    case = Case(target="toy", world_size=3, mesh=(3,), sizes={"n": 5}, split=("n",))
    runner = Runner(TOY, f"{TOY_IMPLS}::single_collectives")
    assert runner.run_case(case) <= 1
    for r in range(3):
        got = [(c.op, c.shapes, c.out_shapes, c.group) for c in runner.last_traces[r]]
        want = [
            ("all_gather_into_tensor", ((1,),), ((3,),), (0, 1, 2)),
            ("reduce_scatter_tensor", ((3,),), ((1,),), (0, 1, 2)),
        ]
        assert got == want, got


def test_a_collective_torch_bound_by_name_is_traced():
    """DTensor's ``distribute_tensor`` broadcasts through ``from distributed_c10d import
    broadcast``, bound before the trace was installed: rank 0, blocked there after rank 1 raised,
    read as "none entered", so the report waited the whole RUNNABLE_GRACE_S for it (a second a
    rank error on DTensor targets; a rank in a traced collective is not on its way)."""
    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
    with pytest.raises(RankError) as info:
        Runner(TOY, f"{TOY_IMPLS}::raise_after_distribute", RunConfig(timeout=5)).run_case(case)
    assert [c.op for c in info.value.traces[0]] == ["broadcast"], info.value.report
    assert "broadcast" in info.value.report


@pytest.mark.parametrize("impl", ["raise_while_peer_computes", "raise_while_peer_sleeps"])
def test_a_peer_on_its_way_to_a_collective_after_a_crash_is_waited_for_before_the_report(impl):
    """Rank 1 raises while rank 0 has not reached its collective yet: it still computes (0.1 s of
    CPU; a loaded machine makes any peer that late), or sleeps 0.3 s first (not runnable in
    /proc: as on a page fault or a lazy import). The report waits for rank 0 to reach its
    collective, so the first divergent collective is named. With only the 0.05 s grace after a
    rank's own error it read "none entered" for both; waiting only for runnable peers, for the
    sleeping one (zero_adamw/padding_on_last_rank's divergence test failed so in clean-ci)."""
    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
    with pytest.raises(RankError) as info:
        Runner(TOY, f"{TOY_IMPLS}::{impl}", RunConfig(timeout=5)).run_case(case)
    d = first_divergence(info.value.traces)
    assert d is not None, info.value.report
    assert (d.op, d.entered, d.others) == ("all_reduce", (0,), (1,)), d.text
