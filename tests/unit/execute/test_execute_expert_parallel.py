"""Expert parallelism's pieces that need no process group: the plans it refuses (one sentence
each), the experts it finds, the dispatch's copy of a module, the pipeline split's opaque op,
the grouped-GEMM FLOPs the audit counts, and the gradients examples/moe.py's expert loop makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autoplan.errors import PlanError
from autoplan.execute.expert_dispatch import ExpertsDispatch
from autoplan.execute.expert_parallel import check_expert_parallel, find_experts
from autoplan.execute.job.meters import MatmulFlops
from autoplan.execute.pipeline import split_model
from autoplan.types.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture
def moe(monkeypatch):
    """examples/moe.py at a small size (its module, freshly loaded)."""
    for name, value in dict(LAYERS=2, DIM=16, HEADS=2, EXPERTS=4, VOCAB=64, SEQ=8).items():
        monkeypatch.setenv(f"AUTOPLAN_MOE_{name}", str(value))
    spec = importlib.util.spec_from_file_location("moe_example", EXAMPLES / "moe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan(**kw) -> Plan:
    kw.setdefault("dp", 2)
    return Plan(
        devices=kw["dp"] * kw.get("pp", 1), tp=1, pp=kw.pop("pp", 1), micro_batch_size=2, num_microbatches=1, **kw
    )


class ListMoE(nn.Module):
    """Experts as a ModuleList beside a router with one output per expert (not the HF interface)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 4, bias=False)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.top_k = 2  # it picks experts (no forward here: trace/moe.py reads the attribute)


def test_an_ep_the_model_cannot_run_is_one_sentence(moe):
    model = moe.build_model()
    found = find_experts(model)
    with pytest.raises(PlanError, match=r"^plan ep=3 does not divide the 4 experts of 'layers.0.moe.experts'; "
                                        r"choose an ep that divides 4\.$"):  # fmt: skip
        check_expert_parallel(model=model, plan=plan(dp=3, ep=3), dispatches=found)
    listed = nn.Sequential(ListMoE())
    with pytest.raises(PlanError, match=r"'0.experts' holds its experts as separate modules; plan ep=1"):
        check_expert_parallel(model=listed, plan=plan(ep=2), dispatches=find_experts(listed))
    dense = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(
        PlanError,
        match=r"^plan ep=2, expert_tp=1 but the model has no experts module .* ep=1 and expert_tp=1 for this model\.$",
    ):
        check_expert_parallel(model=dense, plan=plan(ep=2), dispatches={})
    check_expert_parallel(model=model, plan=plan(ep=2, zero_stage=3), dispatches=found)
    check_expert_parallel(model=listed, plan=plan(ep=1), dispatches={})  # ep=1 runs any MoE


def test_the_experts_own_layout_beside_tp_runs_at_zero_0_and_is_refused_otherwise(moe):
    """The executor folds ep over tp ranks and splits the experts over expert_tp at ZeRO 0 and 1 (docs/moe.md,
    "Expert tensor parallelism"); a folded plan under ZeRO-2/3, or expert_tp > 1 at tp = 1, is one sentence."""
    model = moe.build_model()
    folded = dict(devices=4, dp=2, tp=2, pp=1, micro_batch_size=2, num_microbatches=1, sequence_parallel=True)
    for kw in (dict(ep=2), dict(ep=1, expert_tp=2), dict(ep=2, expert_tp=2), dict(ep=1, expert_tp=2, zero_stage=1)):
        check_expert_parallel(model=model, plan=Plan(**folded, **kw), dispatches=find_experts(model))
    for kw in (dict(ep=1, expert_tp=2, zero_stage=2), dict(ep=2, zero_stage=3)):
        with pytest.raises(PlanError, match=r"autoplan's executor runs the experts' own layout beside tp > 1 at zero"):
            check_expert_parallel(model=model, plan=Plan(**folded, **kw), dispatches=find_experts(model))
    dp_only = dict(devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, expert_tp=2)
    with pytest.raises(PlanError, match=r"^plan expert_tp=2 at tp=1: autoplan's executor splits"):
        check_expert_parallel(model=model, plan=Plan(**dp_only), dispatches=find_experts(model))


