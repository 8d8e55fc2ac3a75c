"""The map of where a mismatch's wrong elements sit (shardfuzz.report.mismatch_map) and ``case --plot``."""

import dataclasses
import math
import pickle
import re
import time

import pytest
import torch

from shardfuzz.case import Case
from shardfuzz.engine.runner import Runner
from shardfuzz.errors import Mismatch
from shardfuzz.frontends.testing import run_cli
from shardfuzz.report.findings import format_output_diff
from shardfuzz.report.mismatch_map import MAX_COLS, MAX_ROWS, cells, format_runs, runs, segments
from shardfuzz.spec.layouts import PaddedFlat, Partial, Replicate, Shard, Zigzag
from shardfuzz.verdict.compare import OutputDiff, compare_tensor

LABEL = lambda r: f"rank {r}"


def diff(layout, ref, actual, parts, tol=1e-9):
    """The OutputDiff the judge makes for a per-rank layout: each rank's piece of ``actual`` against
    its piece of ``ref`` (tolerance ``tol``)."""
    ref, actual = ref.double(), actual.double()
    shape = tuple(ref.shape)
    if not layout.per_rank:  # Partial: rank 0 holds the whole value, the others zeros
        locals_ = [actual] + [torch.zeros_like(actual)] * (parts - 1)
        total = layout.assemble(locals_)
        rds = [compare_tensor(total, ref, torch.full_like(ref, 1e-9), None, lambda i: i)]
        return OutputDiff("y", repr(layout), "float64", shape, rds, [], ref, torch.full_like(ref, 1e-9))
    rds = []
    for r in range(parts):
        local = layout.piece(actual, r, parts)
        to_global = lambda idx, r=r: layout.global_index(idx, r, parts, shape)
        want = layout.piece(ref, r, parts)
        rds.append(compare_tensor(local, want, torch.full_like(want, tol), r, to_global))
    bound = torch.full_like(ref, tol)
    return OutputDiff("y", repr(layout), "float64", shape, rds, [list(range(parts))], ref, bound)


def map_lines(text):
    return text.split("map of the wrong elements", 1)[1].splitlines()


def grid_of(text):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("grid"))
    return [line.strip() for line in lines[start + 1 :] if line.startswith("      ") and "[" not in line]


def test_runs_merge_and_stay_short():
    assert runs([3, 4, 5, 9]) == [(3, 5), (9, 9)]
    assert format_runs(runs([3, 4, 5, 9]), 12) == "indices 3-5, 9 of 12"
    assert format_runs(runs(list(range(6))), 6) == "all 6"
    many = format_runs(runs(list(range(0, 40, 2))), 40)
    assert many.startswith("indices 0, 2, 4, 6, ...") and "16 more runs" in many


@pytest.mark.parametrize(
    "layout, n, parts",
    [(Shard(0), 10, 3), (Shard(0, rule="tensor_split"), 10, 4), (Zigzag(0), 11, 2), (PaddedFlat(), 7, 3)],
)
def test_segments_are_the_layouts_index_map(layout, n, parts):
    for r in range(parts):
        k = layout.comparable(layout.piece(torch.arange(n), r, parts), r, parts, (n,)).shape[0]
        segs = segments(lambda idx, r=r: layout.global_index(idx, r, parts, (n,)), (k,), 0)
        flat = [g + j for lo, length, g in segs for j in range(length)]
        assert flat == [layout.global_index((i,), r, parts, (n,))[0] for i in range(k)]
        assert len(segs) <= (2 if isinstance(layout, Zigzag) else 1)


