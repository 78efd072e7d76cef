"""Route tokens to experts held on other ranks: the forward of one experts module under expert
parallelism, and the opaque op that lets torch.export (the pipeline split) step over it
(docs/executor.md, "Expert parallelism": the five steps, tensor parallelism, pipelines).

An experts module in the Hugging Face interface is called as ``experts(hidden [S, H], top_k_index
[S, k], top_k_weights [S, k]) -> [S, H]``; each of ``ep`` ranks holds ``L = E / ep`` consecutive
experts. :meth:`ExpertsDispatch.__call__` sorts the ``S k`` pairs by expert, exchanges the
per-expert counts, all-to-alls the rows (:class:`GroupAllToAll`), runs the module's own
forward on them (``torch.func.functional_call`` with ``num_experts = L``), all-to-alls the outputs
back and sums each token's ``k`` weighted choices: the model's result up to the order of sums. At
expert_tp > 1 the etp group shares its received rows around each local expert's FFN shard
(autoplan/execute/expert_tp.py), with ep = 1 too. At ``ep = 1`` under tensor parallelism the experts run
replicated on local tensors. Under a pipeline,
:func:`opaque_experts` exports each module as the op ``autoplan::experts`` and
:func:`replace_experts_ops` points the stage graphs' nodes back at the dispatch.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
from torch.distributed._functional_collectives import all_to_all_single, wait_tensor
from torch.distributed.tensor import DTensor, Replicate

from autoplan.execute import expert_tp
from autoplan.execute.ep_lanes import LaneAllToAll, Lanes
from autoplan.execute.ep_lanes import exchange as lane_exchange
from autoplan.trace.forwards import replaced_forwards

OP_NAME = "autoplan::experts"


@torch.library.custom_op(OP_NAME, mutates_args=())
def experts_op(
    fqn: str, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, params: list[torch.Tensor]
) -> torch.Tensor:
    """A stand-in that only torch.export sees (module docstring); never run for real."""
    raise AssertionError(f"autoplan::experts ({fqn}) ran unreplaced; split_model points it at the experts' dispatch.")


@experts_op.register_fake
def _experts_op_fake(fqn, hidden, index, weights, params):
    return hidden.new_empty(hidden.shape)


def _wire_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype rows travel in: the autocast dtype under autocast (the experts' first GEMM casts
    its input to it anyway, and their output is in it; Megatron-Core and DeepEP dispatch in the
    compute dtype too), else the hidden states' own. This is what the cost model prices
    (autoplan/cost/moe/experts.py: b bytes of the plan's precision)."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


class ExpertsDispatch:
    """The forward of one experts module, on the parameters it is given (module docstring).

    ``group`` None: the module's own forward (pipelines at ep = 1). Otherwise this rank holds
    experts ``rank * L ... (rank + 1) * L - 1`` of ``num_experts`` and exchanges rows over ``group``."""

    __name__ = "autoplan_experts_dispatch"  # torch.fx names a call_function target by it

    def __init__(self, *, fqn: str, module: nn.Module):
        self.fqn = fqn
        self.num_experts = int(module.num_experts)
        self.names = tuple(name for name, _ in module.named_parameters())
        self.sharded = tuple(
            name for name, p in module.named_parameters() if p.dim() >= 1 and p.shape[0] == self.num_experts
        )
        self.template = _template(module)
        self.group: dist.ProcessGroup | None = None
        self.ep, self.ep_rank = 1, 0
        self.etp_group: dist.ProcessGroup | None = None  # expert tensor parallelism (expert_tp.py)
        self.etp, self.etp_rank = 1, 0
        self.rows_received = 0  # (token, choice) rows routed to this rank's experts, for the audit's imbalance
        self.lanes: Lanes | None = None  # moe_a2a_overlap: the ep group's two lanes (ep_lanes.py)

    def shard(self, *, group: dist.ProcessGroup, etp_group: dist.ProcessGroup | None = None) -> None:
        """From now on this rank holds its ``E / ep`` experts and exchanges rows over ``group``; with an
        ``etp_group`` of more than one rank, ``1 / expert_tp`` of each one's FFN (autoplan/execute/expert_tp.py)."""
        self.group, self.ep, self.ep_rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.template.num_experts = self.num_experts // self.ep
        if etp_group is not None and dist.get_world_size(etp_group) > 1:
            self.etp_group, self.etp, self.etp_rank = (
                etp_group,
                dist.get_world_size(etp_group),
                dist.get_rank(etp_group),
            )

    def __call__(
        self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, params: list[torch.Tensor]
    ) -> torch.Tensor:
        mesh = next((t.device_mesh for t in (hidden, index, weights, *params) if isinstance(t, DTensor)), None)
        if mesh is not None:
            return self._replicated(mesh, hidden, index, weights, params)
        named = dict(zip(self.names, params))
        if self.group is None:
            return torch.func.functional_call(self.template, named, (hidden, index, weights))
        return self._exchanged(hidden, index, weights, named)

    def _replicated(self, mesh, hidden, index, weights, params) -> torch.Tensor:
        """tp > 1: the whole experts module on this rank's full copies (module docstring)."""
        out = self(*(_local(t) for t in (hidden, index, weights)), [_local(p) for p in params])
        return (
            DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim, run_check=False)
            if isinstance(hidden, DTensor)
            else out
        )

    def _exchanged(
        self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, params: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        k, local = index.shape[-1], self.num_experts // self.ep
        flat = index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, choice) pairs sorted by expert
        tokens = order // k
        sent = torch.bincount(flat, minlength=self.num_experts)  # pairs per expert, [E]
        wire = _wire_dtype(hidden)
        if self.ep == 1:  # expert_tp alone: this rank's rows stay here, sorted by expert
            received, send_splits = sent, [int(sent.sum())]
            rows = hidden[tokens].to(wire)
        else:
            # [ep, L]: what each rank sends to each of my experts
            received = expert_tp.exchange(sent, self.group) if self.lanes is None else lane_exchange(sent, self.lanes)
            send_splits = sent.view(self.ep, local).sum(1).tolist()
            recv_splits = received.view(self.ep, local).sum(1).tolist()
            rows = self._all_to_all(hidden[tokens].to(wire), recv_splits, send_splits)
        self.rows_received += sum(send_splits if self.ep == 1 else recv_splits)
        out = self._expert_rows(rows, received, weights.dtype, params).to(wire)
        back = out if self.ep == 1 else self._all_to_all(out, send_splits, recv_splits)
        weighted = back * weights.reshape(-1)[order].unsqueeze(-1)  # keeps ``back`` for the weights' gradient
        # each token's k choices back in pair order and summed: index_add would keep its source too (its backward
        # reads source.dim()), a second copy of the combined rows (cost/moe/experts.py ``dispatch_saved_bytes``)
        summed = weighted[torch.argsort(order)].view(*hidden.shape[:-1], k, -1).sum(-2)
        return summed.to(hidden.dtype)

    def _all_to_all(self, rows: torch.Tensor, recv_splits: list[int], send_splits: list[int]) -> torch.Tensor:
        """``rows`` exchanged over the ep group: on the calling thread's lane under moe_a2a_overlap (ep_lanes.py)."""
        if self.lanes is not None:
            return LaneAllToAll.apply(rows, recv_splits, send_splits, self.lanes)
        return GroupAllToAll.apply(rows, recv_splits, send_splits, self.group)

    def _expert_rows(
        self, rows: torch.Tensor, received: torch.Tensor, weight_dtype: torch.dtype, params: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """This rank's experts on the ``rows`` it received (``received``: how many per source rank and local
        expert); at expert_tp > 1 on the etp group's rows, gathered and the partial outputs reduce-scattered
        (autoplan/execute/expert_tp.py)."""
        local = self.num_experts // self.ep
        if self.etp == 1:
            ids = torch.arange(local, device=rows.device).repeat(self.ep).repeat_interleave(received)
            return self._local_experts(rows, ids, weight_dtype, params)
        counts = expert_tp.exchange_counts(received, self.etp_group)  # [etp, ep * L]
        sizes = counts.sum(1).tolist()
        gathered = expert_tp.gather_rows(rows, sizes, self.etp_group)
        ids = torch.arange(local, device=rows.device).repeat(self.ep * self.etp).repeat_interleave(counts.reshape(-1))
        partial = self._local_experts(gathered, ids, weight_dtype, params).to(rows.dtype)
        return expert_tp.scatter_rows(partial, sizes, self.etp_rank, self.etp_group)

    def _local_experts(
        self, rows: torch.Tensor, ids: torch.Tensor, weight_dtype: torch.dtype, params: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """This rank's experts on the rows it received, through the module's own forward."""
        if rows.shape[0] == 0:  # keep the backward all-to-all and every parameter's gradient on this rank
            return rows * 0 + sum(p.reshape(-1)[:0].sum() for p in params.values())
        unit = torch.ones(rows.shape[0], 1, dtype=weight_dtype, device=rows.device)
        return torch.func.functional_call(self.template, params, (rows, ids.unsqueeze(-1), unit))


class GroupAllToAll(torch.autograd.Function):
    """``rows`` exchanged over ``group`` (``recv_splits`` rows from each rank, ``send_splits`` to each), the
    gradient back the other way: one tensor out, where torch's ``all_to_all_single_autograd`` returns its result
    wrapped (``_wrap_tensor_autograd``) beside the collective's own output, both kept while the combined rows are
    saved for the backward (a third copy of them per layer and micro-batch, measured by the execution audit)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, recv_splits: list[int], send_splits: list[int], group):
        ctx.splits, ctx.group = (recv_splits, send_splits), group
        return wait_tensor(all_to_all_single(rows.contiguous(), recv_splits, send_splits, group))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        recv_splits, send_splits = ctx.splits
        return wait_tensor(all_to_all_single(grad.contiguous(), send_splits, recv_splits, ctx.group)), None, None, None


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value as a local tensor (differentiable); a tensor as it is."""
    if not isinstance(tensor, DTensor):
        return tensor
    return tensor.redistribute(tensor.device_mesh, [Replicate()] * tensor.device_mesh.ndim).to_local()


def _template(module: nn.Module) -> nn.Module:
    """A shallow copy of ``module`` to run its class's forward on given parameters: its own
    parameter and buffer dicts (meta placeholders, so it keeps no weights alive), the
    module's submodules and attributes shared, no per-instance forward."""
    template = copy.copy(module)
    template.__dict__.pop("forward", None)
    template._parameters = {
        name: nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) if p is not None else None
        for name, p in module._parameters.items()
    }
    template._buffers = dict(module._buffers)
    for key, value in module.__dict__.items():
        if "hooks" in key and isinstance(value, (dict, set)):  # hooks FSDP2 and others add to ``module`` later
            template.__dict__[key] = type(value)()
    return template


def install(*, module: nn.Module, dispatch: ExpertsDispatch) -> None:
    """Make ``module`` (an eager experts module) run ``dispatch`` on its current parameters
    (FSDP2's gathered ones during its forward)."""

    def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        return dispatch(hidden_states, top_k_index, top_k_weights, [_param(module, n) for n in dispatch.names])

    module.forward = forward


def _param(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s parameter ``name`` as it holds it now: FSDP2's gathered one, or the tensor
    ``torch.func.functional_call`` put in its place (autoplan/execute/expert_sequence.py), which
    ``get_parameter`` refuses for not being an ``nn.Parameter``."""
    owner, _, attr = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, attr)


# ---- pipelines ------------------------------------------------------------------------------
@contextlib.contextmanager
def opaque_experts(model: nn.Module, dispatches: dict[str, ExpertsDispatch]) -> Iterator[None]:
    """While inside, each experts module of ``dispatches`` calls the opaque ``autoplan::experts``
    op on its parameters (module docstring), so torch.export records one node per module."""
    make = {fqn: lambda module, fqn=fqn, d=d: _opaque_forward(module, fqn, d.names) for fqn, d in dispatches.items()}
    with replaced_forwards(model, make):
        yield


def _opaque_forward(module: nn.Module, fqn: str, names: tuple[str, ...]):
    def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        params = [module.get_parameter(n) for n in names]
        return torch.ops.autoplan.experts(fqn, hidden_states, top_k_index, top_k_weights, params)

    return forward


def replace_experts_ops(root: nn.Module, dispatches: dict[str, ExpertsDispatch]) -> int:
    """Point every ``autoplan::experts`` node in the graphs under ``root`` (a stage module and its
    InterpreterModules) at its module's dispatch; return how many were replaced."""
    replaced = 0
    for module in root.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, fx.Graph):
            continue
        nodes = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.autoplan.experts.default]
        for node in nodes:
            fqn, hidden, index, weights, params = node.args
            node.target, node.args = dispatches[fqn], (hidden, index, weights, params)
        if nodes:
            _refinalise(module)
            replaced += len(nodes)
    return replaced


def _refinalise(module: nn.Module) -> None:
    """Regenerate a changed graph's code: an InterpreterModule's ``finalize`` or a GraphModule's ``recompile``."""
    if hasattr(module, "finalize"):
        module.finalize()
    elif isinstance(module, fx.GraphModule):
        module.recompile()
