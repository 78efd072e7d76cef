"""Parameters tied across pipeline stages (e.g. a GPT's token embedding and output head).

``pipeline()`` gives each stage that uses a tied parameter its own copy, and each copy gets
only its own stage's part of the gradient. The true gradient is their sum (it is what the
unsplit model accumulates into the one shared tensor), so after backward the holders of
one tied parameter, at the same (dp, tp) coordinate, all-reduce (SUM) their local gradients.
The copies start equal and get equal gradients, so they stay equal under any optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.execute.data_parallel import local


def tied_names(model: nn.Module) -> list[list[str]]:
    """Groups of parameter FQNs that name one tensor."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def retie(module: nn.Module, groups: list[list[str]]) -> None:
    """Make the names of one tied tensor that ``module`` (a pipeline stage) holds share one
    Parameter again: ``pipeline()`` can give a stage one copy per name (T5's encoder and decoder
    token embeddings), each then getting only its own part of the gradient."""
    params = dict(module.named_parameters(remove_duplicate=False))
    for names in groups:
        held = [name for name in names if name in params]
        for name in held[1:]:
            owner, _, attr = name.rpartition(".")
            module.get_submodule(owner).register_parameter(attr, params[held[0]])


@dataclass
class TiedGradSync:
    """The process groups and local parameters for this rank's cross-stage ties."""

    pairs: list[tuple[object, list[tuple[nn.Module, str]]]] = field(default_factory=list)  # (group, [(stage, name)])

    def __call__(self) -> None:
        for group, held in self.pairs:
            for stage, name in held:
                # looked up now: FSDP2 (ZeRO-2/3) replaces a stage's parameters after this sync is built
                param = stage.get_parameter(name)
                if param.grad is not None:
                    dist.all_reduce(local(param.grad), group=group)


def build_tied_sync(
    *,
    groups: list[list[str]],
    holders: dict[int, set[str]],
    pp: int,
    mesh: DeviceMesh,
    my_modules: dict[int, nn.Module],
) -> TiedGradSync:
    """Create the groups on every rank (a collective), keep the ones this rank is in.

    ``holders[stage]`` is the set of parameter FQNs stage ``stage`` holds."""
    sync = TiedGradSync()
    layout = mesh.mesh  # [pp, dp, tp] -> global rank
    me = dist.get_rank()
    mine = {n: (m, n) for m in my_modules.values() for n, _ in m.named_parameters(remove_duplicate=False)}
    for names in groups:
        pp_ranks = sorted({stage % pp for stage, held in holders.items() if held & set(names)})
        if len(pp_ranks) < 2:
            continue
        for d in range(layout.shape[1]):
            for t in range(layout.shape[2]):
                ranks = [int(layout[p, d, t]) for p in pp_ranks]
                group = dist.new_group(ranks)
                if me in ranks:
                    sync.pairs.append((group, [mine[n] for n in names if n in mine][:1]))
    return sync