def test_expert_tp_splits_only_the_bias_free_projections_of_the_experts_interface(moe):
    """Each projection's FFN dim over etp (execute/expert_tp.py): a fused gate_up in its two halves, each sharded;
    a per-expert parameter that is no projection (a bias) is one sentence."""
    from autoplan.execute.expert_tp import EtpSplit, etp_splits

    model = moe.build_model()
    experts = model.layers[0].moe.experts
    assert etp_splits(experts, ("up_proj", "down_proj"), fqn="e") == {"up_proj": EtpSplit(1), "down_proj": EtpSplit(2)}
    experts.is_transposed = True
    assert etp_splits(experts, ("gate_up_proj", "down_proj"), fqn="e") == {
        "gate_up_proj": EtpSplit(2, halves=2), "down_proj": EtpSplit(1)
    }  # fmt: skip
    fused = torch.arange(2 * 8 * 3).view(2, 8, 3)  # [E, gate 4 | up 4, H]
    mine = EtpSplit(1, halves=2).local(fused, rank=1, size=2)
    torch.testing.assert_close(mine, torch.cat([fused[:, 2:4], fused[:, 6:8]], dim=1))
    with pytest.raises(PlanError, match=r"^plan expert_tp > 1 cannot split 'e.down_proj_bias' .* expert_tp=1 for"):
        etp_splits(experts, ("down_proj_bias",), fqn="e")
    model.layers[0].moe.experts.bias = torch.nn.Parameter(torch.zeros(4, 16))
    plan = Plan(
        devices=2, dp=1, tp=2, pp=1, micro_batch_size=2, num_microbatches=1, sequence_parallel=True, expert_tp=2
    )
    with pytest.raises(PlanError, match=r"cannot split 'layers.0.moe.experts.bias'"):
        check_expert_parallel(model=model, plan=plan, dispatches=find_experts(model))


def test_zero_2_3_refuse_experts_with_a_parameter_shared_by_all_experts(moe):
    model = moe.build_model()
    model.layers[0].moe.experts.post_norm = nn.LayerNorm(16)
    found = find_experts(model)
    sentence = (
        r"^plan ep=2 with ZeRO-2 cannot shard 'layers.0.moe.experts', whose parameter 'post_norm.weight' is shared "
        r"by all its experts; plan zero_stage 0 or 1 for this model\.$"
    )
    with pytest.raises(PlanError, match=sentence):
        check_expert_parallel(model=model, plan=plan(ep=2, zero_stage=2), dispatches=found)
    check_expert_parallel(model=model, plan=plan(ep=2, zero_stage=1), dispatches=found)


def test_each_experts_module_gets_a_dispatch_over_its_per_expert_parameters(moe):
    model = moe.build_model()
    found = find_experts(model)
    assert list(found) == ["layers.0.moe.experts", "layers.1.moe.experts"]
    dispatch = found["layers.0.moe.experts"]
    assert (dispatch.num_experts, dispatch.names, dispatch.sharded) == (
        4,
        ("up_proj", "down_proj"),
        ("up_proj", "down_proj"),
    )
    template = dispatch.template
    assert all(p.device.type == "meta" for p in template.parameters())  # it keeps no weights alive
    assert template._forward_pre_hooks is not model.layers[0].moe.experts._forward_pre_hooks


def test_the_dispatch_without_a_group_is_the_modules_own_forward(moe):
    torch.manual_seed(0)
    experts = moe.build_model().layers[0].moe.experts
    dispatch = ExpertsDispatch(fqn="e", module=experts)
    hidden, index, weights = torch.randn(6, 16), torch.randint(0, 4, (6, 2)), torch.rand(6, 2)
    params = [experts.get_parameter(n) for n in dispatch.names]
    torch.testing.assert_close(
        dispatch(hidden, index, weights, params), experts(hidden, index, weights), rtol=0, atol=0
    )


def test_a_pipeline_split_runs_the_experts_through_their_dispatch(moe):
    """torch.export cannot trace the experts' data-dependent loop: the split exports each as one
    opaque op, then the stage graphs call its dispatch; the stages chained give the eager output."""
    torch.manual_seed(0)
    model = moe.build_model()
    x = moe.example_inputs(2)
    expected = model(*x)
    found = find_experts(model)
    pipe, _ = split_model(model=model, plan=plan(dp=1, pp=2, stages=[["layers.0"], ["layers.1"]]),
                          microbatch_args=x, experts=found)  # fmt: skip
    targets = [
        n.target for i in range(2) for m in pipe.get_stage_module(i).modules() if hasattr(m, "graph")
        for n in m.graph.nodes if n.op == "call_function"
    ]  # fmt: skip
    assert sum(t is found[name] for t in targets for name in found) == 2
    assert not any(t is torch.ops.autoplan.experts.default for t in targets)
    out = pipe.get_stage_module(1)(pipe.get_stage_module(0)(*x))
    torch.testing.assert_close(out, expected)
    assert "forward" not in model.layers[0].moe.experts.__dict__  # the model is left as it was


def test_grouped_gemms_are_counted_as_matmul_flops():
    a, b = torch.randn(12, 8, requires_grad=True), torch.randn(3, 8, 4, requires_grad=True)  # 16-byte strides
    offs = torch.tensor([4, 4, 12], dtype=torch.int32)  # an empty group too
    with MatmulFlops() as meter:
        out = torch._grouped_mm(a, b, offs=offs)
        out.backward(torch.randn_like(out))
    forward, backward = meter.flops["matmul"]
    assert forward == 2 * 12 * 8 * 4 and backward == 2 * forward  # input and weight gradients


