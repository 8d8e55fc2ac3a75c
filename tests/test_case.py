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
