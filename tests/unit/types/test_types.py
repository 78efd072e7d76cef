"""The data types between stages validate themselves and round-trip through JSON."""

import json

import pytest

from autoplan.errors import PlanError, ProfileError
from autoplan.types import Graph, GraphError, LayerGroup, OpNode, ParamInfo, Plan
from autoplan.types.profile import COLLECTIVES, Profile


def _plan(**overrides):
    fields = dict(
        devices=8,
        dp=2,
        tp=2,
        pp=2,
        micro_batch_size=1,
        num_microbatches=4,
        stages=[["h.0"], ["h.1"]],
        tp_plan={"h.0.fc": "colwise"},
    )
    fields.update(overrides)
    return Plan(**fields)


def test_plan_round_trips_through_json(tmp_path):
    plan = _plan(predicted={"step_time_s": 1.5})
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path) == plan
    assert json.loads(path.read_text())["dp"] == 2
    assert plan.global_batch_size == 8


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(dp=3), "dp*tp*pp must equal devices"),
        (dict(schedule="zigzag"), "schedule='zigzag'"),
        (dict(zero_stage=4), "zero_stage=4"),
        (dict(recompute="some"), "recompute='some'"),
        (dict(tp_plan={"fc": "diagonal"}), "tp_plan['fc']='diagonal'"),
        (dict(stages=[["h.0"]]), "expected pp*virtual_stages = 2"),
        (dict(stages=[["h.0"], ["h.0"]]), "more than once"),
        (dict(virtual_stages=2), "needs schedule 'interleaved_1f1b'"),
        (dict(micro_batch_size=0), "micro_batch_size=0"),
        (dict(dp=4, tp=1, sequence_parallel=True), "sequence_parallel=true needs tp > 1"),
        (dict(grad_reduce_dtype="int8"), "grad_reduce_dtype='int8'"),
        (dict(grad_compression="signsgd"), "grad_compression='signsgd'; expected one of none, powersgd, topk"),
        (dict(grad_compression="powersgd"), "PowerSGD needs a rank >= 1"),
        (dict(powersgd_rank=4), "powersgd_rank=4 without grad_compression='powersgd'"),
        (dict(grad_compression="powersgd", powersgd_rank=4), "needs dp > 1, tp = pp = ep = 1"),
        (dict(zero_stage=3, overlap_grad_reduce=False), "overlap_grad_reduce=false with ZeRO-2/3"),
        (dict(dp=4, tp=1, ep=3), "plan ep=3 must divide dp=4"),
        (dict(ep=2), "plan ep=2, expert_tp=1 with tp=2 needs sequence_parallel=true"),
        (dict(routing={"imbalance": 0.5}), "MoE imbalance 0.5 must be a number >= 1"),
    ],
)
def test_plan_rejects_bad_fields_with_one_sentence(overrides, words):
    with pytest.raises(PlanError, match=None) as info:
        _plan(**overrides)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_an_expert_parallel_plan_keeps_its_degree_and_routing_model_through_json(tmp_path):
    plan = _plan(dp=4, tp=1, ep=2, routing={"imbalance": 1.5, "capacity_factor": 2.0})
    again = Plan.load(plan.save(tmp_path / "plan.json"))
    assert again == plan and again.routing.capacity_factor == 2.0 and again.ep == 2
    assert "dp=4 ep=2 tp=1" in again.describe()
    assert Plan.from_dict(_plan().to_dict()).routing is None


def test_plan_load_names_unknown_field_and_bad_json(tmp_path):
    data = _plan().to_dict()
    data["dpp"] = 1
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="unknown field 'dpp'"):
        Plan.load(tmp_path / "p.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(tmp_path / "bad.json")
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "missing.json")


def _graph():
    nodes = [
        OpNode(name="x", op="input", target="x", module="", layer=None),
        OpNode(
            name="fc0",
            op="linear",
            target="Linear",
            module="h.0.fc",
            layer="h.0",
            param_count=6,
            fwd_flops=12,
            bwd_flops=24,
        ),
        OpNode(
            name="fc1",
            op="linear",
            target="Linear",
            module="h.1.fc",
            layer="h.1",
            param_count=6,
            fwd_flops=12,
            bwd_flops=24,
        ),
    ]
    params = {f"h.{i}.fc.weight": ParamInfo(shape=[2, 3], dtype="float32", numel=6, bytes=24) for i in range(2)}
    return Graph(
        model_name="toy",
        batch_size=2,
        trace_method="fx",
        nodes=nodes,
        edges=[("x", "fc0"), ("fc0", "fc1")],
        layers=["h.0", "h.1"],
        groups=[LayerGroup(signature="abc", layers=["h.0", "h.1"])],
        parameters=params,
    )


