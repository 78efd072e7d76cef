"""How many intra-op threads each process of a job gets: one rule for the profiler's measuring
processes and the executor's ranks, so that a run computes with the threads its profile measured.

    threads_per_process = max(1, available_cores // processes on this machine)

``available_cores`` is this process's CPU affinity mask (``os.sched_getaffinity``: what Slurm,
cgroups or ``taskset`` leave it), not the machine's total, which over-subscribes a job confined to
fewer cores; ``os.cpu_count()`` where the mask is unknown (not Linux).
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_process(*, processes: int) -> int:
    """A fixed intra-op thread count for each of ``processes`` processes sharing this machine's
    cores (module docstring), at least 1."""
    return max(1, available_cores() // max(1, processes))
