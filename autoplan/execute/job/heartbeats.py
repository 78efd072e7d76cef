"""Where this rank's heartbeat goes, and who watches it (autoplan/jobs/heartbeat.py, hang.py).

Under autoplan's local launcher (``AUTOPLAN_HEARTBEAT_DIR`` set) the rank writes a file and the
launcher watches. Under torchrun, on one node or many (``autoplan launch``'s jobs, ``--max-restarts``),
there is no launcher of ours: every rank publishes to the job's TCPStore (the one at MASTER_ADDR:
MASTER_PORT that the process group met at; under torchrun's agent it is the agent's, which outlives
any rank), under a prefix of this attempt, and a thread of rank 0 reads every rank's key. When it
declares a rank hung, rank 0 records the sentence (the launcher's error file, when there is one),
prints it and leaves with :data:`EXIT_HUNG`; torchrun then stops every rank as for any failed one.
There, unlike locally, the hung rank's stack is not asked for (it may be on another node). A rank 0
that hangs holding the GIL in native code stops its own watcher: the collective timeout remains.
docs/executor.md, "Hung ranks".
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from autoplan.jobs.hang import Deadlines, Verdict, watch_store
from autoplan.jobs.heartbeat import Heartbeat, StoreSink, file_sink_from_env
from autoplan.types.plan import Plan
from autoplan.types.run_options import RunOptions

EXIT_HUNG = 76  # rank 0's exit under torchrun when its watcher declares a rank hung


def start_heartbeat(opts: RunOptions, plan: Plan) -> Heartbeat:
    """This rank's heartbeat, publishing where the job's watcher reads (module docstring); one that
    only records its marks when --hang-timeout-s is 0."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    deadlines = Deadlines.for_plan(plan, floor_s=opts.hang_timeout_s, timeout_s=opts.timeout_s)
    if deadlines is None:
        return Heartbeat(rank=rank, sink=None, period_s=1.0)
    sink = file_sink_from_env()
    if sink is None and "MASTER_ADDR" in os.environ:
        sink = StoreSink(lambda: _job_store(opts))
        if rank == 0:
            watch_store(open_store=lambda: _job_store(opts), ranks=world, deadlines=deadlines, on_hang=_leave_hung)
    return Heartbeat(rank=rank, sink=sink, period_s=deadlines.period_s).start()


def _job_store(opts: RunOptions):
    import torch.distributed as dist

    from autoplan.execute.job.checkpointing import restart_count

    timeout = timedelta(seconds=opts.timeout_s)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"autoplan/heartbeat/attempt{restart_count()}", store)


def _leave_hung(verdict: Verdict) -> None:
    """Rank 0's watcher declared a rank hung: say so once and leave (torchrun stops the others)."""
    from autoplan.execute.job.runner import record_failure

    advice = "raise --hang-timeout-s if that phase legitimately takes this long"
    sentence = f"hung: {verdict.message}; stopping the job ({advice})."
    record_failure(HungError(sentence))
    print(f"autoplan: error: {sentence}", file=sys.stderr, flush=True)
    os._exit(EXIT_HUNG)


class HungError(RuntimeError):
    """What rank 0 records for the launcher that started torchrun's agent."""
