"""Expert tensor parallelism (``plan.expert_tp``): each routed expert's FFN split over the ``e`` ranks of its
etp group, as Megatron-Core's ``--expert-tensor-parallel-size`` runs it (docs/executor.md, "Expert tensor
parallelism"; autoplan/types/expert_layout.py for the layout).

Weights (Megatron-Core's ``TEGroupedMLP``/``SequentialMLP`` under ``expt_tp_group``): the up projection is
column-parallel, each etp rank holding ``I / e`` of every local expert's ``I`` FFN outputs; a fused
``gate_up_proj`` is split in its two halves (gate, up: the ``chunk(2, -1)`` its forward takes) and each half
sharded, so a rank holds ``[gate_r | up_r]`` (a ``_StridedShard`` with split factor 2 as a DTensor); the down
projection is row-parallel, ``I / e`` of its inputs, and its output a partial sum over etp.

Tokens (Megatron-Core 0.16, ``MoEAlltoAllTokenDispatcher``): after the ep all-to-all each etp rank holds the
rows its ep peers sent it; the etp group all-gathers them (``dispatch_postprocess``, with the per-expert counts
gathered over tp x ep first, ``preprocess``), runs its FFN shard on all ``n = sum_j n_j`` rows, and
reduce-scatters the partial outputs back to the rank each row came from (``combine_preprocess``). The sizes
``n_j`` differ, and gloo has no uneven all-gather, so this executor sends each as an all-to-all on the etp group
(rank ``j`` sends its ``n_j`` rows to every peer; the scatter sends peer ``j`` its ``n_j`` partial rows and sums
the ``e`` it gets): the same bytes, ``e n_j`` rows on rank ``j``, and the same bus time, ``(e-1)/e`` of the
gathered message (types/profile.py ``bus_factor``). The counts cross as one all-to-all of ``e`` copies of the
rank's ``E`` int64 counts per forward (``8 E e`` bytes), which cost/moe/experts.py prices beside the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd, wait_tensor
from torch.distributed.tensor import Placement, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from autoplan.errors import PlanError

#: the Hugging Face experts interface's projections (autoplan/trace/moe.py ``is_hf_experts``) -> how many halves
#: the output features hold (``gate_up_proj``: gate and up) or None for the row-parallel down projection
PROJECTIONS = {"gate_up_proj": 2, "up_proj": 1, "down_proj": None}


@dataclass(frozen=True)
class EtpSplit:
    """How one per-expert parameter is split over etp: the FFN dim of its ``[E, ., .]`` tensor and the halves
    that dim holds (2: a fused gate and up, each sharded)."""

    dim: int
    halves: int = 1

    def local(self, tensor: torch.Tensor, *, rank: int, size: int) -> torch.Tensor:
        """This etp rank's part of ``tensor`` (module docstring)."""
        halves = tensor.chunk(self.halves, dim=self.dim)
        return torch.cat([half.chunk(size, dim=self.dim)[rank] for half in halves], dim=self.dim).contiguous()

    def placement(self) -> Placement:
        """The DTensor placement over etp of :meth:`local`'s result."""
        return Shard(self.dim) if self.halves == 1 else _StridedShard(self.dim, split_factor=self.halves)


def etp_splits(module: nn.Module, names: tuple[str, ...], *, fqn: str) -> dict[str, EtpSplit]:
    """The :class:`EtpSplit` of each per-expert parameter ``names`` of the experts ``module`` (module docstring);
    PlanError in one sentence for one that is no projection of the experts interface (a bias, a norm)."""
    transposed = bool(getattr(module, "is_transposed", False))
    splits = {}
    for name in names:
        if name not in PROJECTIONS:
            raise PlanError(
                f"plan expert_tp > 1 cannot split '{fqn}.{name}' over the experts' tensor-parallel ranks: only "
                "gate_up_proj/up_proj and down_proj without biases are (Megatron-Core: 'Bias in Moe is only "
                "supported when ETP==1'); plan expert_tp=1 for this model."
            )
        halves = PROJECTIONS[name]
        column = 2 if transposed else 1  # the output features of [E, out, in], or of [E, in, out] transposed
        splits[name] = EtpSplit(dim=column, halves=halves) if halves else EtpSplit(dim=3 - column)
    return splits


def check_divides(splits: dict[str, EtpSplit], params: dict[str, torch.Tensor], *, etp: int, fqn: str) -> None:
    """PlanError when ``etp`` does not divide a parameter's FFN dim (each half of a fused one)."""
    for name, split in splits.items():
        width = params[name].shape[split.dim] // split.halves
        if width % etp:
            raise PlanError(
                f"plan expert_tp={etp} does not divide the FFN width {width} of '{fqn}.{name}'; use an expert_tp "
                "that divides it."
            )


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``[e, len(counts)]``: every etp rank's ``counts`` (the rows it holds per local expert and source), sent as
    one all-to-all of ``e`` copies (module docstring)."""
    size = dist.get_world_size(group)
    return exchange(counts.repeat(size), group).view(size, -1)


def exchange(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``counts`` split evenly over ``group``'s ranks, each part sent to its rank, as the functional all-to-all
    (``_c10d_functional.all_to_all_single``), whose output selective recomputation keeps: a recomputed block
    never sends its counts again (types/saved_ops.py ``SAVED_COLLECTIVES``; c10d's in-place one would re-run)."""
    return wait_tensor(all_to_all_single(counts, None, None, group))


def gather_rows(rows: torch.Tensor, sizes: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """The etp group's rows, rank by rank (``sizes[j]`` from rank ``j``): an all-gather of uneven parts sent
    as an all-to-all (module docstring); its backward sums each row's gradient over the etp ranks."""
    size, mine = len(sizes), rows.shape[0]
    return all_to_all_single_autograd(rows.repeat(size, 1), sizes, [mine] * size, group)


def scatter_rows(partial: torch.Tensor, sizes: list[int], rank: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum over the etp ranks of ``partial``'s rows that came from this rank (``sizes[rank]`` of them): a
    reduce-scatter of uneven parts sent as an all-to-all (module docstring)."""
    size, mine = len(sizes), sizes[rank]
    received = all_to_all_single_autograd(partial, [mine] * size, sizes, group)
    return received.view(size, mine, *partial.shape[1:]).sum(0)
