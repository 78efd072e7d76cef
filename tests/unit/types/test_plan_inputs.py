"""A plan keeps the shapes and dtypes of the inputs it was traced with (types/inputs.py), so
``parallelize`` can build a pipeline's micro-batch itself: traced into the graph, copied into the
plan, through JSON and back; plans and graphs written before load as they did."""

import json

import pytest
import torch

import autoplan
from autoplan.errors import PlanError
from autoplan.execute.batch import microbatch_from_specs
from autoplan.types import Graph, GraphError, Plan
from autoplan.types.inputs import InputSpec


class _Tagger(torch.nn.Module):
    """Token ids, a per-sample float feature, a table that is not batched, and a scalar."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))

    def forward(self, ids, feature, table, scale):
        x = self.embed(ids) + feature.unsqueeze(-1) + table.sum()
        for block in self.blocks:
            x = block(x)
        return x * scale


@pytest.fixture(scope="module")
def planned():
    inputs = (torch.zeros(4, 6, dtype=torch.long), torch.ones(4, 6), torch.ones(3, 5), 2)
    return autoplan.plan(_Tagger(), inputs, devices=1, profile="cpu-gloo", batch_size=4)


def test_the_plan_records_each_input_and_which_are_batched(planned):
    assert planned.inputs == [
        InputSpec(kind="tensor", shape=[4, 6], dtype="int64", batched=True),
        InputSpec(kind="tensor", shape=[4, 6], dtype="float32", batched=True),
        InputSpec(kind="tensor", shape=[3, 5], dtype="float32", batched=False),
        InputSpec(kind="value", value=2),
    ]


def test_inputs_round_trip_through_json_and_build_a_microbatch(planned, tmp_path):
    loaded = Plan.load(planned.save(tmp_path / "plan.json"))
    assert loaded.inputs == planned.inputs
    ids, feature, table, scale = microbatch_from_specs(loaded.inputs, micro_batch_size=2)
    assert (ids.shape, ids.dtype, feature.shape, table.shape, scale) == ((2, 6), torch.int64, (2, 6), (3, 5), 2)


def test_plans_and_graphs_without_inputs_load_as_before(planned, tmp_path):
    data = planned.to_dict()
    del data["inputs"]
    assert Plan.from_dict(data).inputs == []
    assert "inputs" not in Plan.from_dict(data).to_dict()  # an old plan is written back unchanged
    from synthetic import synthetic_gpt

    graph = synthetic_gpt(layers=2, hidden=64, heads=4, vocab=64, seq=16, batch=8).to_dict()
    graph.pop("inputs", None)
    assert Graph.from_dict(json.loads(json.dumps(graph))).inputs == []
    with pytest.raises(GraphError, match="graph input kind='array'"):
        Graph.from_dict(graph | {"inputs": [{"kind": "array"}]})


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"kind": "tensor", "shape": [2], "dtype": "float128"}, "plan input dtype='float128'; expected one of"),
        ({"kind": "tensor", "shape": [-1], "dtype": "int64"}, r"plan input shape=\[-1\]; expected a list of sizes"),
        ({"kind": "array"}, "plan input kind='array'; expected one of tensor, value"),
        ({"kind": "value", "value": [1]}, r"plan input value=\[1\]; expected a JSON scalar"),
        ({"kind": "value", "colour": 1}, "plan input has unknown field 'colour'"),
    ],
)
def test_a_malformed_input_is_one_sentence(planned, spec, words):
    data = planned.to_dict() | {"inputs": [spec]}
    with pytest.raises(PlanError, match=words):
        Plan.from_dict(data)
