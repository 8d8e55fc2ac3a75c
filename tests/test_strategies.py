"""Strategies: pinned minimal examples, clear bound errors, and reach of every trigger condition."""

import collections
import dataclasses
import itertools
import math
import os

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Case, InvalidArgument
from shardfuzz.spec.bounds import CaseBounds, bounds_of, check_in_bounds
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target
from shardfuzz.targets import tp_mlp

FIND = settings(max_examples=3000, database=None, deadline=None)
DERIVED = os.path.join(os.path.dirname(__file__), "data", "derived_target.py")
#: the built-in targets, and two derived from tp_mlp (their cases: tp_mlp's, renamed)
BUILTIN_AND_DERIVED = [*sorted(BUILTIN_TARGETS), f"{DERIVED}::MINE", f"{DERIVED}::BROKEN"]


def tp_case(**changes):
    """A tp_mlp case on 2 ranks; ``changes``: Case fields, or sizes by name."""
    sizes = {"batch": 1, "seq": 1, "d_model": 1, "hidden": 2, "d_out": 1}
    sizes.update({k: changes.pop(k) for k in list(changes) if k in sizes})
    fields = dict(target="tp_mlp", world_size=2, mesh=(2,), sizes=sizes, split=("hidden",))
    return Case(**{**fields, **changes})


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


@pytest.mark.parametrize("min_per_rank", [1, 2])
def test_allow_empty_draws_fewer_rows_than_ranks_whatever_min_per_rank_is(min_per_rank):
    """Five new users wrote ``Split(allow_empty=True)`` for empty shards: with the default
    ``min_per_rank=1`` it drew none (only ``min_per_rank=0`` did), and the bounds refused them."""
    spec = sst.Split(min_per_rank=min_per_rank, max_per_rank=3, allow_empty=True)
    assert minimal(sst.sharded_sizes(3, spec), lambda n: n < 3) == 1
    assert minimal(sst.sharded_sizes(3, spec)) == 1  # opted in: it shrinks toward the empty shard
    assert minimal(sst.sharded_sizes(3, spec), lambda n: n >= 3) == 3 * min_per_rank  # never 1 a rank below
    assert spec.admits(2, 3) and spec.admits(3 * min_per_rank + 2, 3)
    assert not spec.admits(3 * min_per_rank - 1, 3) or min_per_rank == 1
    assert spec.describe(3).startswith("1..2 or ")
    assert not sst.Split(min_per_rank=min_per_rank).admits(2, 3)  # without the flag: never empty


def test_min_size_raises_the_global_size_and_keeps_empty_shards_reachable():
    spec = sst.Split(allow_empty=True, min_per_rank=0, min_size=2)
    assert minimal(sst.sharded_sizes(1, spec)) == 2
    assert minimal(sst.sharded_sizes(3, spec), lambda n: n < 3) == 2  # [1, 1, 0]: a rank still empty


def test_mostly_draws_the_common_value_mostly_and_shrinks_to_it():
    assert minimal(sst.mostly(1.0, 30.0, 100.0)) == 1.0
    assert minimal(sst.mostly(1.0, 30.0, 100.0), lambda v: v > 1) == 30.0
    assert minimal(sst.mostly(1.0, 30.0, 100.0), lambda v: v > 30) == 100.0
    # the share over every value of the coin flips behind it (a derandomized example() would not vary)
    flips = [[bool(i >> k & 1) for k in range(sst.MOSTLY_BITS)] for i in range(2**sst.MOSTLY_BITS)]
    values = [sst._mostly_value("a", ("b", "c"), 922, f) for f in flips]
    assert values.count("a") == 922 and values.count("b") == values.count("c") == 51


