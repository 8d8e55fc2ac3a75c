"""The Case: one concrete example, as plain data.

A case is frozen, picklable and JSON-able, and ``repr(case)`` is a single line that rebuilds it,
so the "Falsifying example" line Hypothesis prints can be pasted into ``shardfuzz case``.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from shardfuzz.errors import InvalidArgument

DTYPES = ("float32", "float64", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Case:
    """One example.

    Attributes:
        target: the target's name.
        world_size: number of ranks (processes).
        mesh: the device-mesh shape; its product is ``world_size``. The implementation runs on the
            *last* axis; the other axes hold independent replicas (e.g. ``(2, 2)`` is dp x tp).
            Size-1 axes are allowed.
        sizes: named global sizes, e.g. ``{"hidden": 5}``.
        split: the names of the sizes that are sharded over the implementation's axis.
        dtype: dtype name (a string until it reaches a worker).
        profile: value-profile name (see :mod:`shardfuzz.strategies`).
        seed: seed of the ``torch.Generator`` that builds the inputs.
        options: target options (``causal``, ``top_k``, ``steps``, value-profile parameters, ...).
    """

    target: str
    world_size: int
    mesh: tuple[int, ...]
    sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    split: tuple[str, ...] = ()
    dtype: str = "float32"
    profile: str = "normal"
    seed: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise InvalidArgument(f"world_size={self.world_size!r}; must be an int >= 1")
        mesh = tuple(self.mesh)
        object.__setattr__(self, "mesh", mesh)
        if not mesh or any((not isinstance(m, int)) or m < 1 for m in mesh):
            raise InvalidArgument(f"mesh={self.mesh!r}; must be a non-empty tuple of ints >= 1")
        if math.prod(mesh) != self.world_size:
            raise InvalidArgument(
                f"mesh={mesh!r} has {math.prod(mesh)} ranks but world_size={self.world_size!r}"
            )
        if self.dtype not in DTYPES:
            raise InvalidArgument(f"dtype={self.dtype!r}; allowed: {', '.join(DTYPES)}")
        for name, value in dict(self.sizes).items():
            if not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"sizes[{name!r}]={value!r}; must be an int >= 0")
        object.__setattr__(self, "sizes", dict(self.sizes))
        object.__setattr__(self, "split", tuple(self.split))
        for name in self.split:
            if name not in self.sizes:
                raise InvalidArgument(
                    f"split={self.split!r} names {name!r}, which is not in sizes={self.sizes!r}"
                )
        object.__setattr__(self, "options", dict(self.options))

    # -- derived ---------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Size of the mesh axis the implementation runs on (the last one)."""
        return self.mesh[-1]

    @property
    def replicas(self) -> int:
        """Number of independent replicas of the implementation (product of the other axes)."""
        return self.world_size // self.group_size

    @property
    def replica_ranks(self) -> list[list[int]]:
        """The global ranks of each replica's group (one list per replica)."""
        g = self.group_size
        return [list(range(i * g, (i + 1) * g)) for i in range(self.replicas)]

    def rank_label(self, rank: int) -> str:
        """``rank 3``, or ``rank 3 (replica 1, group rank 1)`` on a mesh of several axes."""
        if len(self.mesh) == 1:
            return f"rank {rank}"
        g = self.group_size
        return f"rank {rank} (replica {rank // g}, group rank {rank % g})"

    def __hash__(self) -> int:
        return hash(self.to_json_str())

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mesh"] = list(self.mesh)
        d["split"] = list(self.split)
        return d

    def to_json_str(self) -> str:
        import json

        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Case:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise InvalidArgument(f"case has unknown field(s) {sorted(unknown)}; allowed: {sorted(fields)}")
        missing = {"target", "world_size", "mesh"} - set(d)
        if missing:
            raise InvalidArgument(f"case is missing field(s) {sorted(missing)}")
        kw = dict(d)
        kw["mesh"] = tuple(kw["mesh"])
        kw["split"] = tuple(kw.get("split", ()))
        return cls(**kw)

    @classmethod
    def parse(cls, text: str) -> Case:
        """Rebuild a case from its ``repr`` (``Case(target=..., ...)``) without ``eval``."""
        try:
            node = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise InvalidArgument(f"case={text!r} is not a Case(...) expression: {e}") from None
        if not (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Case"
            and not node.args
            and all(k.arg is not None for k in node.keywords)  # no **mapping
        ):
            raise InvalidArgument(
                f"case={text!r}; expected Case(target=..., world_size=..., ...) with keywords"
            )
        try:
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        except ValueError as e:
            raise InvalidArgument(f"case={text!r} holds a non-literal value: {e}") from None
        return cls.from_dict(kw)