def test_segments_of_a_huge_dim_take_a_handful_of_calls():
    calls = []
    to_global = lambda idx: calls.append(idx) or Zigzag(0).global_index(idx, 1, 4, (10**7,))
    segs = segments(to_global, (10**7 // 4,), 0)
    assert [(lo, k) for lo, k, _ in segs] == [(0, 1_250_000), (1_250_000, 1_250_000)]
    assert len(calls) < 200


def test_one_wrong_run_on_one_rank_of_a_1d_shard():
    ref = torch.arange(12.0)
    bad = ref.clone()
    bad[5:7] += 1  # rank 1 holds global 4-7: its local 1-2
    text = format_output_diff(diff(Shard(0), ref, bad, 3), LABEL)
    lines = map_lines(text)
    assert "dim 0 split over the ranks (Shard(0))" in lines[0]
    assert "    rank 1: wrong at dim 0: indices 1-2 of 4 [global 5-6]" in lines
    assert "    clean: ranks 0, 2" in lines
    assert grid_of(text) == ["....|.##.|...."]


def test_a_2d_grid_shows_the_one_wrong_shard_and_its_boundary():
    ref = torch.randn(8, 6)
    bad = ref.clone()
    bad[4:] += 1  # rank 1's whole shard
    text = format_output_diff(diff(Shard(0), ref, bad, 2), LABEL)
    assert "    rank 1: wrong at dim 0: all 4 [global 4-7]" in text
    assert grid_of(text) == ["......"] * 4 + ["------"] + ["######"] * 4


def test_a_diagonal_on_a_replicated_output():
    ref = torch.randn(6, 6)
    bad = ref + torch.eye(6)
    d = diff(Replicate(), ref, bad, 2)
    d.ranks[0] = compare_tensor(ref, ref, torch.full_like(ref, 1e-9), 0, lambda i: i)  # rank 0 right
    text = format_output_diff(d, LABEL)
    assert "every rank holds the whole value (Replicate()); indices are global" in text
    assert (
        "    clean: rank 0" in text
        and "    rank 1: wrong at 6 of 36 elements, in every index of every dim" in text
    )
    assert grid_of(text) == ["".join("#" if i == j else "." for j in range(6)) for i in range(6)]


def test_a_replicated_output_says_whether_its_ranks_hold_different_values():
    """A new user's FSDP2 bias left out of the all-reduce: -1.106 on rank 0, -0.206 on rank 1, and
    the report said only "every rank holds the whole value"; ranks that disagree are the clue."""
    ref = torch.randn(6, 6)
    d = diff(Replicate(), ref, ref + torch.eye(6), 2)
    d.ranks[0] = compare_tensor(ref, ref, torch.full_like(ref, 1e-9), 0, lambda i: i)  # rank 0 right
    assert "    the ranks hold different values: against rank 0, rank 1 by up to 1\n" in format_output_diff(
        d, LABEL
    )
    same = format_output_diff(diff(Replicate(), ref, ref + torch.eye(6), 2), LABEL)  # wrong alike
    assert "every rank holds the whole value" in same and "different values" not in same, same


def test_ranks_that_all_hold_the_same_infinity_or_nan_do_not_differ():
    """Every rank held -inf (an fp16 overflow) and the report said the ranks differ "by up to inf"."""
    ref = torch.tensor([1.0, 2.0, 3.0]).double()
    same = torch.tensor([-math.inf, math.nan, 3.0]).double()
    d = diff(Replicate(), ref, same, 2)
    assert "different values" not in format_output_diff(d, LABEL)
    d.ranks[1] = compare_tensor(
        torch.tensor([-math.inf, 0.0, 3.0]).double(), ref, torch.full_like(ref, 1e-9), 1, lambda i: i
    )
    assert "the ranks hold different values: against rank 0, rank 1 by up to inf" in format_output_diff(
        d, LABEL
    )
    # an inf beside a number is inf apart, not 1.8e+308 (a new user's loss scaler read it as a clamp)
    finite = diff(Replicate(), ref, ref.clone(), 2)
    finite.ranks[1] = compare_tensor(
        torch.tensor([1.0, math.inf, 3.0]).double(), ref, torch.full_like(ref, 1e-9), 1, lambda i: i
    )
    text = format_output_diff(finite, LABEL)
    assert "rank 1 by up to inf" in text and "by up to 1.8e+308" not in text, text


def test_a_replicated_output_whose_ranks_hold_parts_of_the_oracle_says_so():
    """A new user's Partial gradient labelled Replicate: -0.123634 and -0.0000391 on two ranks sum
    to the oracle's -0.123673, and the report said only that the ranks differ."""
    ref = torch.randn(3, 4).double()
    part = torch.rand(3, 4).double()
    d = diff(Replicate(), ref, ref, 2)
    d.ranks = [
        compare_tensor(p, ref, torch.full_like(ref, 1e-9), r, lambda i: i)
        for r, p in enumerate((part, ref - part))
    ]
    hint = "what the ranks hold sums to the oracle, within its tolerance: a partial sum never reduced"
    assert hint in format_output_diff(d, LABEL)
    d.ranks[1] = compare_tensor(ref - 2 * part, ref, torch.full_like(ref, 1e-9), 1, lambda i: i)  # no sum
    text = format_output_diff(d, LABEL)
    assert "the ranks hold different values" in text and hint not in text, text
    # rank 0 right, rank 1 zeros: a broadcast never sent, not parts of a sum (the sum is the oracle)
    d.ranks = [
        compare_tensor(p, ref, torch.full_like(ref, 1e-9), r, lambda i: i)
        for r, p in enumerate((ref.clone(), torch.zeros_like(ref)))
    ]
    text = format_output_diff(d, LABEL)
    assert "the ranks hold different values" in text and hint not in text, text


def copies(layout, ref, values):
    """The OutputDiff of a value split over 2 ranks and copied over 2 more (a mesh (2, 2): copy c
    on world ranks c and c + 2), each copy's ranks holding their pieces of ``values[c]``."""
    ref, shape, bound = ref.double(), tuple(ref.shape), torch.full(ref.shape, 1e-9, dtype=torch.float64)
    rds = {}
    for c, actual in enumerate(values):
        for i, rank in enumerate((c, c + 2)):
            to_global = lambda idx, i=i: layout.global_index(idx, i, 2, shape)
            want = layout.piece(ref, i, 2)
            local = layout.piece(actual.double(), i, 2)
            rds[rank] = compare_tensor(local, want, torch.full_like(want, 1e-9), rank, to_global)
    ranks = [rds[r] for r in sorted(rds)]
    return OutputDiff("y", repr(layout), "float64", shape, ranks, [[0, 2], [1, 3]], ref, bound)


def test_a_split_output_whose_copies_hold_parts_of_the_oracle_says_so():
    """A new user's DTensor output, (Shard(0), Replicate()) on a mesh (2, 2), was a Partial sum over
    the tp axis: its two copies differed and summed to the oracle, and the report gave no hint
    (the same bug on a mesh (2,) got one)."""
    ref = torch.randn(4, 3).double()
    part = torch.rand(4, 3).double()
    text = format_output_diff(copies(Shard(0), ref, [part, ref - part]), LABEL)
    said = "ranks that hold the same elements hold different values: rank 1 against rank 0 by up to"
    assert said in text and "rank 3 against rank 2 by up to" in text, text
    assert (
        "what those ranks hold sums to the oracle, within its tolerance: a partial sum never reduced" in text
    )
    # copies that differ and do not sum to it; a copy right beside zeros (a broadcast missing)
    text = format_output_diff(copies(Shard(0), ref, [part, ref - 2 * part]), LABEL)
    assert "hold different values" in text and "sums to the oracle" not in text, text
    text = format_output_diff(copies(Shard(0), ref, [ref, torch.zeros_like(ref)]), LABEL)
    assert "hold different values" in text and "sums to the oracle" not in text, text
    # copies alike (wrong alike), a NaN or an infinity on both included: nothing said of copies
    alike = ref + 1
    alike[0, 0], alike[1, 1] = math.nan, -math.inf
    text = format_output_diff(copies(Shard(0), ref, [alike, alike.clone()]), LABEL)
    assert "hold different values" not in text, text


@pytest.mark.parametrize("parts", [2, 3])
def test_a_replicated_output_reduced_once_too_often_says_so(parts):
    """A new user's LayerNorm gradients all-reduced again after DTensor had reduced them: every
    element exactly 2x the oracle on 2 ranks, and the report gave no hint; a mean taken twice is
    1/N of it. Another factor, or ranks that differ, say neither."""
    ref = torch.randn(3, 4).double() + 0.5
    twice = format_output_diff(diff(Replicate(), ref, parts * ref, parts), LABEL)
    assert (
        f"every rank holds {parts} times the oracle, within its tolerance scaled alike: as if reduced once too often"
        in twice
    )
    halved = format_output_diff(diff(Replicate(), ref, ref / parts, parts), LABEL)
    assert f"every rank holds 1/{parts} of the oracle" in halved and "divided by the group size" in halved
    for other in (ref * (parts + 1), ref + 1):
        text = format_output_diff(diff(Replicate(), ref, other, parts), LABEL)
        assert "every rank holds" in text and "times the oracle" not in text and "of the oracle" not in text
    assert "every rank holds" not in format_output_diff(diff(Shard(0), ref, parts * ref, parts), LABEL)


@pytest.mark.parametrize("parts", [2, 3])
def test_a_sharded_output_off_by_the_group_size_says_so(parts):
    """A new user's k and v gradients all-reduced and averaged where a reduce-scatter's sum was due:
    every element exactly 1/2 of the oracle over 2 ranks, and the report said only "greatest
    relative difference: 0.5". Another factor, or an offset, says neither."""
    ref = torch.randn(6, 4).double() + 0.5
    halved = format_output_diff(diff(Shard(0), ref, ref / parts, parts), LABEL)
    assert (
        f"the ranks' pieces, put together, are 1/{parts} of the oracle (group of {parts}), within its "
        "tolerance scaled alike: as if a mean where a sum was due"
    ) in halved, halved
    twice = format_output_diff(diff(Shard(0), ref, parts * ref, parts), LABEL)
    assert f"are {parts} times the oracle (group of {parts})" in twice, twice
    for other in (ref * (parts + 1), ref + 1):
        text = format_output_diff(diff(Shard(0), ref, other, parts), LABEL)
        assert "put together" not in text, text


def test_a_factor_is_said_only_where_it_explains_the_wrong_elements():
    """A new user's pipeline received into a buffer of the wrong dtype: under a wide bf16 bound,
    rank 0's small element was right and rank 1's 2.53x the oracle, and the report said "2 times
    the oracle ... as if a sum where a mean was due" (0.053 off twice the oracle, within twice the
    bound, but that is a third of its error). Exactly twice it still says so."""
    ref = torch.tensor([-0.004, -0.1004])
    text = format_output_diff(diff(Shard(0), ref, torch.tensor([-0.0045, -0.2539]), 2, tol=0.03), LABEL)
    assert "rank 1" in text and "times the oracle" not in text, text
    text = format_output_diff(diff(Shard(0), ref, torch.tensor([-0.0045, -0.2009]), 2, tol=0.03), LABEL)
    assert "are 2 times the oracle (group of 2)" in text, text
    rep = diff(Replicate(), ref, torch.tensor([-0.0045, -0.2539]), 2, tol=0.03)
    assert "times the oracle" not in format_output_diff(rep, LABEL)


def test_a_replicated_output_reduced_over_the_world_where_the_group_was_due_says_so():
    """A new user's all_reduce on dist.group.WORLD in place of the TP group, on a mesh (2, 1): every
    rank held exactly 2x the oracle, and the report gave no hint (its groups have one rank each)."""
    ref = torch.randn(3, 4).double() + 0.5
    d = diff(Replicate(), ref, 2 * ref, 2)
    d.groups = [[0], [1]]  # two replicas of a group of one rank
    text = format_output_diff(d, LABEL)
    assert (
        "every rank holds 2 times the oracle (the world's size, 2, where the group has 1 rank), within "
        "its tolerance scaled alike: as if reduced over the world where the group was due"
    ) in text, text
    d.groups = [[0, 1]]  # the world is the group: said as the group's factor
    text = format_output_diff(d, LABEL)
    assert "every rank holds 2 times the oracle, within" in text and "world's size" not in text, text
    d = diff(Replicate(), ref, 3 * ref, 2)
    d.groups = [[0], [1]]
    assert "times the oracle" not in format_output_diff(d, LABEL)


def test_a_replicated_output_wrong_on_different_elements_per_rank_says_on_which_rank():
    """Rank 0's copy wrong at index 1, rank 1's at index 0: half the elements are wrong, and every
    global element on some rank (a new user read "every element of the global value is wrong"
    beside 50% wrong as a contradiction)."""
    ref = torch.randn(2)
    d = diff(Replicate(), ref, ref, 2)
    for r, bad_at in ((0, 1), (1, 0)):
        mine = ref.clone()
        mine[bad_at] += 1
        d.ranks[r] = compare_tensor(mine.double(), ref.double(), torch.full((2,), 1e-9), r, lambda i: i)
    text = format_output_diff(d, LABEL)
    assert "(every element of the global value is wrong on at least one rank: no grid)" in text, text
    sharded = format_output_diff(diff(Shard(0), ref, ref + 1, 2), LABEL)
    assert "(every element of the global value is wrong: no grid)" in sharded, sharded


def test_a_zigzag_piece_maps_to_its_two_chunks():
    ref = torch.randn(8, 3)
    bad = ref.clone()
    bad[6] += 1  # chunks of 2: rank 0 holds global 0-1 and 6-7, so global 6 is its local 2
    text = format_output_diff(diff(Zigzag(0), ref, bad, 2), LABEL)
    assert "    rank 0: wrong at dim 0: index 2 of 4 [global 6]" in text and "    clean: rank 1" in text
    assert grid_of(text) == ["..."] * 2 + ["---"] + ["..."] * 4 + ["---"] + ["###", "..."]


def test_a_partial_output_blames_no_rank():
    ref = torch.randn(4, 4)
    bad = ref.clone()
    bad[:, 1] += 1
    text = format_output_diff(diff(Partial(), ref, bad, 2), LABEL)
    assert "the sum over ranks is compared (Partial()): no one rank holds these elements" in text
    assert "    sum: wrong at dim 1: index 1 of 4" in text
    assert grid_of(text) == [".#.."] * 4


@pytest.mark.timing
def test_a_big_tensor_gets_a_small_grid_aligned_to_its_shards(slack):
    ref = torch.zeros(1000, 3000)
    bad = ref.clone()
    bad[100:200, 2300:2400] = 1  # inside rank 3's columns (2250-2999)
    start = time.perf_counter()
    text = format_output_diff(diff(Shard(1), ref, bad, 4), LABEL)
    assert time.perf_counter() - start < 5 * slack
    assert (
        "    rank 3: wrong at dim 0: indices 100-199 of 1000; dim 1: indices 50-149 of 750 [global 2300-2399]"
        in text
    )
    assert "    clean: ranks 0, 1, 2" in text
    grid = grid_of(text)
    assert len(grid) <= MAX_ROWS and all(len(line) <= MAX_COLS for line in grid)
    assert all(line.count("|") == 3 for line in grid)  # the three boundaries between four shards
    hit = [i for i, line in enumerate(grid) if "#" in line]
    assert hit and all("#" not in line.rsplit("|", 1)[0] for line in grid)  # only rank 3's cells
    assert len(map_lines(text)) < 25


def test_cells_never_straddle_a_cut():
    out, seps = cells(100, [10, 55], 16)
    assert len(out) + len(seps) <= 16
    assert {a for a, _ in out} >= {0, 10, 55} and out[-1][1] == 100
    assert seps == {i for i, (_, b) in enumerate(out) if b in (10, 55)}
    even, none = cells(100, list(range(1, 100)), 16)  # more pieces than fit: even cells, no lines
    assert len(even) == 16 and not none


# -- the planted bugs: the map points at the shard each one corrupts --------------------------


def _mismatch(target, bug, case):
    with pytest.raises(Mismatch) as info:
        Runner(target, bug).run_case(case)
    return info.value


def _output_block(report, name):
    return report.split(f"output {name!r}", 1)[1].split("\noutput '", 1)[0]


def _map_of(report, name):
    """rank -> its map line, and the clean ranks, of one output's map."""
    lines = map_lines(_output_block(report, name))[1:]
    wrong = {int(m[1]): m[2] for line in lines if (m := re.match(r"    rank (\d+): wrong at (.*)", line))}
    clean = next((line for line in lines if line.startswith("    clean: ")), "")
    return wrong, [int(r) for r in re.findall(r"\d+", clean)]


def _ring(variant, seq):
    return Case(
        target="ring_attention", world_size=2, mesh=(2,), sizes={"batch": 1, "seq": seq, "heads": 1, "head_dim": 2},
        split=("seq",), options={"variant": variant, "lse_grad": True, "logit_scale": 1.0},
    )  # fmt: skip


def test_map_of_ring_causal_every_step_names_rank_1_row_0():
    # seq 4 on 2 ranks: the causal mask wrongly applied to rank 0's block hides its key 1 from
    # rank 1's local query 0 (global 2); rank 1's query 1 sees both keys, rank 0 never uses the block
    e = _mismatch("ring_attention", "causal_every_step", _ring("causal", 4))
    for name, dim in (("out", 1), ("grad_q", 1), ("lse", 2)):
        wrong, clean = _map_of(e.report, name)
        assert clean == [0] and list(wrong) == [1], e.report
        assert wrong[1] == f"dim {dim}: index 0 of 2 [global 2]", e.report


def test_map_of_ulysses_local_rope_positions_spares_rank_0():
    # RoPE at local positions: rank 0's positions are right, and under causal attention its
    # queries see only its own keys
    case = Case(
        target="ulysses", world_size=2, mesh=(2,), sizes={"batch": 1, "seq": 4, "kv_heads": 1, "q_per_kv": 1, "head_dim": 2},
        split=("seq",), options={"causal": True},
    )  # fmt: skip
    e = _mismatch("ulysses", "local_rope_positions", case)
    wrong, clean = _map_of(e.report, "out")
    assert clean == [0] and wrong == {1: "dim 1: all 2 [global 2-3]"}, e.report


def test_map_of_vocab_embedding_no_offset_names_the_second_vocab_shard():
    # ids not shifted by the rank's vocab offset: rank 0 (offset 0) is right, rank 1's rows are not
    case = Case(
        target="vocab_parallel", world_size=2, mesh=(2,), sizes={"batch": 1, "seq": 2, "d_model": 2, "vocab": 4},
        split=("vocab",), options={"smoothing": 0.0, "rule": "dtensor", "class_weight": False,
                                   "ignore_index": False, "reduction": "mean"},
    )  # fmt: skip
    e = _mismatch("vocab_parallel", "embedding_no_offset", case)
    wrong, clean = _map_of(e.report, "grad_emb")
    assert clean == [0] and list(wrong) == [1] and "[global 2-3]" in wrong[1], e.report
    assert "grid, rows dim 0 (4) x cols dim 1 (2)" in _output_block(e.report, "grad_emb")


def test_map_of_moe_expert_id_no_offset_stays_on_the_second_ranks_experts():
    # experts matched by global id on rank 1 (experts 2-3); rank 0 (experts 0-1) is right
    case = Case(
        target="moe", world_size=2, mesh=(2,), sizes={"tokens": 4, "experts": 4, "d_model": 2, "hidden": 2},
        split=("tokens", "experts"), options={"top_k": 1, "capacity_factor": None, "empty_experts": 0},
    )  # fmt: skip
    e = _mismatch("moe", "expert_id_no_offset", case)
    for name in ("grad_w1", "grad_w2"):
        wrong, clean = _map_of(e.report, name)
        assert clean == [0] and list(wrong) == [1], e.report
        rows = re.match(r"dim 0: .* \[global ([\d, -]+)\]", wrong[1])
        assert rows and set(re.findall(r"\d", rows[1])) <= {"2", "3"}, e.report


def test_map_of_tp_mlp_missing_f_backward_is_on_every_replica():
    # the input gradient is Replicate and never all-reduced: every rank's copy is wrong
    case = Case(
        target="tp_mlp", world_size=2, mesh=(2,), sizes={"batch": 1, "seq": 2, "d_model": 2, "hidden": 2, "d_out": 2},
        split=("hidden",),
    )  # fmt: skip
    e = _mismatch("tp_mlp", "missing_f_backward", case)
    block = _output_block(e.report, "grad_x")
    assert "every rank holds the whole value (Replicate())" in block
    wrong, clean = _map_of(e.report, "grad_x")
    assert clean == [] and sorted(wrong) == [0, 1], e.report
    assert len(e.diffs) == 1 and e.diffs[0].name == "grad_x"
    again = pickle.loads(pickle.dumps(e))  # the values for --plot stay in this process
    assert again.report == e.report and again.outputs == e.outputs and again.diffs == []


def test_case_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    case = repr(_ring("causal", 4))
    png = tmp_path / "ring.png"
    out = run_cli("case", "ring_attention", case, "--impl", "causal_every_step", "--plot", png)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"plot of out, lse, grad_q, grad_k, grad_v: {png}" in out.stdout
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 500 and im.size[1] > 5 * 200
    bad = run_cli("case", "ring_attention", case, "--plot-output", "lse")
    assert bad.returncode == 2 and "--plot-output 'lse' needs --plot FILE.png" in bad.stderr
    nowhere = run_cli("case", "ring_attention", case, "--plot", tmp_path / "no" / "x.png")
    assert nowhere.returncode == 2 and "does not exist" in nowhere.stderr


def test_a_plot_of_a_dim_of_one_element_has_integer_ticks(tmp_path, monkeypatch):
    """A new user's plot of a [1, 4] output put ticks at -0.5, 0 and 0.5 on its one-element dim."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from shardfuzz.report.plot import plot_mismatch

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    ref = torch.randn(1, 4).double()
    plot_mismatch([diff(Shard(1), ref, ref + 1, 2)], str(tmp_path / "x.png"))
    (fig,) = drawn
    for ax in fig.axes[:3]:  # the oracle, the result, the error (their colour bars follow)
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[1] <= t <= ax.get_ylim()[0]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_plot_draws_the_chosen_output_only(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from shardfuzz.errors import InvalidArgument
    from shardfuzz.report.plot import plot_mismatch

    ref = torch.randn(6)
    a, b = diff(Shard(0), ref, ref + 1, 2), diff(Zigzag(0), ref, ref, 2)
    b.name = "z"
    assert plot_mismatch([a, b], str(tmp_path / "z.png"), "z") == ["z"]
    with Image.open(tmp_path / "z.png") as im:
        assert im.format == "PNG" and im.size[1] < 400  # one row of panels
    with pytest.raises(
        InvalidArgument,
        match=r"--plot-output 'w' is not a mismatching output of this case; they are \['y', 'z'\]",
    ):
        plot_mismatch([a, b], str(tmp_path / "w.png"), "w")


def test_case_plot_without_matplotlib_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib fails
    out = run_cli("case", "ring_attention", repr(_ring("causal", 4)), "--plot", "x.png")
    assert out.returncode == 2 and 'pip install "shardfuzz[plot]"' in out.stderr, out.stderr


def test_an_empty_piece_and_a_group_of_one():
    ref = torch.randn(1)
    text = format_output_diff(diff(PaddedFlat(), ref, ref + 1, 2), LABEL)  # rank 1 holds only padding
    assert "    rank 0: wrong at dim 0: all 1 [global 0]" in text and "    clean: rank 1 (empty)" in text
    ref = torch.randn(3, 2)
    text = format_output_diff(diff(Shard(0), ref, ref + 1, 1), LABEL)
    assert "the one rank holds the whole value (Shard(0)); indices are global" in text
    # three replicas of a group of one (mesh (3, 1)): each rank holds it, not "one rank" (a new
    # user read "one rank holds the whole value (Replicate())" as contradicting Replicate)
    d = diff(Replicate(), ref, ref + 1, 1)
    d.ranks = [dataclasses.replace(d.ranks[0], rank=r) for r in range(3)]
    d.groups = [[0], [1], [2]]
    text = format_output_diff(d, LABEL)
    assert "each rank holds the whole value (Replicate()); indices are global" in text, text
    # an owner layout on groups of two: one rank of each holds it
    d.groups = [[0, 3], [1, 4], [2, 5]]
    assert "one rank holds the whole value" in format_output_diff(d, LABEL)


def test_a_partial_outputs_compared_value_is_named_by_its_reduction():
    from shardfuzz.report.mismatch_map import assembled

    assert assembled("Partial()") == "the sum over ranks"
    assert assembled("DTensor(Partial(max)) on mesh (2,)") == "the max over ranks"
    assert assembled("DTensor(Partial(min)) on mesh (2,)") == "the min over ranks"
    assert assembled("DTensor(Partial(avg)) on mesh (2,)") == "the mean over ranks"
    assert (
        assembled("DTensor(_NormPartial(reduce_op=sum, norm_type=2)) on mesh (2,)") == "the norm over ranks"
    )


def test_an_exact_output_counts_its_wrong_elements_and_shows_them():
    """An integer output (an argmax over vocab shards) is compared element by element: one wrong
    index of two is 1 / 2, its difference is its own (not a tolerance ratio) and the report shows
    the element with what the oracle has there."""
    from shardfuzz.verdict.compare import compare_exact

    ref = torch.tensor([0, 2, 5])
    got = torch.tensor([0, 1, 5])
    rds = [compare_exact(r, got, ref, lambda idx: idx, "got") for r in range(2)]
    assert [(rd.n, rd.bad, rd.max_abs, rd.max_abs_at) for rd in rds] == [(3, 1, 1.0, (1,))] * 2
    od = OutputDiff("index", "Replicate()", "int64", (3,), rds, [[0, 1]], ref, None)
    text = format_output_diff(od, LABEL)
    assert "mismatched elements: 2 / 6 of the ranks' copies (33.3%), on 2 of 2 ranks" in text, text
    # both ranks hold the same wrong copy: told once, for both
    assert "ranks 0, 1 (the same on each): 1 / 3 elements wrong: got [0, 1, 5], expected [0, 2, 5]" in text
    assert text.count("greatest difference: 1 at index (1,) (compared exactly)") == 1, text
    assert "      [1]: 1 vs expected 2" in text, text
    assert "tolerance" not in text and "inf" not in text, text
    # a rank whose copy is wrong otherwise has its own account, and a clean rank its own line
    other = compare_exact(1, torch.tensor([0, 2, 4]), ref, lambda idx: idx, "got")
    clean = compare_exact(2, ref.clone(), ref, lambda idx: idx, "got")
    again = compare_exact(3, got, ref, lambda idx: idx, "got")
    od = OutputDiff(
        "index", "Replicate()", "int64", (3,), [rds[0], other, clean, again], [[0, 1, 2, 3]], ref, None
    )
    text = format_output_diff(od, LABEL)
    assert "ranks 0, 3 (the same on each): 1 / 3 elements wrong: got [0, 1, 5]" in text, text
    assert "rank 1: 1 / 3 elements wrong: got [0, 2, 4]" in text and "rank 2: ok" in text, text
    assert text.count("greatest difference") == 2, text
    right = compare_exact(0, ref, ref, lambda idx: idx, "got")
    assert (right.n, right.bad, right.max_ratio) == (3, 0, 0.0)
    other_shape = compare_exact(0, ref[:2], ref, lambda idx: idx, "got")
    assert (other_shape.n, other_shape.bad) == (1, 1)  # not comparable element by element: one value


def test_a_difference_where_the_oracle_has_0_is_an_infinite_relative_difference():
    """The relative difference where the expected value is 0 is infinite, said as such (a clamp
    printed "greatest relative difference: 1.25437e+299" beside "0.125437 vs expected 0")."""
    from shardfuzz.verdict.compare import compare_tensor

    expected = torch.tensor([[1.0, 2.0], [0.0, 4.0]])
    actual = torch.tensor([[1.0, 2.5], [0.125, 4.0]])
    rd = compare_tensor(actual, expected, torch.full((2, 2), 1e-3), 0, lambda idx: idx)
    assert (rd.bad, rd.max_rel, rd.max_rel_at, rd.max_rel_expected) == (2, math.inf, (1, 0), 0.0)
    od = OutputDiff("y", "Replicate()", "float32", (2, 2), [rd], [[0]], expected, torch.full((2, 2), 1e-3))
    text = format_output_diff(od, LABEL)
    assert "greatest relative difference: inf at index (1, 0) (expected 0 there)" in text, text
    nonzero = compare_tensor(actual[0], expected[0], torch.full((2,), 1e-3), 0, lambda idx: idx)
    assert (nonzero.max_rel, nonzero.max_rel_at) == (0.25, (1,))  # 0.5 off an expected 2
