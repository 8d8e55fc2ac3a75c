"""The ``dtensor_ops`` target (issue 32): its ops come from DTensor's registry of sharding
strategies, what it cannot draw is counted by reason, a torch that renames the registry fails here
with a clear error, and the pieces it hands DTensor reduce to the tensor exactly under each
placement, in any order a correct reduction may take. Its reference's cleanliness and its expected
failures are proved with every target's, in tests/test_targets.py."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuzz import Case, Runner
from shardfuzz.spec.registry import get_target
from shardfuzz.spec.sampling import simplest_case

TARGET = get_target("dtensor_ops")
ops = sys.modules[TARGET.inputs.__module__]  # targets/dtensor_ops.py, as the registry loaded it


def test_ops_come_from_the_registry_and_every_other_op_is_counted_by_reason():
    registered = ops._registered_ops()
    assert len(ops.OPS) >= 150, len(ops.OPS)
    assert len(ops.OPS) + sum(ops.SKIPPED.values()) == len(registered)
    names = {str(op) for op in registered}
    assert {s.name for s in ops.OPS} <= names
    for family, members in ops.FAMILIES.items():
        assert members, f"no op in family {family}"
    dims = {s.name for s in ops.FAMILIES["dims"]}
    for wanted in ("aten.sum.dim_IntList", "aten.cumsum.default", "aten.max.dim", "aten.transpose.int"):
        assert wanted in dims, wanted  # reductions, scans and views with dim arguments are drawn
    assert any(s.inplace for s in ops.OPS) and any(s.differentiable for s in ops.OPS)


def test_the_softmaxes_are_drawn_without_half_to_float_and_never_over_one_element():
    """A new user fuzzing DTensor's normalisation ops found softmax and log_softmax refused as "not a
    function of its input" (the internal-variant pattern): every softmax of a DTensor goes through
    them. ``half_to_float`` is passed as False (a CPU float kernel refuses True); a softmax over one
    element, whose outputs are constant whatever DTensor does, is refused."""
    from shardfuzz import Unsupported

    for name in ("aten._softmax.default", "aten._log_softmax.default"):
        spec = ops.spec_named(name)
        assert not isinstance(spec, str), spec
        assert [a.kind for a in spec.args] == ["dim", "false"], spec.args
        assert name in {s.name for s in ops.FAMILIES["dims"]}
    assert ops.spec_named("aten.native_layer_norm.default") == "an internal or backward variant"
    base, _ = simplest_case(TARGET.strategy())
    case = dataclasses.replace(base, sizes={"d0": 1, "d1": 3, "d2": 1}, options={
        **base.options, "op": "aten._softmax.default", "ndim": 2, "dim": 0, "place": "R", "backward": False,
    })  # fmt: skip
    with pytest.raises(Unsupported, match="over a dim of 1"):
        ops.inputs(case)
    ops.inputs(dataclasses.replace(case, options={**case.options, "dim": 1}))  # a dim of 3: drawn


@pytest.mark.parametrize(
    "name,values,plain",
    [  # a flag drawn after an argument left at its default: keepdim went in as amax's dim
        ("aten.amax.default", [True], lambda x: x.amax((0, 1), keepdim=True)),
        ("aten.amax.default", [False], lambda x: x.amax((0, 1))),
        ("aten.argmax.default", [True], lambda x: x.argmax(keepdim=True)),
        ("aten.sort.default", [True], lambda x: x.sort(-1, descending=True)[0]),
        ("aten.topk.default", [2, False, True], lambda x: x.topk(2, -1, largest=False)[0]),
        ("aten.sum.dim_IntList", [[1], True, None], lambda x: x.sum(1, keepdim=True)),
    ],
)
def test_an_argument_left_at_its_default_keeps_its_place(name, values, plain):
    """Arguments left at their default still take their place before a drawn one (a new user
    found amax's keepdim, sort's descending and topk's largest passed as the dim)."""
    spec = ops.spec_named(name)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ops.call(spec, x, None, values)[0], plain(x)), name


def test_a_torch_that_renames_the_registry_fails_with_a_clear_error(monkeypatch):
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    monkeypatch.delattr(type(propagator), "op_strategy_funcs", raising=False)
    monkeypatch.delattr(propagator, "op_strategy_funcs")
    with pytest.raises(RuntimeError, match=r"ShardingPropagator has no \['op_strategy_funcs'\]"):
        ops._registered_ops()