def test_mostly_keeps_its_share_where_hypothesis_draws_it_inside_a_case():
    """Hypothesis' own generation, as a search draws: within a case, integers(0, 999) fell below
    600 in 89% of draws, so mostly(share=0.6)'s rare values came up 5-6% of the time each, not 20%."""
    seen = collections.Counter()

    @st.composite
    def case_like(draw):
        draw(st.integers(0, 5))
        draw(st.lists(st.integers(0, 10), max_size=4))
        value = draw(sst.mostly("common", "r1", "r2", share=0.6))
        draw(st.integers(0, 2**31 - 1))
        return value

    @settings(
        max_examples=1500,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case_like())
    def draw(value):
        seen[value] += 1

    draw()
    n = sum(seen.values())
    assert 0.5 < seen["common"] / n < 0.7 and min(seen["r1"], seen["r2"]) / n > 0.12, seen


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
    edge = {"edge": "max", "edge_exp": 0, "edge_slot": 0}  # explicit and shrunk: kind, exponent, slot
    assert minimal(sst.value_profiles(), lambda p: p[0] == "edge") == ("edge", edge)
    tie = minimal(sst.value_profiles(), lambda p: p[1].get("edge") == "repeat" and p[1]["edge_slot"] > 2)
    assert tie == ("edge", {"edge": "repeat", "edge_exp": 0, "edge_slot": 3})
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
    assert not {"group>=3", "world non-power-of-2", "group non-power-of-2"} & generic_triggers(c)


def test_shards_that_the_two_split_rules_cut_apart_are_a_trigger_of_their_own():
    from shardfuzz.spec.triggers import SPLIT_RULES_DIFFER, generic_triggers

    def at(n, world):
        return generic_triggers(
            Case(target="t", world_size=world, mesh=(world,), sizes={"n": n}, split=("n",))
        )

    assert SPLIT_RULES_DIFFER in at(7, 3) and SPLIT_RULES_DIFFER in at(10, 4)  # [3, 3, 1] vs [3, 2, 2]
    assert SPLIT_RULES_DIFFER not in at(5, 3)  # [2, 2, 1] under both rules
    assert SPLIT_RULES_DIFFER not in at(7, 2) and SPLIT_RULES_DIFFER not in at(6, 3)
    # an empty DTensor shard is its own condition (and can hide an offset: nothing sits at it)
    assert "empty DTensor shard" in at(4, 3) and SPLIT_RULES_DIFFER not in at(4, 3)


def test_group_triggers_count_the_group_under_test_not_the_world():
    from shardfuzz.spec.triggers import generic_triggers

    def at(world, mesh):
        return generic_triggers(Case(target="t", world_size=world, mesh=mesh, sizes={"n": 6}, split=("n",)))

    assert {"world>=3", "world non-power-of-2", "group<world"} <= at(3, (3, 1))  # a group of one rank
    assert not {"group>=3", "group non-power-of-2"} & at(3, (3, 1))
    assert {"world>=3", "group>=3", "world non-power-of-2", "group non-power-of-2"} <= at(3, (3,))
    assert "group>=3" in at(4, (1, 4)) and "group non-power-of-2" not in at(4, (1, 4))


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


def test_randn_takes_a_dtype_by_name_or_as_a_torch_dtype_and_names_one_it_cannot_make():
    # the docs' mixed-precision advice, torch.promote_types(dtype, torch.float32), gives a torch.dtype:
    # a new user's ZeRO target failed with "attribute name must be string", blamed on its inputs
    import torch

    from shardfuzz.spec.inputs import randn

    case = Case(target="t", world_size=1, mesh=(1,), dtype="bfloat16")
    wide = randn(case, 4, dtype=torch.promote_types(torch.bfloat16, torch.float32))
    assert wide.dtype == torch.float32 and wide.equal(randn(case, 4, dtype="float32"))
    assert randn(case, 4).dtype == torch.bfloat16
    for bad in ("int64", torch.int64, "float31"):
        with pytest.raises(ValueError, match=r"dtype=.*; expected a floating dtype, by name \('float32'\)"):
            randn(case, 4, dtype=bad)


def test_ties_quantise_on_a_grid_relative_to_the_tensor_scale_and_leave_cotangents():
    w = _profiled("ties", {"grid": 1.0}, "weight", scale=0.1)
    assert bool(((w / 0.1 - 0.5) == (w / 0.1 - 0.5).round()).all())  # midpoints of a grid of 0.1
    assert bool((w != 0).all()) and len(w.unique()) < 12  # many ties, never a 0
    assert _profiled("ties", {"grid": 1.0}, "cotangent").equal(_profiled("normal", {}, "cotangent"))


