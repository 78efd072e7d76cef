"""hash_once (autoplan/types/hash_once.py): the dataclass's own hash, computed once per instance,
never carried into a pickle or a copy."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import pytest

from autoplan.cost.moe.experts import ExpertPlacement
from autoplan.cost.network.mesh import AxisGroup
from autoplan.types.hash_once import hash_once
from autoplan.types.moe import RoutingModel

HASHED = {"count": 0}


class _Counted:
    """A field whose hash counts its calls."""

    def __hash__(self) -> int:
        HASHED["count"] += 1
        return 7

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Counted)


@hash_once
@dataclass(frozen=True)
class _Key:
    field: _Counted
    size: int = 1


def test_the_fields_are_hashed_once_per_instance():
    HASHED["count"] = 0
    key = _Key(_Counted())
    assert {key: 1}[_Key(_Counted())] == 1 and hash(key) == hash(key)
    assert HASHED["count"] == 2  # once for each instance


@pytest.mark.parametrize(
    "value",
    [
        RoutingModel(imbalance=1.5),
        AxisGroup(size=8, ranks_per_node=8),
        ExpertPlacement(ep=8, imbalance=1.25, group=AxisGroup(size=8, ranks_per_node=4)),
    ],
)
def test_the_search_keys_hash_as_their_dataclass_and_travel_without_it(value):
    fields = tuple(getattr(value, name) for name in value.__dataclass_fields__)
    assert hash(value) == hash(fields)  # the dataclass's own hash: every memo keyed on it is unchanged
    for other in (pickle.loads(pickle.dumps(value)), copy.deepcopy(value), copy.copy(value)):
        assert "_hash_once" not in other.__dict__ and other == value and hash(other) == hash(value)


def test_a_mutable_dataclass_is_refused():
    with pytest.raises(TypeError, match="frozen"):
        hash_once(dataclass(type("Loose", (), {"__annotations__": {"x": int}})))
