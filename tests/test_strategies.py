"""Strategies: pinned minimal examples, clear bound errors, and reach of every trigger condition."""

import math

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Case, InvalidArgument

FIND = settings(max_examples=3000, database=None, deadline=None)


def minimal(strategy, condition=lambda x: True):
    return find(strategy, condition, settings=FIND)


# -- what each strategy shrinks toward ----------------------------------------------------------
def test_world_sizes_shrink_to_min_and_reach_3():
    assert minimal(sst.world_sizes()) == 1
    assert minimal(sst.world_sizes(min_size=2)) == 2
    assert minimal(sst.world_sizes(), lambda w: w >= 3) == 3


def test_meshes_shrink_to_1d_and_reach_2d():
    assert minimal(sst.meshes()) == (1,)
    assert minimal(sst.meshes(min_world=3)) == (3,)
    assert minimal(sst.meshes(), lambda m: math.prod(m[:-1]) > 1) == (2, 1)  # group smaller than world
    assert minimal(sst.meshes(), lambda m: len(m) == 2 and min(m) > 1) == (2, 2)  # dp x tp


def test_sharded_sizes_shrink_even_then_uneven_never_empty_without_flag():
    assert minimal(sst.sharded_sizes(3)) == 3
    assert minimal(sst.sharded_sizes(3), lambda n: n % 3) == 4
    assert minimal(sst.sharded_sizes(3, sst.Split(allow_empty=True, min_per_rank=0)), lambda n: n < 3) == 1


def test_min_size_raises_the_global_size_and_keeps_empty_shards_reachable():
    spec = sst.Split(allow_empty=True, min_per_rank=0, min_size=2)
    assert minimal(sst.sharded_sizes(1, spec)) == 2
    assert minimal(sst.sharded_sizes(3, spec), lambda n: n < 3) == 2  # [1, 1, 0]: a rank still empty


def test_mostly_draws_the_common_value_mostly_and_shrinks_to_it():
    assert minimal(sst.mostly(1.0, 30.0, 100.0)) == 1.0
    assert minimal(sst.mostly(1.0, 30.0, 100.0), lambda v: v > 1) == 30.0
    assert minimal(sst.mostly(1.0, 30.0, 100.0), lambda v: v > 30) == 100.0
    # the share over every value of the uniform draw behind it (a derandomized example() would not vary)
    values = [sst._mostly_value("a", ("b", "c"), 900, i) for i in range(1000)]
    assert values.count("a") == 900 and values.count("b") == values.count("c") == 50


@given(st.integers(1, 4).flatmap(lambda p: st.tuples(st.just(p), sst.sharded_sizes(p))))
def test_no_empty_global_size_and_no_fewer_rows_than_ranks_without_flag(pn):
    parts, n = pn
    assert n >= parts


def test_split_dims_shrink_to_dim_0_and_reach_the_last():
    assert minimal(sst.split_dims(3)) == 0
    assert minimal(sst.split_dims(3), lambda d: d == 2) == 2
    assert minimal(sst.split_dims(3, min_dim=1)) == 1


def test_dtypes_profiles_seeds_shrink_to_simplest():
    assert minimal(sst.dtypes()) == "float32"
    assert minimal(sst.value_profiles()) == ("normal", {})
    assert minimal(sst.value_profiles(), lambda p: p[0] == "large") == ("large", {"scale": 10.0})
    assert minimal(sst.seeds()) == 0


def test_cases_shrink_to_the_simplest_case():
    s = sst.cases("t", sizes={"n": sst.Split(), "b": sst.Free(1, 3)})
    assert minimal(s) == Case(target="t", world_size=1, mesh=(1,), sizes={"n": 1, "b": 1}, split=("n",))
    uneven = minimal(s, lambda c: c.sizes["n"] % c.group_size)
    assert (uneven.world_size, uneven.mesh, uneven.sizes["n"]) == (2, (2,), 3)


def test_explicit_world_sizes():
    s = sst.cases("t", world_sizes=[3, 2])
    assert minimal(s).world_size == 2
    assert minimal(s, lambda c: c.world_size == 3).mesh == (3,)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sst.world_sizes(min_size=3, max_size=2), "min_size=3 > max_size=2"),
        (lambda: sst.world_sizes(min_size=0), "min_size=0"),
        (lambda: sst.Split(min_per_rank=0), "allow_empty=True"),
        (lambda: sst.Split(min_per_rank=4, max_per_rank=2), "min_per_rank=4 > max_per_rank=2"),
        (lambda: sst.Free(min_size=5, max_size=1), "min_size=5 > max_size=1"),
        (lambda: sst.dtypes(allowed=("int8",)), "int8"),
        (lambda: sst.split_dims(2, max_dim=2), "max_dim=2; a 2-d tensor has dims 0..1"),
        (lambda: sst.split_dims(0), "ndim=0"),
        (lambda: sst.value_profiles(allowed=("spiky",)), "spiky"),
        (lambda: sst.Split(min_size=0), "min_size=0"),
        (lambda: sst.mostly(1), "at least one rare value"),
        (lambda: sst.mostly(1, 2, share=1.0), "share=1.0"),
        (lambda: sst.cases("t", min_world=3, max_world=1), "min_world=3 > max_world=1"),
    ],
)
def test_bounds_that_cannot_be_met_raise_clear_errors(make, match):
    with pytest.raises(InvalidArgument, match=match):
        make()


def test_generic_trigger_labels():
    from shardfuzz.spec.triggers import generic_triggers

    c = Case(
        target="t", world_size=4, mesh=(2, 2), sizes={"n": 3, "batch": 2}, split=("n",), dtype="bfloat16"
    )
    assert {"world>=3", "group<world", "2-D mesh", "uneven", "batch>1", "bfloat16"} <= generic_triggers(c)


# -- value profiles by role: large magnitudes where they find bugs ------------------------------
def _profiled(profile, options, role, scale=1.0):
    from shardfuzz.spec.inputs import randn

    case = Case(target="t", world_size=1, mesh=(1,), profile=profile, options=options)
    return randn(case, 2000, scale=scale, role=role)


def test_large_scales_activations_and_cotangents_not_weights_or_logits():
    base = {r: _profiled("normal", {}, r) for r in ("activation", "weight", "logits", "cotangent")}
    large = {r: _profiled("large", {"scale": 1000.0}, r) for r in base}
    assert large["activation"].equal(base["activation"] * 1000)
    assert large["cotangent"].equal(base["cotangent"] * 1000)
    assert large["weight"].equal(base["weight"]) and large["logits"].equal(base["logits"])


def test_ties_quantise_on_a_grid_relative_to_the_tensor_scale_and_leave_cotangents():
    w = _profiled("ties", {"grid": 1.0}, "weight", scale=0.1)
    assert bool(((w / 0.1 - 0.5) == (w / 0.1 - 0.5).round()).all())  # midpoints of a grid of 0.1
    assert bool((w != 0).all()) and len(w.unique()) < 12  # many ties, never a 0
    assert _profiled("ties", {"grid": 1.0}, "cotangent").equal(_profiled("normal", {}, "cotangent"))


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role='bias'; allowed: activation, weight, logits, cotangent"):
        _profiled("normal", {}, "bias")