def _edged(kind, dtype, role="activation", shape=(3, 5), exp=0, slot=1):
    from shardfuzz.spec.inputs import randn

    options = {"edge": kind, "edge_exp": exp, "edge_slot": slot}
    case = Case(target="t", world_size=1, mesh=(1,), dtype=dtype, profile="edge", options=options)
    normal = Case(target="t", world_size=1, mesh=(1,), dtype=dtype)
    return randn(case, *shape, role=role), randn(normal, *shape, role=role)


@pytest.mark.parametrize(
    "dtype, value",
    [("float32", 65504.0), ("bfloat16", 65536.0), ("float64", 3.4028234663852886e38), ("float16", 448.0)],
)
def test_edge_max_is_the_next_narrower_dtypes_largest_value_in_every_row(dtype, value):
    import torch

    got, base = _edged("max", dtype, slot=6)  # slot 6 of rows of 5: index 1
    assert bool((got[:, 1] == value).all())  # bfloat16 rounds 65504 up: past float16's range
    assert got[:, [0, 2, 3, 4]].equal(base[:, [0, 2, 3, 4]])
    assert got.dtype == getattr(torch, dtype)
    assert _edged("max", dtype, exp=3)[0][0, 1].item() == pytest.approx(value / 8, rel=1e-2)
    assert _edged("max", dtype, role="cotangent")[0][0, 1].item() == value
    for role in ("weight", "logits"):  # a huge weight or query saturates what follows, like `large`
        assert _edged("max", dtype, role=role)[0].equal(_edged("max", dtype, role=role)[1])


@pytest.mark.parametrize(
    "dtype, value",
    [("float32", -65504.0), ("bfloat16", -65536.0), ("float64", -65504.0), ("float16", -448.0)],
)
def test_edge_max_in_scores_is_a_finite_mask_of_float16s_lowest_value(dtype, value):
    got, base = _edged("max", dtype, role="scores", slot=6)  # a softmax's input itself: a mask
    assert bool((got[:, 1] == value).all()), got[:, 1]
    assert got[:, [0, 2, 3, 4]].equal(base[:, [0, 2, 3, 4]])
    assert _edged("max", dtype, role="scores", exp=3)[0][0, 1].item() == pytest.approx(value / 8, rel=1e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "float16"])
def test_edge_subnormal_signed_zero_and_repeat_reach_every_role_in_the_case_dtype(dtype):
    import torch

    tiny = torch.finfo(getattr(torch, dtype)).tiny
    for exp in (0, 7):
        sub = _edged("subnormal", dtype, role="weight", exp=exp)[0][:, 1].double()
        assert bool(((sub > 0) & (sub < tiny)).all()), sub  # a true subnormal, never flushed to 0
    zero = _edged("signed_zero", dtype, role="logits")[0][:, 1]
    assert bool((zero == 0).all()) and bool((torch.copysign(torch.ones_like(zero), zero) == -1).all())
    tie, base = _edged("repeat", dtype, role="cotangent", slot=0)  # slot 0 repeats the row's last
    assert tie[:, 0].equal(tie[:, 4]) and tie[:, 1:].equal(base[:, 1:])


def test_edge_never_replaces_a_whole_tensor():
    column, base = _edged("signed_zero", "float32", shape=(4, 1), slot=6)  # one row of it all
    assert (column == 0).sum() == 1 and column[2, 0] == 0 and column[[0, 1, 3]].equal(base[[0, 1, 3]])
    assert _edged("signed_zero", "float32", shape=(1,))[0].equal(
        _edged("signed_zero", "float32", shape=(1,))[1]
    )
    pairs, _ = _edged("repeat", "float32", shape=(3, 2), slot=1)  # each pair made equal: constant rows
    assert bool((pairs[:, 0] != pairs[:, 1]).any())


def test_an_unknown_edge_kind_or_slot_is_refused():
    with pytest.raises(ValueError, match=r"case.options\['edge'\]='huge'; it draws max, subnormal"):
        _edged("huge", "float32")
    with pytest.raises(ValueError, match=r"case.options\['edge_slot'\]=9; it draws an int in \[0, 7\]"):
        _edged("max", "float32", slot=9)
    with pytest.raises(ValueError, match=r"case.options\['edge_exp'\]=8; it draws an int in \[0, 7\]"):
        _edged("signed_zero", "float32", shape=(1,), exp=8)  # refused before anything is written


