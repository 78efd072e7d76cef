"""Parameters tied across pipeline stages (e.g. a GPT's token embedding and output head), and parameters that more
than one stage reads (:func:`shared_names`).

``pipeline()`` gives each stage that uses a tied parameter its own copy, and each copy gets
only its own stage's part of the gradient. The true gradient is their sum (it is what the
unsplit model accumulates into the one shared tensor), so after backward the holders of
one tied parameter, at the same (dp, tp) coordinate, all-reduce (SUM) their local gradients.
The copies start equal and get equal gradients, so they stay equal under any optimizer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.execute.data_parallel import local
from autoplan.types.layout import stage_of_chunk


def tied_names(model: nn.Module) -> list[list[str]]:
    """Groups of parameter FQNs that name one tensor."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def shared_names(*, groups: list[list[str]], holders: dict[int, set[str]]) -> list[list[str]]:
    """One-name parameters that more than one stage holds, each as its own group, in name order (the same on every
    rank: the groups are made collectively). ``pipeline()`` copies a parameter into every stage that reads it: a
    relative-position table that every block reads, normed once (DeBERTa-v2's ``rel_embeddings``), Perceiver's input
    embeddings; each copy took only its own stage's part of the gradient, 71-86% off, until summed as a tie's."""
    tied = {name for names in groups for name in names}
    stages = Counter(name for names in holders.values() for name in names if name not in tied)
    return [[name] for name in sorted(name for name, count in stages.items() if count > 1)]


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
    """This rank's copies of each cross-stage tie, and the group that sums them across pipeline ranks.

    Under interleaved schedules one rank runs several stages, and two of them can hold copies of one
    tied tensor (T5 at pp=2 with 2 virtual stages: the decoder's token embedding on stage 1 and the
    output head on stage 3, both on pipeline rank 1). The true gradient is the sum over every copy,
    so each rank first sums its own copies, then all-reduces that sum over the ranks that hold one,
    and writes the total back into each of its copies."""

    #: (group or None where one rank holds every copy, [(stage module, parameter name)] on this rank)
    pairs: list[tuple[object, list[tuple[nn.Module, str]]]] = field(default_factory=list)

    def __call__(self) -> None:
        for group, held in self.pairs:
            # looked up now: FSDP2 (ZeRO-2/3) replaces a stage's parameters after this sync is built
            params = [stage.get_parameter(name) for stage, name in held]
            params = [p for p in params if p.requires_grad]
            if not params:
                continue
            for param in params:
                if param.grad is None:  # a copy whose stage did not reach it this step still takes the sum
                    param.grad = torch.zeros_like(param)
            total, *others = [local(param.grad) for param in params]
            for grad in others:  # summed into the first copy's gradient: no buffer beyond the gradients
                total += grad
            if group is not None:
                dist.all_reduce(total, group=group)
            for grad in others:
                grad.copy_(total)


def build_tied_sync(
    *,
    groups: list[list[str]],
    holders: dict[int, set[str]],
    pp: int,
    v_shape: bool = False,
    mesh: DeviceMesh,
    my_modules: dict[int, nn.Module],
) -> TiedGradSync:
    """Create the groups on every rank (a collective, in the same order everywhere), keep the ones
    this rank is in, with this rank's copies: one name per stage module that holds the tie (``retie``
    already made a stage's names of one tensor share one Parameter).

    ``holders[stage]`` is the set of parameter FQNs stage ``stage`` holds."""
    sync = TiedGradSync()
    groups = groups + shared_names(groups=groups, holders=holders)
    # [pp, dp, cp, tp] -> global rank; one row per position off the pp axis, its pp ranks in order
    along_pp = mesh.mesh.reshape(mesh.mesh.shape[0], -1).T
    me = dist.get_rank()
    for names in groups:
        stages = sorted(stage for stage, held in holders.items() if held & set(names))
        if len(stages) < 2:
            continue
        copies = [(my_modules[s], next(n for n in names if n in holders[s])) for s in stages if s in my_modules]
        pp_ranks = sorted({stage_of_chunk(stage, pp=pp, v_shape=v_shape) for stage in stages})
        if len(pp_ranks) < 2:  # every copy on one pipeline rank: a local sum, no group
            if copies:
                sync.pairs.append((None, copies))
            continue
        for row in along_pp:
            ranks = [int(row[p]) for p in pp_ranks]
            group = dist.new_group(ranks)
            if me in ranks:
                sync.pairs.append((group, copies))
    return sync
