import pytest
import torch

from shardfuzz import InvalidArgument, PaddedFlat, Partial, Replicate, Shard
from shardfuzz.spec.layouts import split_sizes


def test_split_rules_disagree_on_uneven_sizes():
    # 5 rows on 4 ranks: DTensor's chunk rule against torch.tensor_split
    assert split_sizes(5, 4, "dtensor") == [2, 2, 1, 0]
    assert split_sizes(5, 4, "tensor_split") == [2, 1, 1, 1]
    assert [t.shape[0] for t in torch.tensor_split(torch.arange(5), 4)] == [2, 1, 1, 1]


def test_dtensor_rule_matches_dtensor():
    from torch.distributed.tensor.placement_types import Shard as DShard

    for n in range(0, 9):
        for parts in range(1, 5):
            pieces, _ = DShard(0)._split_tensor(torch.arange(n), parts, with_padding=False)
            assert [p.shape[0] for p in pieces] == split_sizes(n, parts, "dtensor"), (n, parts)


@pytest.mark.parametrize("rule", ["dtensor", "tensor_split"])
@pytest.mark.parametrize("n,parts", [(5, 4), (4, 3), (1, 2), (6, 3), (0, 2)])
def test_shard_pieces_assemble_back(rule, n, parts):
    x = torch.arange(n * 2).view(n, 2).T.contiguous()  # shard dim 1
    layout = Shard(1, rule=rule)
    pieces = [layout.piece(x, r, parts) for r in range(parts)]
    assert [tuple(p.shape) for p in pieces] == [
        layout.local_shape(tuple(x.shape), r, parts) for r in range(parts)
    ]
    assert torch.equal(layout.assemble(pieces), x)
    # global index of the first element of each non-empty shard
    offsets = [sum(split_sizes(n, parts, rule)[:r]) for r in range(parts)]
    for r in range(parts):
        assert layout.global_index((0, 0), r, parts, tuple(x.shape)) == (0, offsets[r])


def test_replicate_and_partial():
    x = torch.randn(3)
    assert Replicate().piece(x, 1, 2) is x
    assert torch.allclose(Partial().assemble([x, 2 * x]), 3 * x.double())
    assert not Partial().per_rank


def test_padded_flat_padding_is_not_compared():
    layout = PaddedFlat()
    assert layout.local_shape((5,), 0, 4) == (2,)
    assert [layout.piece(torch.arange(5), r, 4).tolist() for r in range(4)] == [[0, 1], [2, 3], [4], []]
    padded_last = torch.tensor([4, 999])
    assert layout.comparable(padded_last, 2, 4, (5,)).tolist() == [4]
    assert layout.global_index((0,), 2, 4, (5,)) == (4,)


def test_bad_layout_arguments_name_the_argument():
    with pytest.raises(InvalidArgument, match="rule='chunk'"):
        Shard(0, rule="chunk")
    with pytest.raises(InvalidArgument, match="dim=3 is out of range"):
        Shard(3).local_shape((2, 2), 0, 2)
    with pytest.raises(InvalidArgument, match="rule='bogus'"):
        split_sizes(3, 2, "bogus")


@pytest.mark.parametrize("n,parts", [(8, 2), (7, 2), (12, 3), (5, 3), (3, 2)])
def test_zigzag_gives_each_rank_an_early_and_a_late_chunk(n, parts):
    from shardfuzz import Zigzag

    x = torch.arange(n)
    layout = Zigzag(0)
    pieces = [layout.piece(x, r, parts) for r in range(parts)]
    assert torch.equal(layout.assemble(pieces), x)
    chunks = torch.tensor_split(x, 2 * parts)
    for r, p in enumerate(pieces):
        assert p.tolist() == chunks[r].tolist() + chunks[2 * parts - 1 - r].tolist()
        assert layout.local_shape((n,), r, parts) == tuple(p.shape)
        for i in range(p.shape[0]):
            assert x[layout.global_index((i,), r, parts, (n,))] == p[i]