def test_edge_kinds_are_trigger_conditions():
    from shardfuzz.spec.triggers import generic_triggers

    c = Case(target="t", world_size=2, mesh=(2,), profile="edge", options={"edge": "subnormal"})
    assert {"profile=edge", "edge=subnormal"} <= generic_triggers(c)


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role='bias'; allowed: activation, weight, logits, cotangent"):
        _profiled("normal", {}, "bias")


# -- bounds: what cases() declares, and a case from elsewhere held to it (docs/trust.md) -------------
def _drawable(spec, group):
    """Every size ``sharded_sizes(group, spec)`` can draw, by its construction."""
    out = set()
    per_ranks = set(range(spec.min_per_rank, spec.max_per_rank + 1)) | ({0} if spec.allow_empty else set())
    for per_rank in sorted(per_ranks):
        if per_rank == 0:
            raws = range(1, group) if group > 1 else [1]
        else:
            raws = [per_rank * group + r for r in (range(group) if spec.uneven else [0])]
        out |= {max(raw, spec.min_size) for raw in raws}
    return out


SPLITS = [
    sst.Split(lo, hi, uneven, empty, min_size)
    for lo, hi, uneven, empty, min_size in itertools.product(
        range(3), range(4), (True, False), (True, False), (1, 2, 5)
    )
    if lo <= hi and (lo or empty) and (hi or uneven)
]


def test_split_admits_exactly_the_sizes_it_is_built_from():
    for spec in SPLITS:
        for group in range(1, 6):
            admitted = {n for n in range(40) if spec.admits(n, group)}
            assert admitted == _drawable(spec, group), (spec, group, spec.describe(group))


@given(st.sampled_from(SPLITS), st.integers(1, 6), st.data())
def test_every_size_sharded_sizes_draws_is_admitted(spec, group, data):
    assert spec.admits(data.draw(sst.sharded_sizes(group, spec)), group)


def test_cases_declares_its_bounds_and_one_of_joins_them_while_map_and_composite_lose_them():
    a = sst.cases("t", sizes={"n": sst.Split()}, max_dims=1, profiles=("normal",))
    b = sst.cases("t", sizes={"n": sst.Free(1, 2)}, options={"o": st.just(1)}, world_sizes=[2, 3])
    (ba,) = bounds_of(a)
    assert ba == CaseBounds(range(1, 5), 1, (("n", sst.Split()),), ("normal",), frozenset())
    (bb,) = bounds_of(b)
    assert (bb.worlds, bb.options) == ((2, 3), frozenset({"o"}))
    assert bounds_of(a | b) == bounds_of(st.one_of(a, b)) == (ba, bb)

    @st.composite
    def wrapped(draw):
        return draw(a)

    # a map, a filter or a composite may change anything: they declare nothing, nor does a one_of
    # with such a branch, unless the wrapper is declared to keep within the bounds
    for undeclared in (a.map(lambda c: c), a.filter(bool), wrapped(), a | wrapped(), st.integers(), 3):
        assert bounds_of(undeclared) is None, undeclared
    assert bounds_of(sst.bounded_like(wrapped(), a)) == (ba,)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_case_a_run_of_a_builtin_target_draws_is_within_its_bounds(data):
    """At any world sizes a run may ask for, on the 1-rank path too (finish.try_one_rank)."""
    target = get_target(data.draw(st.sampled_from(BUILTIN_AND_DERIVED), label="target"))
    asked = st.lists(st.integers(1, 6), min_size=1, max_size=3, unique=True).map(tuple)
    world_sizes = data.draw(st.none() | asked, label="world_sizes")
    strategy = target.strategy(world_sizes)
    if data.draw(st.booleans(), label="on the 1-rank path"):
        with sst.one_rank_path():
            case = data.draw(strategy, label="case")
    else:
        case = data.draw(strategy, label="case")
    assert target.case_bounds(world_sizes) is not None  # every built-in target declares its bounds
    check_in_bounds(target, case)


