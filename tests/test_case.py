import json

import pytest

from shardfuzz import Case, InvalidArgument


def make(**kw):
    base = dict(
        target="tp_mlp",
        world_size=4,
        mesh=(2, 2),
        sizes={"hidden": 5},
        split=("hidden",),
        dtype="bfloat16",
        profile="large",
        seed=7,
        options={"scale": 100.0},
    )
    base.update(kw)
    return Case(**base)


def test_repr_is_one_line_that_rebuilds_the_case():
    c = make()
    text = repr(c)
    assert "\n" not in text
    assert Case.parse(text) == c
    assert eval(text, {"Case": Case}) == c


def test_json_round_trip():
    c = make()
    assert Case.from_dict(json.loads(c.to_json_str())) == c
    assert hash(c) == hash(Case.from_dict(c.to_dict()))


def test_equal_cases_hash_equal_and_a_dataclass_option_still_hashes():
    """The hash reads sizes and options as JSON text; an option JSON cannot write as it is (a
    dataclass) goes through to_json_str (dataclasses.asdict), as every hash did before."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Grid:
        rows: int

    a = Case(target="t", world_size=2, mesh=(2,), sizes={"n": 3, "m": 1}, options={"grid": Grid(2)})
    b = Case(target="t", world_size=2, mesh=(2,), sizes={"m": 1, "n": 3}, options={"grid": Grid(2)})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert hash(a) == hash(a.to_json_str())  # the asdict path
    c = dataclasses.replace(a, options={"grid": Grid(3)})
    assert len({a, c}) == 2
    plain = Case(target="t", world_size=2, mesh=(2,), sizes={"n": 3}, options={"k": [1, 2]})
    assert hash(plain) == hash(Case.from_dict(plain.to_dict())) and hash(plain) != hash(plain.to_json_str())


def test_derived_sizes():
    c = make()
    assert (c.group_size, c.replicas) == (2, 2)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(mesh=(3,)), r"mesh=\(3,\) has 3 ranks but world_size=4"),
        (dict(dtype="int8"), "dtype='int8'; allowed"),
        (dict(world_size=0, mesh=(0,)), "world_size=0"),
        (dict(sizes={"hidden": -1}), r"sizes\['hidden'\]=-1"),
        (dict(split=("nope",)), "names 'nope'"),
        (dict(mesh=4), r"mesh=4; must be a non-empty tuple of ints >= 1, e.g. \(4,\)"),
        (dict(mesh=(2, True)), r"mesh=\(2, True\)"),
        (dict(world_size=True, mesh=(1,)), "world_size=True; must be an int"),
        (dict(sizes=[1, 2]), r"sizes=\[1, 2\]; must be a dict"),
        (dict(sizes={"hidden": 2.0}), r"sizes\['hidden'\]=2.0"),
        (dict(sizes={"hidden": True}), r"sizes\['hidden'\]=True"),
        (dict(sizes={1: 2}, split=()), "size names must be strings"),
        (dict(split="hidden"), "split='hidden'; must be a tuple of size names"),
        (dict(options=[1]), r"options=\[1\]; must be a dict"),
        (dict(seed="a"), "seed='a'; must be an int"),
        (dict(seed=0.5), "seed=0.5; must be an int"),
        (dict(seed=-1), "seed=-1; must be an int"),
        (dict(profile="bogus"), "profile='bogus'; allowed: normal, large, small, ties"),
        (dict(target=""), "target=''"),
    ],
)
def test_invalid_cases_name_the_argument(kw, match):
    with pytest.raises(InvalidArgument, match=match):
        make(**kw)


def test_parse_refuses_code():
    with pytest.raises(InvalidArgument, match="non-literal"):
        Case.parse("Case(target=__import__('os').getcwd(), world_size=1, mesh=(1,))")
    with pytest.raises(InvalidArgument, match="expected Case"):
        Case.parse("print(1)")


def test_from_dict_validates_every_field():
    with pytest.raises(InvalidArgument, match="must be an object of Case fields"):
        Case.from_dict([1, 2])
    with pytest.raises(InvalidArgument, match="mesh=2"):
        Case.from_dict({"target": "t", "world_size": 2, "mesh": 2})
    assert Case.from_dict({"target": "t", "world_size": 2, "mesh": [2], "split": []}).mesh == (2,)


def test_value_profiles_have_one_source():
    import shardfuzz.strategies as sst
    from shardfuzz.case import VALUE_PROFILES

    assert tuple(sst.PROFILES) == VALUE_PROFILES