def test_zigzag_8_on_2():
    from shardfuzz import Zigzag

    assert Zigzag(0).piece(torch.arange(8), 0, 2).tolist() == [0, 1, 6, 7]
    assert Zigzag(0).piece(torch.arange(8), 1, 2).tolist() == [2, 3, 4, 5]


def test_owned_with_a_rank_needs_that_rank_to_own():
    """A new user's pipeline with tied embeddings: the first stage's copy of the shared weight's
    gradient returned by the last stage passed as Owned(), which any one rank may hold."""
    from shardfuzz import InvalidArgument, Owned

    first, last = Owned(rank=0), Owned(rank=-1)
    assert first.check_group([(3,), (0,), (0,)], (3,)) is None
    assert last.check_group([(0,), (0,), (3,)], (3,)) is None
    assert last.check_group([(3,)], (3,)) is None  # one stage: first and last
    said = first.check_group([(0,), (0,), (3,)], (3,))
    assert said == "group rank 0 (Owned(rank=0)) must hold [3]; group rank 2 holds it", said
    assert "exactly one rank" in last.check_group([(3,), (0,), (3,)], (3,))
    assert "does not have" in Owned(rank=3).check_group([(3,), (0,)], (3,))
    assert repr(last) == "Owned(rank=-1)" and repr(Owned()) == "Owned()"
    for bad in ("last", 1.0, True):
        with pytest.raises(InvalidArgument, match="Owned\\(rank="):
            Owned(rank=bad)


def test_owned_needs_exactly_one_owner():
    from shardfuzz import Owned

    layout = Owned()
    assert layout.owner_of([(0,), (3, 2), (0,)], (3, 2)) == 1
    assert layout.owner_of([(3, 2), (3, 2)], (3, 2)) is None
    assert layout.owner_of([(0,), (0,)], (3, 2)) is None
    assert layout.owner_of([(0,), (2, 2)], (3, 2)) is None
    x = torch.ones(3, 2)
    assert layout.assemble([torch.empty(0), x]) is x
    assert layout.expected_shape((0,), (3, 2), 0, 2) == (0,) and layout.expected_shape(
        (2, 2), (3, 2), 0, 2
    ) == (3, 2)
    assert not layout.holds_piece((0,), (3, 2)) and layout.holds_piece((3, 2), (3, 2))
    assert layout.check_group([(3, 2), (3, 2)], (3, 2)).startswith("exactly one rank must hold [3, 2]")
    assert layout.check_group([(0,), (3, 2)], (3, 2)) is None


@pytest.mark.parametrize(
    "impl, said",
    [
        # None from a non-owner read as "a gradient never computed ... something cut the graph"
        ("none_elsewhere", "returned None; Owned(rank=-1) wants the oracle's global value [] on its owner and an empty tensor, torch.empty(0), on every other rank"),
        # a 0-d zero: said only as shapes
        ("zero_elsewhere", "exactly one rank must hold [] and the others [0] (torch.empty(0): a rank that does not own it)"),
        # the owner's None is a value never computed, not "not mine"
        ("none_on_the_owner", "returned None, expected a tensor (the oracle's global value is [] float32) (None: never computed)"),
    ],
)  # fmt: skip
def test_a_non_owner_that_returns_no_empty_tensor_is_told_what_to_return(impl, said):
    """A new user's pipeline returned its loss as None (or a 0-d zero) on the stages that do not
    own it; the reports spoke of a cut graph, or of shapes alone."""
    import os

    import shardfuzz

    target = os.path.join(os.path.dirname(__file__), "data", "owned_target.py")
    result = shardfuzz.run(target, impl, profile="shardfuzz-ci", database=None, max_examples=20)
    assert result.found and result.kind == "layout", result.report
    assert said in result.report, result.report
    assert ("cut the graph" in result.report) == (impl == "none_on_the_owner"), result.report