def test_a_1_rank_case_of_the_1_rank_path_is_admitted_and_one_of_no_group_is_not():
    tp = get_target("tp_mlp")
    case = tp_case(world_size=1, mesh=(1,), hidden=7)  # 3 * 2 + 1, drawn on 2 ranks
    check_in_bounds(tp, case)
    check_in_bounds(tp, tp_case(world_size=1, mesh=(1,), hidden=63))  # 3 * 16 + 15: 16 ranks
    with pytest.raises(InvalidArgument) as e:
        check_in_bounds(tp, tp_case(world_size=1, mesh=(1,), hidden=64))
    assert "sizes['hidden']=64; split over a group of 1 rank(s) (mesh[-1]) it draws 1..3" in str(e.value)
    assert "nor is it the 1-rank case of a larger world" in str(e.value)
    # a target whose own world sizes are (1, 2): the 1-rank path keeps sizes drawn for 2 ranks only
    pair = tp.derive(
        "pair", cases=lambda world_sizes=None: sst.cases("pair", sizes=tp_mlp.SIZES, world_sizes=(1, 2))
    )
    check_in_bounds(pair, dataclasses.replace(case, target="pair"))
    with pytest.raises(InvalidArgument, match=r"sizes\['hidden'\]=8"):
        check_in_bounds(pair, tp_case(target="pair", world_size=1, mesh=(1,), hidden=8))


BOUNDED = dict(sizes=tp_mlp.SIZES, min_world=2, max_world=3, max_dims=1)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (dict(world_size=4, mesh=(4,)), "world_size=4; it draws world sizes 2..3"),
        (dict(world_size=1, mesh=(1,), hidden=1), "world_size=1; it draws world sizes 2..3"),
        (dict(mesh=(2, 1)), "mesh=(2, 1) on world size 2; it draws the meshes (2,) (at most 1-D)"),
        (dict(hidden=8), "sizes['hidden']=8; split over a group of 2 rank(s) (mesh[-1]) it draws 2..7"),
        (dict(hidden=1), "sizes['hidden']=1; split over a group of 2 rank(s) (mesh[-1]) it draws 2..7"),
        (dict(batch=4), "sizes['batch']=4; it draws 1..3 (Free(min_size=1, max_size=3))"),
        (dict(profile="small", options={"scale": 0.1}), "profile='small'; it draws normal, large, ties"),
        (
            dict(options={"steps": 2}),
            "options has ['steps'], which it does not draw with profile 'normal'; it draws []",
        ),
        (
            dict(sizes={"hidden": 2, "n": 1}),
            "sizes lacks ['batch', 'd_model', 'd_out', 'seq'] and has ['n'], which it "
            "does not draw; it draws ['batch', 'd_model', 'd_out', 'hidden', 'seq']",
        ),
        (dict(split=()), "split=(); it splits ['hidden']"),
    ],
)
def test_a_case_outside_the_declared_bounds_is_refused_naming_the_field_value_and_bounds(changes, named):
    bounded = get_target("tp_mlp").derive("bounded", cases=sst.cases("bounded", **BOUNDED))
    check_in_bounds(bounded, tp_case(target="bounded"))
    with pytest.raises(InvalidArgument) as e:
        check_in_bounds(bounded, tp_case(target="bounded", **changes))
    assert str(e.value).startswith(f"target 'bounded' never draws this case: {named}"), str(e.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"edge": "huge", "edge_exp": 0, "edge_slot": 0}, "options['edge']='huge'; it draws max, subnormal"),
        ({"edge": "max", "edge_exp": 8, "edge_slot": 0}, "options['edge_exp']=8; it draws an int in [0, 7]"),
        (
            {"edge": "max", "edge_exp": 0, "edge_slot": "0"},
            "options['edge_slot']='0'; it draws an int in [0, 7]",
        ),
    ],
)
def test_an_edge_case_is_admitted_only_with_a_kind_exponent_and_slot_it_draws(options, named):
    ring = get_target("ring_allreduce")  # draws the edge profile
    case = Case(target="ring_allreduce", world_size=2, mesh=(2,), sizes={"numel": 3}, split=("numel",))
    edge = {"edge": "repeat", "edge_exp": 7, "edge_slot": 7}
    check_in_bounds(ring, dataclasses.replace(case, profile="edge", options=edge))
    with pytest.raises(InvalidArgument) as e:
        check_in_bounds(ring, dataclasses.replace(case, profile="edge", options=options))
    assert named in str(e.value), str(e.value)


