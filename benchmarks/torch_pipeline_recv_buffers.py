"""What torch's own pipeline runtime holds in boundary tensors, measured on CPU beside autoplan's count of them.

Two gloo ranks run torch's ``PipelineStage`` (the manual frontend torchtitan uses) on a stack of Linear + ReLU
blocks, one boundary tensor of ROWS x HIDDEN fp32 (D bytes) per micro-batch, under ``Schedule1F1B`` (one stage a
rank) and ``ScheduleInterleaved1F1B`` (v = 2 stages a rank, the ``_PipelineScheduleRuntime`` path), m = 4 and 16.
Per rank, on the second step (the first allocates the receive buffers, stage.py ``_prepare_forward_infra``):

- recv: the distinct storages of the stages' receive buffers (``args_recv_info``, ``grad_recv_info``), and
  whether step 2 uses the same storages as step 1 (kept for the whole run);
- sends: the most sent tensors (``get_fwd_send_ops`` / ``get_bwd_send_ops``) alive at once while nothing but
  their send holds them (a forward output after its chunk's backward, an input gradient once sent), sampled
  after every forward, backward and send;
- peak: the step's peak of live tensor bytes (autoplan's ``LiveBytes`` meter, execute/job/meters.py); share:
  (recv + sends) D over it, at most their share at the peak.

autoplan's count of the same (cost/pp/receive_slots.py, cost/pp/rank_memory.py): the receive slots at the step's
start and, where it replays the order (interleaved), the most boundary tensors of any state (``most_sent``).
Torch 2.13 on gloo: recv = priced slots (4, 16; 12, 48), kept across steps; interleaved recv + sends = most_sent
(24, 96); Schedule1F1B holds 1-2 sends (it waits each at its next exchange), which autoplan does not price.

    python benchmarks/torch_pipeline_recv_buffers.py
"""

from __future__ import annotations

import os
import socket
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

from autoplan.cost.pp.rank_memory import rank_floors
from autoplan.cost.pp.receive_slots import single_chunk_slots, slot_changes
from autoplan.execute.job.meters import LiveBytes

ROWS, HIDDEN, WORLD = 8, 256, 2
D_BYTES = ROWS * HIDDEN * 4


class Probe:
    """Sent tensors, by weak reference, and the most alive at once held by their sends only (module docstring)."""

    def __init__(self, stages: list[PipelineStage]):
        self.stages, self.sent, self.most = stages, [], 0
        for stage in stages:
            self._wrap(stage)

    def _wrap(self, stage: PipelineStage) -> None:
        for name in ("get_fwd_send_ops", "get_bwd_send_ops"):
            original = getattr(stage, name)

            def sending(mb, original=original):
                ops = original(mb)
                self.sent += [weakref.ref(op.tensor.untyped_storage()) for op in ops]
                self.sample()
                return ops

            setattr(stage, name, sending)
        for name in ("forward_one_chunk", "backward_one_chunk"):
            original = getattr(stage, name)

            def running(*args, original=original, **kwargs):
                out = original(*args, **kwargs)
                self.sample()
                return out

            setattr(stage, name, running)

    def sample(self) -> None:
        cached = {t.untyped_storage()._cdata for s in self.stages for out, _ in s.fwd_cache.values() for t in out}
        alive = [ref() for ref in self.sent]
        self.most = max(self.most, sum(s is not None and s._cdata not in cached for s in alive))


def recv_buffers(stages: list[PipelineStage]) -> list[torch.Tensor]:
    """The stages' receive buffers: one per micro-batch for each chunk's input and output gradient."""
    infos = [i for s in stages for t in (*s.args_recv_info.values(), *s.grad_recv_info.values()) for i in t]
    return [i.buffer for i in infos if i.buffer is not None and not i.is_root_arg]


def recv_storages(stages: list[PipelineStage]) -> dict[int, int]:
    """{storage id: bytes} of the stages' receive buffers."""
    return {b.untyped_storage()._cdata: b.untyped_storage().nbytes() for b in recv_buffers(stages)}


def run(rank: int, port: int, schedule: str, m: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    v = 2 if schedule == "interleaved_1f1b" else 1
    blocks = [nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()) for _ in range(v)]
    stages = [PipelineStage(b, rank + WORLD * j, WORLD * v, torch.device("cpu")) for j, b in enumerate(blocks)]
    loss = lambda y, target: ((y - target) ** 2).sum()  # noqa: E731
    runner = ScheduleInterleaved1F1B(stages, m, loss_fn=loss) if v > 1 else Schedule1F1B(stages[0], m, loss_fn=loss)
    x, target = torch.randn(m * ROWS, HIDDEN), torch.randn(m * ROWS, HIDDEN)
    step = lambda: runner.step(x, target=target) if rank == 0 else runner.step(target=target)  # noqa: E731
    step()
    first = recv_storages(stages)
    probe = Probe(stages)
    params = [p for b in blocks for p in b.parameters()]
    with LiveBytes(params + [p.grad for p in params] + recv_buffers(stages)) as meter:
        step()
    second = recv_storages(stages)
    kept = first.keys() == second.keys()
    out[(schedule, m, rank)] = dict(recv=len(second), recv_bytes=sum(second.values()), kept=kept, sends=probe.most,
                                    peak=meter.peak)  # fmt: skip
    dist.destroy_process_group()


def priced(schedule: str, m: int, rank: int) -> tuple[int, int | None]:
    """autoplan's receive slots at the step's start and, where it replays the order, its most boundary tensors
    (forward and gradient ones together: every boundary tensor here has a gradient)."""
    if schedule == "1f1b":
        return sum(single_chunk_slots(pp=WORLD, m=m, rank=rank)), None
    where = dict(schedule=schedule, pp=WORLD, virtual_stages=2, m=m, rank=rank)
    return sum(slot_changes(**where)[0]), rank_floors(**where).most_sent[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    out = mp.Manager().dict()
    print(f"D = {D_BYTES} bytes; counts in boundary tensors")
    print("schedule          m rank | recv (same storages) sends recv+sends | priced slots most_sent | peak KiB share")
    for schedule in ("1f1b", "interleaved_1f1b"):
        for m in (4, 16):
            mp.spawn(run, args=(free_port(), schedule, m, out), nprocs=WORLD)
            for rank in range(WORLD):
                r, (slots, most) = out[(schedule, m, rank)], priced(schedule, m, rank)
                assert r["recv_bytes"] == r["recv"] * D_BYTES
                print(f"{schedule:16s} {m:2d} {rank:4d} | {r['recv']:4d} ({r['kept']!s:5s})       {r['sends']:4d}      "
                      f"{r['recv'] + r['sends']:4d}     | {slots:12d} {most if most is not None else '-':>9} | "
                      f"{r['peak'] / 1024:8.0f}  {(r['recv'] + r['sends']) * D_BYTES / r['peak']:6.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