def test_stepwise_padded_flat_layout():
    """5 elements on 4 ranks: chunks of 2, real elements [2, 2, 1, 0], padding never compared."""
    from shardfuzz.targets.zero_adamw import StepwisePaddedFlat

    layout = StepwisePaddedFlat()
    value = torch.arange(10.0).view(2, 5)
    assert [layout.local_shape((2, 5), r, 4) for r in range(4)] == [(2, 2)] * 4
    assert [layout.piece(value, r, 4).shape[1] for r in range(4)] == [2, 2, 1, 0]
    local = torch.tensor([[4.0, float("nan")], [9.0, float("nan")]])
    assert torch.equal(layout.comparable(local, 2, 4, (2, 5)), layout.piece(value, 2, 4))
    assert layout.global_index((1, 0), 2, 4, (2, 5)) == (1, 4)
    assert layout.assemble([torch.zeros(2, 2)] * 4).shape == (2, 8)


@pytest.mark.parametrize("rule", ["dtensor", "tensor_split"])
@pytest.mark.parametrize("blocks,m,parts", [(2, 3, 2), (3, 4, 3), (2, 5, 4), (2, 1, 3), (3, 2, 1)])
def test_a_fused_shard_gives_each_rank_its_shard_of_every_block(rule, blocks, m, parts):
    """Shard(0, blocks=k): a fused [gate; up] (or [q; k; v]) weight whose blocks are each split over
    the ranks, as Megatron's fused projections hold them; not a plain Shard(0) of the whole."""
    x = torch.arange(blocks * m * 2).view(blocks * m, 2)
    layout = Shard(0, rule=rule, blocks=blocks)
    sizes, offsets = split_sizes(m, parts, rule), [sum(split_sizes(m, parts, rule)[:r]) for r in range(parts)]
    pieces = [layout.piece(x, r, parts) for r in range(parts)]
    for r, p in enumerate(pieces):
        want = torch.cat([x[b * m + offsets[r] : b * m + offsets[r] + sizes[r]] for b in range(blocks)])
        assert torch.equal(p, want), (r, p, want)
        assert layout.local_shape(tuple(x.shape), r, parts) == tuple(p.shape)
        for i in range(p.shape[0]):  # every local row maps back to where it came from
            (g, _) = layout.global_index((i, 0), r, parts, tuple(x.shape))
            assert torch.equal(x[g], p[i]), (r, i, g)
    assert torch.equal(layout.assemble(pieces), x)


def test_a_fused_shard_is_not_a_plain_one_and_says_what_it_needs():
    x = torch.arange(8)  # [gate 0..3; up 4..7] on 2 ranks
    assert Shard(0, blocks=2).piece(x, 0, 2).tolist() == [0, 1, 4, 5]
    assert Shard(0).piece(x, 0, 2).tolist() == [0, 1, 2, 3]  # the naive chunk: gate rows only
    assert repr(Shard(0, blocks=2)) == "Shard(0, blocks=2)"
    assert repr(Shard(1, rule="tensor_split", blocks=3)) == "Shard(1, rule='tensor_split', blocks=3)"
    with pytest.raises(InvalidArgument, match="size 7, not a multiple of blocks=2"):
        Shard(0, blocks=2).local_shape((7,), 0, 2)
    for bad in (0, 1.5, True):
        with pytest.raises(InvalidArgument, match=r"blocks=.*must be an int >= 1"):
            Shard(0, blocks=bad)


def test_a_fused_layout_that_cannot_lay_out_an_output_names_the_output():
    from shardfuzz.case import Case
    from shardfuzz.verdict.judge import check_layouts
    from shardfuzz.verdict.oracle import Expected

    case = Case(target="t", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
    ref = {"y": torch.zeros(3, 2, dtype=torch.float64)}
    expected = Expected(ref=ref, low={"y": torch.zeros(3, 2)}, mag={}, inputs={})
    locals_ = [{"y": torch.zeros(2, 2)}, {"y": torch.zeros(1, 2)}]
    with pytest.raises(InvalidArgument, match=r"^output 'y': Shard\(0, blocks=2\): dim 0 has size 3"):
        check_layouts(case, {"y": Shard(0, blocks=2)}, locals_, expected)
