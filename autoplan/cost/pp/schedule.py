"""Pipeline schedules: stage partition, bubble, micro-batches in flight, and gradient-sync overlap.

Bubble (Narayanan et al. SC'21 section 2.2): with p stages, m micro-batches and v model chunks
per device, fill and drain cost (p - 1) / (v * m) of the ideal time, i.e. (p - 1) / v times one
micro-batch's forward + backward on the slowest stage (GPipe and 1F1B have v = 1).

Micro-batches of activations in flight on stage i (0-based):
- GPipe: all m (Huang et al. 2019: every forward runs before any backward);
- 1F1B: min(p - i, m) (Narayanan et al. SC'21 section 2.2.1; p on the first stage);
- interleaved 1F1B: min(2 (p - i - 1) + (v - 1) p + 1, v m) model chunks (Megatron-LM's warm-up
  count plus the running one; for stage 0 this is p v (1 + (p - 1)/(p v)) chunks, the factor of
  Korthikanti et al. 2022 section 4.2.3), each holding 1/v of the stage's layers.

After the stage's first backward (of one micro-batch, or one chunk) the count drops by one and
a schedule that has forwards left refills it at once (1F1B's steady state); GPipe has none left,
and neither has a 1F1B stage whose warm-up already ran every micro-batch. This matters where
gradients are freed at each step's start (autoplan/cost/memory/per_device.py): the first backward starts
without them, so the peak is the larger of "all in flight, no gradients" and "one fewer (or
refilled) in flight, every gradient made".

Gradient sync overlapped with the backward (PyTorch DDP's bucketed all-reduce, Li et al.
VLDB 2020): the gradients of a block are ready when its backward of the last micro-batch
ends; they are reduced in buckets on one communication stream in reverse layer order. The
exposed time is what remains after the last backward ends:

    ready_l = sum of the backward times of the blocks after l (in backward order) up to l
    done_l  = max(done_{l-1}, ready_l) + t_sync(bytes_l)
    exposed = max(0, done_last - backward_end)

so the last bucket is always exposed, and sync that outlasts the remaining backward shows.

Partial overlap (profile ``comm_overlap.efficiency`` = eta, measured by autoplan/profile/measure/
overlap.py): a collective running under compute hides only eta of the time it could hide
(t_both = t_comp + t_comm - eta * min(t_comp, t_comm)), so every overlap formula here keeps
eta of its hidden time: exposed(eta) = exposed(1) + (1 - eta) * (total - exposed(1)). eta = 1
under NCCL (separate CUDA streams); gloo on a CPU shares the cores with compute.
"""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.plan import Plan


def balanced_stages(layers: list[str], chunks: int) -> list[list[str]]:
    """Contiguous partition of ``layers`` into ``chunks`` parts whose sizes differ by at most one
    (the earlier chunks take the remainder)."""
    if chunks > max(1, len(layers)):  # one chunk holds the whole model, blocks or not
        raise PlanError(
            f"plan asks for {chunks} pipeline chunks but the model has {len(layers)} blocks; "
            "use fewer stages or virtual stages."
        )
    base, extra = divmod(len(layers), chunks)
    stages, start = [], 0
    for i in range(chunks):
        size = base + (1 if i < extra else 0)
        stages.append(layers[start : start + size])
        start += size
    return stages


def bubble_fraction(*, pp: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """(p - 1) / (v * m): the bubble as a fraction of the ideal (bubble-free) pipeline time."""
    return (pp - 1) / (virtual_stages * num_microbatches)


def in_flight_chunks(plan: Plan, stage: int) -> float:
    """Micro-batches of activations held on ``stage``, in units of the whole stage's layers."""
    p, m, v = plan.pp, plan.num_microbatches, plan.virtual_stages
    if plan.schedule == "gpipe":
        return float(m)
    if plan.schedule == "1f1b":
        return float(min(p - stage, m))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, v * m)
    return chunks / v


def in_flight_after_first_backward(plan: Plan, stage: int) -> float:
    """Micro-batches of activations held on ``stage`` once its first backward is done (module
    docstring), in units of the whole stage's layers."""
    m, v = plan.num_microbatches, plan.virtual_stages
    held = in_flight_chunks(plan, stage) * v
    refilled = plan.schedule != "gpipe" and held < v * m
    return (held if refilled else held - 1) / v


def overlapped_sync_exposed_s(*, backward_s: list[float], sync_s: list[float]) -> float:
    """Exposed part of per-block gradient sync overlapped with the backward (module docstring).

    Both lists are in backward order (last block first); ``sync_s[i]`` is the time to reduce
    block i's gradients once its backward ends.
    """
    clock = done = 0.0
    for t_bwd, t_sync in zip(backward_s, sync_s):
        clock += t_bwd
        done = max(done, clock) + t_sync
    return max(0.0, done - clock)


def partially_hidden_s(*, exposed_s: float, total_s: float, efficiency: float) -> float:
    """Exposed time when only ``efficiency`` of the perfectly hidden ``total_s - exposed_s`` hides
    (module docstring)."""
    return exposed_s + (1.0 - efficiency) * max(0.0, total_s - exposed_s)


def prefetched_exposed_s(*, compute_s: list[float], comm_s: list[float], efficiency: float = 1.0) -> float:
    """Exposed time of per-block communication prefetched one block ahead (FSDP's forward and
    backward prefetch, Zhao et al. VLDB 2023): block i's comm runs under block i-1's compute,
    so the first block's comm is exposed and every later one hides ``efficiency`` of the part
    that fits under the compute before it."""
    if not comm_s:
        return 0.0
    exposed = comm_s[0]
    for t_prev, t_comm in zip(compute_s, comm_s[1:]):
        exposed += t_comm - efficiency * min(t_comm, t_prev)
    return exposed
