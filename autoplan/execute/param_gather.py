"""ZeRO-1's parameter all-gather under the next forward (``Plan.overlap_param_gather``), as
Megatron-LM's ``--overlap-param-gather`` runs it (megatron/core/distributed: a forward pre-hook
per bucket waits for its all-gather and dispatches the next one).

The stage's parameters form units in the order its forward uses them: the stage's own parameters
outside every block (the embedding before the first block; a head after the last is gathered
with them, before the forward, as nothing else is known of its position), then each block. Each
unit is one :class:`~autoplan.execute.zero.ShardedOptimizer` with its own flat buffer, padded to
dp, so it reduce-scatters and all-gathers apart. After the optimizer step only the first unit's
all-gather is started; a forward pre-hook on each unit's module waits for its own and starts the
next (prefetched one unit ahead), so each gather runs under the forward of the unit before.
Anything that reads the weights outside a forward (--verify, a checkpoint) calls
:meth:`OverlappedZero1.wait_gathers` first. Priced in autoplan/cost/dp/sync.py
(docs/cost-model.md, "ZeRO-1's parameter gather under the next forward").
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.execute.zero import ShardedOptimizer, ShardedOptimizers


class OverlappedZero1(ShardedOptimizers):
    """ZeRO-1 over per-unit flat buffers whose all-gathers run under the next forward (module docstring)."""

    def __init__(self, units: list[tuple[nn.Module, ShardedOptimizer]]):
        super().__init__([part for _, part in units])
        self.due: set[int] = set()  # units stepped whose all-gather has not started
        self.pending: dict[int, tuple] = {}  # unit -> (work, buffer) of a started all-gather
        for index, (module, _) in enumerate(units):
            module.register_forward_pre_hook(lambda _m, _args, i=index: self._before(i), prepend=True)

    def step(self) -> None:
        self.wait_gathers()  # a step before the forward that consumes the last one (not in training)
        for part in self.parts:
            part.step(gather=False)
        self.due = set(range(len(self.parts)))
        self._start(0)

    def _start(self, index: int) -> None:
        if index in self.due:
            self.due.discard(index)
            self.pending[index] = self.parts[index].start_gather()

    def _before(self, index: int) -> None:
        """Unit ``index``'s forward is about to run: its weights in place, the next unit's gather started."""
        self._start(index)
        if index in self.pending:
            self.parts[index].finish_gather(*self.pending.pop(index))
            self._start(index + 1)

    def wait_gathers(self) -> None:
        """Finish every outstanding all-gather, in unit order (every dp rank issues them alike)."""
        for index in range(len(self.parts)):
            self._before(index)


def overlapped_zero1(
    *, modules: list[nn.Module], blocks: list[str], optimizer_fn: Callable, dp_mesh: DeviceMesh, reduce_dtype
) -> OverlappedZero1:
    """The units of each stage module (module docstring), one ShardedOptimizer each, in forward order."""
    units = []
    for module in modules:
        present = dict(module.named_modules())
        mine = [present[fqn] for fqn in blocks if fqn in present]
        inside = {id(p) for block in mine for p in block.parameters()}
        rest = [p for p in module.parameters() if id(p) not in inside and p.requires_grad]
        groups = [(module, rest)] + [(block, [p for p in block.parameters() if p.requires_grad]) for block in mine]
        for owner, params in groups:
            if params:
                part = ShardedOptimizer(
                    params=params, optimizer_fn=optimizer_fn, dp_mesh=dp_mesh, reduce_dtype=reduce_dtype
                )
                units.append((owner, part))
    return OverlappedZero1(units)