def test_the_audit_measures_the_routing_imbalance_from_the_rows_each_rank_received():
    """execute/job/routing_audit.py: per stage, the busiest rank's rows over the mean; one audit row per rank
    against its stage's mean; ranks without experts add none."""
    from autoplan.execute.job.routing_audit import measured_imbalance, routing_rows

    ranks = [{"stage": 0, "expert_rows": 300}, {"stage": 0, "expert_rows": 100}, {"stage": 1}]
    assert measured_imbalance(ranks) == {0: 1.5}
    rows = routing_rows(ranks, lambda *args: args)
    assert rows == [
        (0, 0, "expert rows received", 300, 200.0, "rows"),
        (1, 0, "expert rows received", 100, 200.0, "rows"),
    ]
    assert measured_imbalance([{"stage": 0}]) == {}


def _rank(expert_rows: int | None, a2a_bytes: float, flops: float, peak: float) -> dict:
    """A rank's audit record (execute/job/audit.py) with the rows its experts received, or none."""
    record = {
        "stage": 0, "comm": [["dp", "all_reduce", 1, 1000], ["ep", "all_to_all", 20, a2a_bytes]],
        "placement": {"param_elements": 10}, "forward_flops": flops, "backward_flops": 2 * flops,
        "attention_forward_flops": 0.0, "attention_backward_flops": 0.0, "peak_live_bytes": peak,
    }  # fmt: skip
    return record if expert_rows is None else {**record, "expert_rows": expert_rows}


def test_the_audit_prices_each_rank_at_the_rows_its_experts_received():
    """execute/job/routing_audit.py ``at_routing``: the routed all-to-all bytes, the FLOP rows and the peak are
    compared with the balanced price plus the rank's rows over the balanced ones times what a row adds
    (types/audit_prediction.py); the dp all-reduce keeps its price, and a record without rows the balanced one."""
    from autoplan.execute.job.audit import audit_rows
    from autoplan.types.audit_prediction import StageAuditPrediction

    per_row = {"comm ep all_to_all": 512.0, "forward_flops": 64.0, "backward_flops": 128.0, "peak_bytes": 1000.0}
    pred = StageAuditPrediction(
        comm={("dp", "all_reduce"): [1, 1000.0], ("ep", "all_to_all"): [20, 524416.0]},
        param_elements=10, forward_flops=50000.0, backward_flops=100000.0, peak_bytes=2e6,
        expert_rows=512.0, per_expert_row=per_row, balanced_peak_bytes=1.5e6,
    )  # fmt: skip
    ranks = [_rank(506, 524416.0 - 6 * 512, 50000.0 - 6 * 64, 1.5e6 - 6000), _rank(None, 524416.0, 50000.0, 2e6)]
    rows = audit_rows(ranks=ranks, predictions=[pred], stage_peak_bytes=[2e6])
    got = {(r["rank"], r["what"]): (r["predicted"], r["as_priced"]) for r in rows}
    assert got[0, "comm ep all_to_all"] == (524416.0 - 6 * 512, True)
    assert got[0, "forward matmul FLOPs"] == (50000.0 - 6 * 64, True)
    assert got[0, "backward matmul FLOPs"] == (100000.0 - 6 * 128, True)
    assert got[0, "peak live memory"] == (1.5e6 - 6000, True)
    assert got[0, "comm dp all_reduce"] == (1000.0, True)
    assert got[1, "comm ep all_to_all"] == (524416.0, True) and got[1, "peak live memory"] == (2e6, True)


class NewStorages(TorchDispatchMode):
    """The shapes of the tensors each op of a backward makes in new storage (views and in-place results left out)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.shapes.append(tuple(t.shape))
        return out


def test_the_moe_examples_backward_makes_one_gradient_per_expert_weight(moe):
    """examples/moe.py loops over its experts on views from one ``unbind`` of each 3-D weight, so the backward
    makes one ``[E, ...]`` tensor per weight (unbind's stack). Indexing ``weight[e]`` made a zero-filled
    ``[E, ...]`` gradient per expert and summed them out of place, 2E - 1 per weight, four of them alive beside
    the gradients at the audit's moe_tp peak (docs/cost-model.md, "The execution audit")."""
    experts = moe.Experts()
    index = torch.tensor([[e, (e + 1) % 4] for e in range(4)] * 2)  # every expert receives rows
    hidden = torch.randn(len(index), experts.up_proj.shape[-1], requires_grad=True)
    out = experts(hidden, index, torch.rand(len(index), 2))
    with NewStorages() as made:
        out.pow(2).sum().backward()
    whole = {tuple(experts.up_proj.shape), tuple(experts.down_proj.shape)}
    assert sorted(s for s in made.shapes if s in whole) == sorted(whole)
