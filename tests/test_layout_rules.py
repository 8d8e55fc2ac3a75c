"""Every layout of :mod:`shardfuzz.spec.layouts` round-trips over sizes 0-20 and 1-5 parts: the pieces a
rank must hold have the local shape the layout declares, every element of a piece maps back to its
global index, and the pieces assemble into the value again."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuzz import Owned, PaddedFlat, Partial, Replicate, Shard
from shardfuzz.spec.layouts import SPLIT_RULES, Zigzag, split_offsets, split_sizes

SIZES, PARTS = st.integers(0, 20), st.integers(1, 5)
PER_RANK = [Shard(0), Shard(1), Shard(-1), Shard(0, rule="tensor_split"), Shard(1, rule="tensor_split")]
PER_RANK += [Replicate(), Zigzag(0), Zigzag(1), PaddedFlat()]


def _value(layout, n):
    """A value whose every element is distinct; the sharded dim has length ``n``."""
    if isinstance(layout, PaddedFlat):
        return torch.arange(n)
    dim = getattr(layout, "dim", 0) % 2
    return torch.arange(3 * n).view((n, 3) if dim == 0 else (3, n))


@pytest.mark.parametrize("rule", SPLIT_RULES)
@settings(max_examples=40, deadline=None)
@given(n=SIZES, parts=PARTS)
def test_split_rules_cover_the_dim_in_order(rule, n, parts):
    sizes, offsets = split_sizes(n, parts, rule), split_offsets(n, parts, rule)
    assert len(sizes) == parts and sum(sizes) == n and min(sizes) >= 0
    assert offsets == [sum(sizes[:i]) for i in range(parts)]
    if rule == "tensor_split":
        assert sizes == [len(t) for t in torch.tensor_split(torch.arange(n), parts)]


@pytest.mark.parametrize("layout", PER_RANK, ids=repr)
@settings(max_examples=40, deadline=None)
@given(n=SIZES, parts=PARTS)
def test_per_rank_layout_round_trips(layout, n, parts):
    x = _value(layout, n)
    shape = tuple(x.shape)
    locals_ = []
    for r in range(parts):
        piece = layout.piece(x, r, parts)
        local_shape = layout.local_shape(shape, r, parts)
        local = torch.zeros(local_shape, dtype=x.dtype)  # padding, if the layout has any, stays 0
        local[tuple(slice(0, k) for k in piece.shape)] = piece
        locals_.append(local)
        assert layout.expected_shape(local_shape, shape, r, parts) == local_shape
        compared = layout.comparable(local, r, parts, shape)
        assert torch.equal(compared, piece), (r, compared, piece)
        for idx in map(tuple, torch.nonzero(torch.ones_like(compared)).tolist()):
            assert x[layout.global_index(idx, r, parts, shape)] == compared[idx], (r, idx)
    whole = layout.assemble(locals_)
    assert torch.equal(whole[:n] if isinstance(layout, PaddedFlat) else whole, x)


@settings(max_examples=40, deadline=None)
@given(n=SIZES, parts=PARTS, data=st.data())
def test_partial_sums_and_owned_has_one_owner(n, parts, data):
    x = torch.arange(3 * n, dtype=torch.float64).view(n, 3)
    cut = data.draw(st.integers(0, parts - 1))
    partials = [x * (1.0 if r == cut else 0.0) for r in range(parts)]
    assert torch.equal(Partial().assemble(partials), x)
    owned = [x if r == cut else torch.zeros(0, dtype=x.dtype) for r in range(parts)]
    shapes = [tuple(t.shape) for t in owned]
    if n:  # an empty value has no owner to tell apart from the others
        assert (
            Owned().owner_of(shapes, tuple(x.shape)) == cut and Owned().check_group(shapes, x.shape) is None
        )
        assert torch.equal(Owned().assemble(owned), x)
        if parts > 1:
            two = [tuple(x.shape)] * 2 + shapes[2:]
            assert Owned().check_group(two, tuple(x.shape)) is not None
