"""torch's own interleaved zero-bubble action lists and an event replay of them, shared by the tests that hold
autoplan's zero-bubble prices to torch (test_zero_bubble.py: the bubble, activations in flight, kept gradients;
test_looped_replay.py: the bubble with each backward pass's re-runs)."""

from __future__ import annotations

import types

import torch
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining.schedules import _ComputationType as Op

DONE = {Op.FORWARD: "F", Op.BACKWARD_INPUT: "B", Op.FULL_BACKWARD: "B", Op.BACKWARD_WEIGHT: "W"}


def torch_order(*, pp: int, v: int, m: int) -> dict[int, list]:
    """Each rank's actions as ScheduleInterleavedZeroBubble builds them (looping placement, no process group)."""
    order = {}
    for rank in range(pp):
        stages = [
            types.SimpleNamespace(
                num_stages=pp * v, group_size=pp, group_rank=rank, submod=torch.nn.Linear(1, 1), stage_index=s
            )
            for s in range(rank, pp * v, pp)
        ]
        order[rank] = [a for a in torch_schedules.ScheduleInterleavedZeroBubble(stages, m).pipeline_order[rank] if a]
    return order


def replay_span(order: dict[int, list], *, chunks: int, f: float, b: float, w: float, units=None) -> float:
    """The makespan of ``order`` with one chunk's F, B, W seconds: each action starts when its rank is free and its
    input is done (F after the previous chunk's F, B after the next chunk's B, the last chunk's after its F, W after
    its B). ``units[c]``, chunk c's re-run per backward pass, rides on each of its W's and B's but chunk 0's B, which
    torch runs as nothing (none when ``units`` is None)."""
    seconds = {"F": f, "B": b, "W": w}
    units = units or [0.0] * chunks
    done: dict[tuple, float] = {}
    clock, at = dict.fromkeys(order, 0.0), dict.fromkeys(order, 0)
    while any(at[r] < len(order[r]) for r in order):
        moved = False
        for rank, actions in order.items():
            while at[rank] < len(actions):
                a = actions[at[rank]]
                kind, c, i = DONE[a.computation_type], a.stage_index, a.microbatch_index
                need = {"F": (c - 1, "F", i), "B": (c + 1, "B", i) if c < chunks - 1 else (c, "F", i)}
                dep = need.get(kind, (c, "B", i))
                if dep[0] >= 0 and dep not in done:
                    break
                rerun = units[c] if kind == "W" or (kind == "B" and c > 0) else 0.0
                clock[rank] = max(clock[rank], done.get(dep, 0.0)) + seconds[kind] + rerun
                done[(c, kind, i)] = clock[rank]
                at[rank], moved = at[rank] + 1, True
        assert moved, "the replay deadlocked"
    return max(clock.values())