def test_mesh_dims_and_sizes_per_rank_of_a_builtin_target():
    tp = get_target("tp_mlp")
    for ok in (dict(world_size=4, mesh=(2, 2), hidden=7), dict(world_size=4, mesh=(4,), hidden=8)):
        check_in_bounds(tp, tp_case(**ok))
    with pytest.raises(InvalidArgument, match=r"mesh=\(1, 2, 2\) on world size 4; .* \(at most 2-D\)"):
        check_in_bounds(tp, tp_case(world_size=4, mesh=(1, 2, 2)))
    with pytest.raises(InvalidArgument, match=r"sizes\['hidden'\]=8; split over a group of 2 rank"):
        check_in_bounds(tp, tp_case(world_size=4, mesh=(2, 2), hidden=8))
    with pytest.raises(InvalidArgument, match=r"profile='large'; it draws normal, ties"):
        moe = get_target("moe").strategy()
        check_in_bounds(
            get_target("moe"), dataclasses.replace(minimal(moe), profile="large", options={"scale": 10.0})
        )


def test_the_branch_whose_names_the_case_has_says_what_is_wrong():
    tp = get_target("tp_mlp")
    sp = tp_case(seq=2, d_model=3, split=("hidden", "seq"), options={"sequence_parallel": True})
    check_in_bounds(tp, sp)
    with pytest.raises(InvalidArgument) as e:
        check_in_bounds(tp, dataclasses.replace(sp, sizes={**sp.sizes, "d_model": 1}))  # sp: 3..4
    assert "sizes['d_model']=1; it draws 3..4" in str(e.value) and "branch" not in str(e.value)
    with pytest.raises(
        InvalidArgument, match=r"no branch of its strategy draws it: branch 1: .*; branch 2: "
    ):
        check_in_bounds(tp, dataclasses.replace(sp, options={"sequence_parallel": True, "x": 1}))


def test_a_dtype_a_run_may_choose_is_admitted_and_an_undeclared_strategy_is_not_checked():
    tp = get_target("tp_mlp")
    # a run's dtypes put any case in any dtype (test_config: the float32-only toy runs in float64)
    check_in_bounds(tp, tp_case(dtype="float16"))
    mapped = tp.derive("mapped", cases=sst.cases("mapped", sizes=tp_mlp.SIZES).map(lambda c: c))
    assert mapped.case_bounds() is None
    check_in_bounds(mapped, tp_case(target="mapped", world_size=9, mesh=(3, 3), hidden=10**6))


def test_world_sizes_a_target_refuses_are_refused_with_its_reason():
    def cases(world_sizes=None):
        if world_sizes and 1 in world_sizes:
            raise InvalidArgument("world_sizes: this target needs 2 ranks or more")
        return sst.cases("two", sizes=tp_mlp.SIZES, world_sizes=world_sizes, min_world=2)

    two = get_target("tp_mlp").derive("two", cases=cases)
    check_in_bounds(two, tp_case(target="two"))
    with pytest.raises(
        InvalidArgument, match=r"its cases\(world_sizes=\(1,\)\) refuses them: .*needs 2 ranks"
    ):
        check_in_bounds(two, tp_case(target="two", world_size=1, mesh=(1,), hidden=1))


def test_an_option_of_one_branch_pins_by_selecting_the_branches_that_have_it():
    # tp_mlp's cases are a one_of: the plain MLP (no option) | sequence parallel (its one option)
    from shardfuzz.engine import covering
    from shardfuzz.spec import sampling

    t = get_target("tp_mlp")
    pinned = (("sequence_parallel", True),)
    drawn = sampling.draw_pool(t.strategy(options=pinned), 7, 40)
    assert len(drawn) >= 30 and all(c.options["sequence_parallel"] is True for c, _ in drawn)
    pool = covering.pool_for(t, None, None, pinned)  # the covering rows are picked from these
    assert pool and all(c.options["sequence_parallel"] is True for c, _ in pool)
    # unpinned, both branches are drawn
    both = {bool(c.options.get("sequence_parallel")) for c, _ in sampling.draw_pool(t.strategy(), 7, 60)}
    assert both == {False, True}
    with pytest.raises(
        InvalidArgument,
        match=r"no such option; its options: sequence_parallel \(and grid, scale, set by its value profiles\)$",
    ):
        t.strategy(options=(("sequence_paralel", True),))
    # a derived target (TARGET.derive) selects the base's branches too
    mine = t.derive("my_tp")
    drawn = sampling.draw_pool(mine.strategy(options=pinned), 7, 40)
    assert drawn and all(c.options["sequence_parallel"] is True and c.target == "my_tp" for c, _ in drawn)