def _reduce(pieces: list[torch.Tensor], kind: str | None, order: list[int]) -> torch.Tensor:
    ordered = [pieces[i] for i in order]
    if kind == "Pmax":
        return torch.stack(ordered).amax(0)
    if kind == "Pmin":
        return torch.stack(ordered).amin(0)
    total = ordered[0].clone()
    for p in ordered[1:]:
        total = (
            total * p if kind == "Pprod" else total + p
        )  # left to right, in the case dtype, as a ring would
    if kind == "Pavg":
        return total / len(pieces)
    return total


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["Psum", "Pavg", "Pmax", "Pmin", "Pprod"]),
    parts=st.sampled_from([1, 2, 3, 4]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_partial_pieces_reduce_to_the_tensor_exactly_in_any_order(kind, parts, dtype, seed, data):
    if kind == "Pavg" and parts & (parts - 1):
        parts = 4  # the target draws Pavg over a power-of-two number of pieces only
    g = torch.Generator().manual_seed(seed)
    # up to the dtype's largest values: float16 Pavg pieces of the large profile's 1e4 on 4 ranks
    # summed to -inf in gloo's average (it sums first), a false finding of DTensor's add_
    top = torch.finfo(dtype).max
    x = torch.randn(5, 3, generator=g).double() * 10.0 ** float(torch.randint(-3, 5, (), generator=g))
    x = torch.where(torch.rand(5, 3, generator=g) < 0.2, x.sign() * top, x).clamp(-top, top).to(dtype)
    if kind == "Pavg":
        x = ops.avg_input(x, parts)
    x[0, 0] = -0.0  # the edge profile's signed zero: Psum's other pieces held +0.0, and -0.0 + 0.0 is +0.0
    owner = torch.randint(0, 64, x.shape, generator=g)
    placed = (kind,)
    pieces = [ops.placed_piece(x, owner, placed, (parts,), (c,)) for c in range(parts)]
    order = data.draw(st.permutations(range(parts)))
    got = _reduce(pieces, kind, order)
    assert torch.equal(got, x), (kind, parts, dtype, (got - x).abs().max())
    assert torch.equal(torch.signbit(got), torch.signbit(x)), (kind, parts, dtype, got[0, 0])
    if kind == "Pavg":  # divided first, then summed: the same
        pre = _reduce([p / parts for p in pieces], "Psum", order)
        assert torch.equal(pre, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_pavg_pieces_of_the_largest_values_sum_without_overflow(dtype):
    """gloo averages by summing first: 4 float16 pieces of -17000 summed to -inf, a false finding
    of DTensor's add_ (the mean, -17000, is a float16)."""
    top = torch.finfo(dtype).max
    x = ops.avg_input(torch.tensor([top, -top, 17000.0, -1.5]).clamp(-top, top).to(dtype), 4)
    owner = torch.zeros(x.shape, dtype=torch.long)
    pieces = [ops.placed_piece(x, owner, ("Pavg",), (4,), (c,)) for c in range(4)]
    total = _reduce(pieces, "Psum", list(range(4)))
    assert bool(total.isfinite().all()) and torch.equal(total / 4, x), (total, x)


def test_a_shard_and_a_partial_on_two_axes_cover_the_tensor_once():
    x = torch.arange(12.0).reshape(4, 3)
    owner = torch.randint(0, 64, x.shape, generator=torch.Generator().manual_seed(0))
    total = torch.zeros_like(x)
    for c0 in range(2):
        for c1 in range(2):
            local = ops.placed_piece(x, owner, ("S0", "Psum"), (2, 2), (c0, c1))
            offset, size = ops._box((4, 3), ("S0", "Psum"), (2, 2), (c0, c1))
            ops._cut(total, offset, size).add_(local)
    assert torch.equal(total, x)
    assert math.prod(ops._box((4, 3), ("S0", "S0"), (2, 2), (1, 1))[1]) == 3  # nested: 1 row of 3


def test_a_reproducer_refuses_code_whose_names_the_harness_defines_too(tmp_path, monkeypatch):
    """The standalone script's harness defines ``piece``, ``split``, ``check``...: an implementation
    whose copied code defines one of them would be silently replaced by the harness's (this target's
    helper was once called ``piece``: its script died with "piece() takes 4 positional arguments")."""
    from shardfuzz.repro.standalone import _Closure
    from shardfuzz.repro.standalone_script import harness_names

    (tmp_path / "clashing_impl.py").write_text(
        "def piece(t):\n    return t\n\n\nA, B = 1, 2\n\n\ndef impl(ctx):\n    return {'y': piece(ctx) + A + B}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import clashing_impl

    closure = _Closure()
    closure.add_object(clashing_impl.impl, "impl")
    assert {"piece", "A", "B", "impl"} <= set(closure.defined())  # unpacked names are carried too
    assert set(closure.defined()) & harness_names() == {"piece"}
    assert "placed_piece" not in harness_names()  # this target's helper, renamed


def test_a_proof_pins_options_and_the_operator_tells_findings_apart():
    import dataclasses as dc

    from shardfuzz import Runner, TargetError
    from shardfuzz.spec.records import Expect

    pinned = Expect(kind="mismatch", world_size=2, mesh=(2,), options={"op": "aten.cumsum.default"})
    assert pinned.options == (("op", "aten.cumsum.default"),)
    with pytest.raises(TargetError, match=r"Expect\(options=\['op'\]\); expected a mapping"):
        Expect(kind="mismatch", world_size=2, mesh=(2,), options=["op"])
    with pytest.raises(TargetError, match=r"distinct='op'; expected a tuple of option names"):
        dc.replace(TARGET, distinct="op")
    reporter = Runner("dtensor_ops", "torch_dtensor").reporter
    case, _ = simplest_case(TARGET.strategy())
    other = dc.replace(case, options={**case.options, "op": "aten.cumsum.default"})
    assert reporter._site(case, ("y0",)) != reporter._site(other, ("y0",))  # one bug per operator
    assert reporter._site(case, ("y0",))[0] == "y0"


def test_shard_conditions_are_met_only_where_a_placement_cuts_the_dim():
    """Every size is split over the group, but only a Shard placement cuts one: an all-Replicate
    case said "uneven" and "empty shard" in its report, and the covering rows promised shards
    that no case held (the rows that reach them now find torch_logsumexp_keepdim at the fourth)."""
    from shardfuzz.spec.triggers import SPLIT_RULES_DIFFER, triggers_of

    base = Case(
        target="dtensor_ops",
        world_size=3,
        mesh=(3,),
        sizes={"d0": 2, "d1": 7, "d2": 1},
        split=("d0", "d1", "d2"),
        options={**simplest_case(TARGET.strategy())[0].options, "op": "aten.neg.default", "ndim": 2},
    )
    shards = {"uneven", "empty shard", "empty DTensor shard", SPLIT_RULES_DIFFER}
    for place in ("R", "Psum"):
        assert (
            not triggers_of(TARGET, dataclasses.replace(base, options={**base.options, "place": place}))
            & shards
        )
    on_d0 = dataclasses.replace(base, options={**base.options, "place": "S0"})  # 2 on 3: [1, 1, 0]
    assert {"uneven", "empty shard"} <= triggers_of(TARGET, on_d0)
    on_d1 = dataclasses.replace(
        base, options={**base.options, "place": "S1"}
    )  # 7 on 3: [3, 3, 1] vs [3, 2, 2]
    met = triggers_of(TARGET, on_d1)
    assert {"uneven", SPLIT_RULES_DIFFER} <= met and not met & {"empty shard", "empty DTensor shard"}
    # the generic conditions still come from the sizes: a dim that no size makes uneven stays even
    even = dataclasses.replace(on_d1, sizes={"d0": 3, "d1": 6, "d2": 3})
    assert not triggers_of(TARGET, even) & shards


def test_a_pinned_placement_of_two_mesh_axes_is_refused_on_a_one_d_mesh_not_a_crash():
    """A maintainer pinned the placement a report printed, place=R,S0, on world size 2: the 1-D
    mesh cases of the pool crashed the progress line's conditions (IndexError, exit 1, which reads
    as a finding). Such a case cuts nothing and is refused (``supports``); the 2-D ones run."""
    from shardfuzz.engine import covering
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.spec.triggers import triggers_of

    base = simplest_case(TARGET.strategy())[0]
    one_d = dataclasses.replace(
        base,
        world_size=2,
        mesh=(2,),
        sizes={"d0": 3, "d1": 2, "d2": 1},
        options={**base.options, "op": "aten.sum.dim_IntList", "ndim": 2, "place": "R,S0"},
    )
    assert "uneven" not in triggers_of(TARGET, one_d) and ops.supports(one_d).startswith("place not one of")
    assert "uneven" in triggers_of(TARGET, dataclasses.replace(one_d, mesh=(1, 2)))
    pinned = (("op", "aten.sum.dim_IntList"), ("place", "R,S0"))
    runner = Runner("dtensor_ops", "torch_dtensor", RunConfig(world_sizes=(2,), options=dict(pinned)))
    assert "uneven" in covering.progress_conditions(runner)


@pytest.mark.parametrize(
    "place,other,known",
    [
        ("R,Pprod", "Psum,R", True),
        ("R,Pprod", "Psum,S0", True),
        ("R,Pprod,R", "Psum,R,R", True),  # 3-D forms a review ran: wrong in torch 2.13
        ("R,R,Pprod", "R,Psum,R", True),
        ("R,R,Pprod", "Psum,R,R", True),
        ("R,Pprod,R", "Psum,R,S0", True),
        ("R,Pprod,S0", "Psum,R,R", False),  # run: right
        ("R,Pprod,R", "R,R,Psum", False),
        ("Pprod,R,R", "R,Psum,R", False),
        ("Pprod,R", "R,Psum", False),
    ],
)
def test_the_known_product_and_sum_failure_covers_the_forms_found_wrong_and_no_other(place, other, known):
    """The exclusion a campaign passes to search past this torch bug: it covered 2-D meshes only, so
    a campaign on 8 ranks reported the same bug again as new."""
    from shardfuzz.spec.exclude import CaseExpression

    expr = CaseExpression(ops.KNOWN["a Partial(product) added to a Partial(sum)"])
    case, _ = simplest_case(TARGET.strategy())
    for a, b in ((place, other), (other, place)):
        c = dataclasses.replace(
            case, options={**case.options, "op": "aten.add.Tensor", "place": a, "other_place": b}
        )
        assert expr(c) is known, (a, b)


def test_three_mesh_axes_place_every_element_once():
    """A (2, 2, 2) mesh: every shard and Partial combination of three axes hands out pieces that
    add up to the tensor once (Psum), and nested sharding over three axes cuts one dim three times."""
    x = torch.arange(60.0).reshape(5, 4, 3)
    owner = torch.randint(0, 64, x.shape, generator=torch.Generator().manual_seed(1))
    for placed in [("S0", "S0", "S0"), ("S0", "Psum", "S1"), ("Psum", "S2", "Psum"), ("R", "S1", "S0")]:
        total = torch.zeros_like(x)
        reps = math.prod(2 for p in placed if p == "R")
        for coord in itertools.product(range(2), repeat=3):
            local = ops.placed_piece(x, owner, placed, (2, 2, 2), coord)
            offset, size = ops._box((5, 4, 3), placed, (2, 2, 2), coord)
            ops._cut(total, offset, size).add_(local)
        assert torch.equal(total, x * reps), placed
    assert ops._box((5, 4, 3), ("S0", "S0", "S0"), (2, 2, 2), (1, 1, 1))[1] == [0, 4, 3]  # 5 -> 2 -> 1 -> 0


#: a run on 3-D meshes only: 8 ranks, the worlds' other meshes set aside (counted as excluded)
ONLY_3D = "len(mesh) < 3"


@pytest.mark.slow
def test_the_reference_is_clean_on_three_d_meshes():
    from shardfuzz.engine.search import run

    result = run(
        TARGET, "reference", profile="shardfuzz-ci", database=None, world_sizes=(8,), exclude=(ONLY_3D,),
        max_examples=40,
    )  # fmt: skip
    assert not result.found, result.report
    assert result.stats.passed >= 40, result.stats.summary()
    assert result.stats.triggers["3-D mesh"] == result.stats.examples, result.stats.summary()


@pytest.mark.slow
def test_a_torch_defect_is_found_and_shrunk_on_a_three_d_mesh():
    """The scan over a negative dim (``torch_scan_negative_dim``) on a (2, 2, 2) mesh: the 3-D
    path reads DTensor's outputs and can fail, and the shrinker keeps the case on three axes."""
    from shardfuzz.engine.search import run

    known = ops.KNOWN["scan over a negative dim"]
    result = run(
        TARGET, "torch_dtensor", profile="shardfuzz-ci", database=None, world_sizes=(8,), max_examples=50,
        exclude=(ONLY_3D, *(v for v in ops.KNOWN.values() if v != known)), options={"op": "aten.cumsum.default"},
    )  # fmt: skip
    assert result.found and result.kind == "mismatch", result.stats.summary()
    case = result.case
    assert case.mesh == (2, 2, 2) and case.options["dim"] < 0, result.report
    print(f"3-D: {case!r}, margin {result.stats.margin:.3g}x")


@pytest.mark.parametrize(("place", "d0", "seed", "slot"), [("R", 2, 0, 1), ("Psum", 4, 2, 0)])
def test_a_signed_zero_keeps_its_sign_through_the_pieces_and_the_reference_gather(place, d0, seed, slot):
    """sqrt's gradient at -0.0 is -inf: the reference's hand gather (a buffer of +0.0) and Psum's
    other pieces (+0.0) turned the edge profile's -0.0 into +0.0, and +inf was reported against the
    oracle's -inf (a false positive of no_false_positives.py --edge, then a reviewer's Psum case)."""
    case = Case.parse(
        "Case(target='dtensor_ops', world_size=2, mesh=(2,), sizes={'d0': 4, 'd1': 1, 'd2': 1}, "
        "split=('d0', 'd1', 'd2'), dtype='float32', profile='edge', seed=2, options={'op': 'aten.sqrt.default', "
        "'ndim': 1, 'place': 'R', 'other_place': 'R', 'backward': True, 'dim': 0, 'dim2': 0, 'dims': '[0]', "
        "'all_dims': False, 'flag0': False, 'flag1': False, 'flag2': False, 'scalar': 0.5, 'scalar2': 0.5, "
        "'small_int': 0, 'perm': '[0]', 'result_dtype': None, 'edge': 'signed_zero', 'edge_exp': 0, 'edge_slot': 0})"
    )
    options = {**case.options, "place": place, "edge_slot": slot}
    case = dataclasses.replace(case, sizes={**case.sizes, "d0": d0}, seed=seed, options=options)
    assert Runner("dtensor_ops").run_case(case) < 1


def test_each_case_starts_with_empty_dtensor_caches():
    """DTensor caches sharding per input spec, and torch 2.13 leaves topk's ``k`` out of the key: a
    rank that ran ``k=2`` gave the next case's ``k=1`` the shape of ``k=2``, a finding its case
    alone passes (a new user's campaign; ``shardfuzz case`` and replay said PASS). This target's
    DTensor path starts each case with empty caches."""
    runner = Runner("dtensor_ops", "torch_dtensor")
    pinned = (("op", "aten.topk.default"), ("place", "R"), ("ndim", 1), ("backward", False))
    case = simplest_case(TARGET.strategy(world_sizes=(2,), options=pinned))[0]
    case = dataclasses.replace(case, sizes={**case.sizes, "d0": 2})
    for k in (1, 0, 1):  # small_int: k = 2, 1, 2 on the same warm ranks
        assert runner.run_case(dataclasses.replace(case, options={**case.options, "small_int": k})) <= 1.0


def test_a_torch_without_the_clearing_helper_clears_the_caches_it_has(monkeypatch):
    """torch 2.5's ``LocalLRUCache`` has no ``cache_clear`` (its ``lru_cache`` is ``.cache``) and
    its ``debug`` module no ``_clear_sharding_prop_cache``: the reset clears what there is, and a
    cache with no way to clear is left as every torch kept it before (no case fails on it)."""
    import types

    import torch.distributed.tensor.debug as debug
    from torch.distributed.tensor import DTensor

    cleared = []
    inner = types.SimpleNamespace(cache_clear=lambda: cleared.append("propagate_op_sharding"))
    propagator = DTensor._op_dispatcher.sharding_propagator
    monkeypatch.delattr(debug, "_clear_sharding_prop_cache")
    monkeypatch.setattr(propagator, "propagate_op_sharding", types.SimpleNamespace(cache=inner))
    monkeypatch.setattr(propagator, "_propagate_tensor_meta", types.SimpleNamespace(), raising=False)
    ops.clear_sharding_caches()
    assert cleared == ["propagate_op_sharding"]


def test_a_cpp_warning_of_target_code_is_printed_once_and_other_lines_as_they_come(capfd):
    """``torch.ops`` calls print C++ warnings straight to fd 2 in torch 2.13, past Python's: a
    campaign on ``var`` printed `degrees of freedom is <= 0` for every case (2,567 lines)."""
    import os

    from shardfuzz.verdict.oracle import CppWarningsOnce

    once = CppWarningsOnce()
    x = torch.randn(1, 3)
    for _ in range(3):
        with once.captured():
            torch.ops.aten.var.correction(x, [0], correction=1)  # dof <= 0: torch warns in C++
            os.write(2, b"a line of its own\n")
    err = capfd.readouterr().err
    assert err.count("var(): degrees of freedom is <= 0") == 1, err
    assert "shardfuzz: torch warned in the target's code (said once): Warning: var(): degrees" in err, err
    assert err.count("a line of its own") == 3, err