def test_graph_round_trips_and_exposes_networkx(tmp_path):
    graph = _graph()
    loaded = Graph.load(graph.save(tmp_path / "graph.json"))
    assert loaded.to_dict() == graph.to_dict()
    assert list(loaded.nx().successors("fc0")) == ["fc1"]
    assert loaded.param_count == 12 and loaded.step_flops == 72
    assert [n.name for n in loaded.layer_nodes("h.1")] == ["fc1"]


def test_graph_rejects_dangling_edges_and_bad_ops():
    graph = _graph()
    with pytest.raises(GraphError, match="names a node that does not exist"):
        Graph(**{**graph.__dict__, "edges": [("x", "nope")]})
    with pytest.raises(GraphError, match="op 'conv2d'"):
        OpNode(name="c", op="conv2d", target="", module="", layer=None)
    with pytest.raises(GraphError, match="cover every layer"):
        Graph(**{**graph.__dict__, "groups": [LayerGroup(signature="a", layers=["h.0"])]})


def _profile_dict():
    fit = {"alpha_s": 1e-5, "busbw_bytes_per_s": 1e11, "source": "test"}
    return {
        "name": "toy",
        "devices_per_node": 8,
        "device": {
            "name": "gpu",
            "memory_bytes": 80e9,
            "peak_flops": {"bf16": 3e14},
            "memory_bandwidth_bytes_per_s": 2e12,
            "source": "datasheet",
            "efficiency": {"matmul": {"max_efficiency": 0.8, "half_saturation_flops": 1e9, "source": "fit"}},
        },
        "intra_node": {"name": "nvlink", "collectives": {k: dict(fit) for k in COLLECTIVES}},
    }


def test_profile_builds_from_dict_and_efficiency_saturates():
    profile = Profile.from_dict(_profile_dict())
    eff = profile.device.efficiency["matmul"]
    assert eff(1e9) == pytest.approx(0.4)
    assert eff(1e15) == pytest.approx(0.8, rel=1e-5)
    assert profile.link(spans_nodes=False).name == "nvlink"
    with pytest.raises(ProfileError, match="no inter_node link"):
        profile.link(spans_nodes=True)


@pytest.mark.parametrize(
    "path, value, words",
    [
        (("device", "peak_flops"), {"bf17": 1.0}, "dtype 'bf17'"),
        (("device", "memory_bandwidth_bytes_per_s"), -1, "'device.memory_bandwidth_bytes_per_s' is -1"),
        (("device", "source"), "", "'device.source'"),
        (("devices_per_node",), 0, "'devices_per_node' is 0"),
    ],
)
def test_profile_names_the_bad_field(path, value, words):
    data = _profile_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(data)
    assert words in str(info.value)


def test_profile_requires_every_collective():
    data = _profile_dict()
    del data["intra_node"]["collectives"]["all_to_all"]
    with pytest.raises(ProfileError, match="has no 'all_to_all'"):
        Profile.from_dict(data)


def test_the_prediction_is_typed_and_keeps_plan_json_s_shape(tmp_path):
    from autoplan.errors import PlanError
    from autoplan.types import Prediction, SearchSummary

    data = {
        "step_time_s": 2.0,
        "samples_per_s": 4.0,
        "mfu": 0.5,
        "breakdown": {"compute_s": 1.5},
        "memory": {"weights_bytes": 8},
        "search": {"candidates_evaluated": 3, "batch_size": 8, "fixes": {"tp": 2}, "objective": "time"},
    }
    plan = _plan(predicted=data)
    assert isinstance(plan.predicted, Prediction) and isinstance(plan.predicted.search, SearchSummary)
    assert plan.predicted.step_time_s == 2.0 and plan.predicted.search.fixes == {"tp": 2}
    saved = json.loads(plan.save(tmp_path / "plan.json").read_text())["predicted"]
    assert saved["breakdown"] == {"compute_s": 1.5} and saved["search"]["batch_size"] == 8 and "tokens_per_s" in saved
    assert Plan.load(tmp_path / "plan.json") == plan
    assert _plan(predicted={}).predicted is None and _plan().to_dict()["predicted"] == {}
    with pytest.raises(PlanError, match="unknown term 'compute'"):
        _plan(predicted={"step_time_s": 1.0, "breakdown": {"compute": 1.0}})
    with pytest.raises(PlanError, match="no 'step_time_s'"):
        _plan(predicted={"mfu": 0.3})
    with pytest.raises(PlanError, match="step_time_s=-1"):
        _plan(predicted={"step_time_s": -1})