def test_options_of_different_branches_pinned_together_name_each_branch():
    branches = sst.cases("two", sizes={"n": sst.Free(1, 2)}, options={"a": st.just(1)}) | sst.cases(
        "two", sizes={"n": sst.Free(1, 2)}, options={"b": st.just(2)}
    )
    t = shardfuzz_target("two", branches)
    assert {c.options["a"] for c, _ in _draws(t.strategy(options=(("a", 3),)))} == {3}
    with pytest.raises(
        InvalidArgument, match=r"'a', 'b' pinned together, but no branch .* \{a, grid, scale\}; \{b, grid"
    ):
        t.strategy(options=(("a", 3), ("b", 4)))


def _draws(strategy):
    from shardfuzz.spec import sampling

    return sampling.draw_pool(strategy, 3, 20)


def shardfuzz_target(name, cases):
    import torch

    import shardfuzz

    return shardfuzz.Target(
        name=name,
        cases=cases,
        inputs=lambda case: {"x": torch.zeros(case.sizes["n"])},
        oracle=lambda inp, case: {"y": inp["x"]},
        outputs={"y": shardfuzz.Replicate()},
        implementations={"reference": lambda ctx: {"y": ctx.inputs["x"]}},
    )


def test_mesh_2d_share_puts_that_share_of_cases_on_a_dp_x_tp_mesh():
    from shardfuzz.spec import sampling

    def share(strategy):
        drawn = [c for c, _ in sampling.draw_pool(strategy, 11, 200)]
        return sum(len(c.mesh) == 2 and min(c.mesh) > 1 for c in drawn) / len(drawn)

    plain = share(sst.cases("m", sizes={"n": sst.Split()}))
    half = share(sst.cases("m", sizes={"n": sst.Split()}, mesh_2d_share=0.5))
    assert plain < 0.15 and 0.4 < half < 0.75, (plain, half)
    # every such case is on (2, 2) here (worlds 1-4), and the shrinker takes it back to the usual draw
    assert (
        sst.dp_tp_meshes(4) == [(2, 2)]
        and sst.dp_tp_meshes(3) == []
        and sst.dp_tp_meshes(6) == [(2, 3), (3, 2)]
    )
    assert find(sst.cases("m", sizes={"n": sst.Split()}, mesh_2d_share=0.5), lambda c: True).mesh == (1,)
    # even when every case is drawn on (2, 2), a property of one axis shrinks to that axis alone
    every = sst.cases("m", sizes={"n": sst.Split()}, mesh_2d_share=1.0)
    assert find(every, lambda c: len(c.mesh) == 2 and c.mesh[0] > 1, settings=FIND).mesh == (2, 1)
    assert find(every, lambda c: c.group_size > 1, settings=FIND).mesh == (2,)
    assert find(every, lambda c: len(c.mesh) == 2 and min(c.mesh) > 1, settings=FIND).mesh == (2, 2)
    assert 0.8 < share(every) < 1.0, share(every)  # each axis kept in 95% of the dp x tp draws
    with pytest.raises(InvalidArgument, match=r"mesh_2d_share=1.5; must be a number in \[0, 1\]"):
        sst.cases("m", mesh_2d_share=1.5)


def test_a_size_split_over_the_replicas_is_drawn_for_the_data_parallel_axis():
    from shardfuzz.spec import sampling

    sizes = {"batch": sst.Split(over="replicas"), "hidden": sst.Split()}
    dp_tp = sst.cases("dp_tp", sizes=sizes, mesh_2d_share=1.0)
    for case, _ in sampling.draw_pool(dp_tp, 5, 40):  # on (2, 2) (batch for 2 replicas) but where
        if case.mesh != (2, 2):  # an axis was dropped: (w, 1) or (w,) (see the test above)
            continue
        assert case.split == ("hidden",), case
        assert 2 <= case.sizes["batch"] <= 7 and 2 <= case.sizes["hidden"] <= 7, case
    for case, _ in sampling.draw_pool(sst.cases("dp_tp", sizes=sizes, max_dims=1), 5, 40):
        assert 1 <= case.sizes["batch"] <= 3, case  # a 1-D mesh has one replica
    target = shardfuzz_target("dp_tp", dp_tp)
    good = next(c for c, _ in sampling.draw_pool(dp_tp, 5, 1))
    check_in_bounds(target, good)
    with pytest.raises(
        InvalidArgument, match=r"sizes\['batch'\]=1; split over 2 replica\(s\) it draws 2\.\.7"
    ):
        check_in_bounds(target, dataclasses.replace(good, sizes={**good.sizes, "batch": 1}))
    with pytest.raises(InvalidArgument, match="over='dp'; allowed: group, replicas"):
        sst.Split(over="dp")


def test_a_size_the_replicas_do_not_divide_is_a_trigger_of_its_own():
    """A dp x tp target's batch, split over dp by the target itself, is not in ``case.split``: a
    batch of 3 on 2 replicas (a mean of means) reached no condition ("uneven" is the group's)."""
    from shardfuzz.spec.triggers import triggers_of

    sizes = {"batch": sst.Split(over="replicas"), "hidden": sst.Split()}
    target = shardfuzz_target("dp_tp", sst.cases("dp_tp", sizes=sizes, mesh_2d_share=1.0))
    assert target.replica_splits == {"batch"}

    def reached(mesh, batch, hidden=4):
        case = Case("dp_tp", math.prod(mesh), mesh, {"batch": batch, "hidden": hidden}, ("hidden",))
        return triggers_of(target, case)

    assert "uneven over replicas" in reached((2, 2), 3)
    assert "uneven over replicas" in reached((3, 1), 4)
    assert not {"uneven over replicas", "uneven"} & reached((2, 2), 4)  # 2 rows a replica; hidden even
    assert "uneven over replicas" not in reached((2,), 3)  # one replica: nothing to split
    # fewer rows than replicas: one holds none (a new user's 2-D halo exchange could not tell)
    assert "empty shard over replicas" in reached((3, 1), 2)
    assert "empty shard over replicas" not in reached((2, 2), 2) | reached((2,), 1)


def test_the_simplest_case_is_the_one_a_search_tries_first():
    """shardfuzz.spec.sampling.simplest_case: what sst.cases shrinks toward (the smallest even sizes,
    the first world size and dtype, the normal profile, seed 0: Hypothesis' own minimum), which
    uniform draws rarely meet; the sizes a hand-made case is checked against include it."""
    from shardfuzz.spec.registry import get_target
    from shardfuzz.spec.sampling import simplest_case
    from shardfuzz.verdict.oracle import drawn_sizes

    strategy = sst.cases(
        "s", sizes={"n": sst.Split(min_per_rank=2)}, min_world=2, dtypes=("bfloat16", "float32")
    )
    case, choices = simplest_case(strategy)
    assert (case.world_size, case.sizes, case.dtype, case.profile, case.seed) == (
        2,
        {"n": 4},
        "bfloat16",
        "normal",
        0,
    )
    assert choices and case == find(strategy, lambda c: True, settings=FIND)  # Hypothesis' own minimum
    assert simplest_case(strategy.filter(lambda c: c.seed > 0)) is None  # a filter rejects it: none
    tp = get_target("tp_mlp")
    assert drawn_sizes(tp).smallest == simplest_case(tp.strategy())[0].sizes


@pytest.mark.parametrize("field", ["options", "late_options"])
def test_an_option_named_like_a_value_profiles_parameter_is_refused(field):
    """A new user's attention target drew its softmax ``scale`` as an option: every ``large`` case
    overwrote it with the profile's scale (10 to 10,000), silently."""
    with pytest.raises(InvalidArgument) as e:
        sst.cases("attn", **{field: {"scale": st.sampled_from([0.5, 1.0]), "causal": st.booleans()}})
    assert (
        f"{field} names 'scale'" in str(e.value)
        and "grid, scale are taken" in str(e.value)
        and "rename" in str(e.value)
    )
    # where no profile drawn has that parameter, the name is free (the normal profile has none)
    sst.cases("attn", profiles=("normal",), **{field: {"scale": st.sampled_from([0.5, 1.0])}})
