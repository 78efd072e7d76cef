"""The search on several processes (``autoplan plan --jobs N``; docs/ilp.md, "The search on several processes").

The groups, in bound (1) order, go to n shares round robin: group i to share i mod n. Once the one best-first pass
(solve/best_first.py) has priced a plan that fits (before that its members go first, and nothing prunes), it forks
n - 1 times; each process keeps its share's queued groups and members (a member stays with its group: a tp_plan's
tail, Pass._settle, reads all its members) and runs the pass on them alone, pruning against its own ``keep``-th
best. Every prune is sound against plans of the process's own, so the merged top ``keep`` is the serial search's:
the best plan, its price and an exact top k are identical (ties broken by candidates.rank_key, a total order),
and which of the other plans are priced or pruned depends on n alone, never on timing: the shares share nothing
while they run. The children send their rows back through a pipe (pickled) and exit; the parent reads them as it
finishes its own share, the progress bar counting every share's groups (a shared page of counters).

Only where the platform forks cheaply and safely (Linux), and never in a process that is a child already; ``jobs``
0 is :func:`auto_jobs`. The children write nothing to the terminal; an error in one is raised in the parent.
"""

from __future__ import annotations

import contextlib
import heapq
import mmap
import os
import pickle
import select
import signal
import struct
import sys
import traceback
from dataclasses import replace
from typing import Any

from autoplan.cost import stored
from autoplan.errors import PlanError
from autoplan.solve.candidates import better

#: the processes ``jobs`` 0 uses at most: each share solves tp ILPs again and prices what its own best does not prune,
#: and the serial start does not shrink; measured on 2 cores only (docs/cli.md): where more stop paying is a guess
MAX_AUTO_JOBS = 4
JOBS_ENV = "AUTOPLAN_JOBS"  # jobs 0's count where set (a run control, not a model size: cli/launch.py)
_SLOT = struct.Struct("q")  # a child's groups resolved since the split, in the shared page
_IN_CHILD = False  # this process is a share's child: it forks no further


def auto_jobs() -> int:
    """``jobs`` 0: ``AUTOPLAN_JOBS`` where set, else the cores this process may run on, at most MAX_AUTO_JOBS."""
    if (env := os.environ.get(JOBS_ENV, "").strip()) and env != "0":
        if not env.isdigit():
            raise PlanError(f"{JOBS_ENV}={env!r} is not a whole number of processes; set it to 1 or more, or 0.")
        return int(env)
    from autoplan.jobs.threads import available_cores

    return min(MAX_AUTO_JOBS, available_cores())


def usable_jobs(jobs: int) -> int:
    """The processes the search runs on for ``jobs`` (0: :func:`auto_jobs`): 1 off Linux or in a share's child."""
    if jobs < 0:
        raise PlanError(f"--jobs {jobs} is negative; give 1 or more processes, or 0 for one per core.")
    jobs = jobs or auto_jobs()
    return 1 if _IN_CHILD or sys.platform != "linux" else jobs


class Shares:
    """Splits one Pass (solve/best_first.py) of ``search`` over ``jobs`` processes and merges what they found."""

    def __init__(self, search: Any, groups: list, jobs: int):
        self.search, self.jobs = search, jobs
        self.share_of = {id(group): i % jobs for i, (_, group) in enumerate(groups)}
        self.children: list[tuple[int, int]] = []  # (pid, the read end of its pipe)
        self.page = mmap.mmap(-1, _SLOT.size * jobs)  # each child's progress, shared across the fork
        self.progress_from = 0  # the pass's groups resolved at the split
        self.reaped: set[int] = set()
        self.bar = None  # the progress callback, once split
        self.shown = (0, len(groups))  # the parent's last (done, total) for the progress bar

    def split(self, pass_: Any) -> bool:
        """Fork once ``pass_``'s search holds a plan that fits (the shares start from one threshold); True once
        split: this process (the parent, share 0) goes on with its share."""
        if not self.search._top:
            return False
        self.progress_from, self.bar = pass_.done, self.search.options.progress
        sys.stdout.flush(), sys.stderr.flush()
        for share in range(1, self.jobs):
            read, write = os.pipe()
            try:
                pid = os.fork()
            except OSError:  # no process to be had (a limit, memory): the pass goes on whole, in this process
                os.close(read), os.close(write)
                self.stop()
                self.children.clear()
                return True
            if pid == 0:
                os.close(read)
                self._child(pass_, share, write)  # never returns
            os.close(write)
            self.children.append((pid, read))
        self._keep(pass_, 0)
        if self.bar is not None:  # the parent's bar counts every share's groups
            self.search.options = replace(self.search.options, progress=self._parent_progress)
        return True

    def _keep(self, pass_: Any, share: int) -> None:
        """Drop the queued groups and members of the other shares."""
        pass_._groups = [e for e in pass_._groups if self.share_of[id(e[3])] == share]
        pass_._members = [e for e in pass_._members if self.share_of[id(e[5].group)] == share]
        heapq.heapify(pass_._groups), heapq.heapify(pass_._members)

    def _child(self, pass_: Any, share: int, write: int) -> None:
        """Run ``share`` to its end, send what it found, exit: the parent's program never resumes here, whatever
        is raised on the way."""
        global _IN_CHILD
        _IN_CHILD, code = True, 1
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Ctrl-C ends it quietly: the
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # parent says so (an ignored SIGINT stays ignored)
            sys.stdout = sys.stderr = open(os.devnull, "w")  # the terminal is the parent's (its locks may be held)
            payload = self._found(pass_, share)
            code = 0 if payload[0] == "ok" else 1
            with os.fdopen(write, "wb") as pipe:
                pipe.write(_pickled(payload, share, self.jobs))
        finally:
            os._exit(code)

    def _found(self, pass_: Any, share: int) -> tuple:
        """``share``'s pass run here: ("ok", its rows, best, top, ILP solves, ILP statuses, the search cache's values it
        computed) or ("error", what it raised, with its traceback as a note where Python keeps notes, 3.11 on)."""
        s = self.search
        try:
            rows_from, solves_from = len(s.candidates), s.tp_planner.solves
            stored.forked()  # the search cache's values this share computes go back with its rows
            s.options = replace(s.options, progress=lambda done, _: self._report(share, done))
            self._keep(pass_, share)
            pass_.shares = None
            pass_.run()
            found = (s.candidates[rows_from:], s.best, s._top, s.tp_planner.solves - solves_from)
            return ("ok", *found, s.tp_planner.statuses(), stored.computed())
        except BaseException as exc:  # noqa: BLE001 - every error goes to the parent, which raises it
            if hasattr(exc, "add_note"):
                exc.add_note(f"(in the search's process for share {share} of {self.jobs})\n" + traceback.format_exc())
            return ("error", exc)

    def _report(self, share: int, done: int) -> None:
        _SLOT.pack_into(self.page, _SLOT.size * share, done - self.progress_from)

    def _parent_progress(self, done: int, total: int) -> None:
        self.shown = (done, total)
        self._show()

    def _show(self) -> None:
        if self.bar is not None:
            done, total = self.shown
            self.bar(done + sum(_SLOT.unpack_from(self.page, _SLOT.size * i)[0] for i in range(1, self.jobs)), total)

    def merge(self) -> list:
        """Wait for every child and add its rows, best plan, top and ILP solves to the search, in share order (the
        result depends on the shares, not on which ends first); the children's ILP statuses are returned."""
        s, statuses = self.search, []
        for payload in self._payloads():
            if payload[0] == "error":
                raise payload[1]
            _, rows, best, top, solves, child_statuses, computed = payload
            stored.add_computed(computed)
            s.candidates.extend(rows)
            s.tp_planner.solves += solves
            statuses += child_statuses
            for objective in top:
                heapq.heappush(s._top, objective)
                if len(s._top) > s.options.keep:
                    heapq.heappop(s._top)
            if best is not None and (s.best is None or better(best, s.best)):
                s.best = best
        return statuses

    def _payloads(self) -> list:
        """Every child's payload, read as the children write it (the progress bar moving meanwhile)."""
        chunks = {read: [] for _, read in self.children}
        reading = set(chunks)
        while reading:
            for read in select.select(list(reading), [], [], 0.2)[0]:
                if chunk := os.read(read, 1 << 20):
                    chunks[read].append(chunk)
                else:
                    reading.discard(read)
            self._show()
        return [self._payload(share, b"".join(chunks[read])) for share, (_, read) in enumerate(self.children, 1)]

    def _payload(self, share: int, data: bytes) -> tuple:
        """``share``'s payload, its process reaped; a child that died without one is one sentence."""
        pid, read = self.children[share - 1]
        _, status = os.waitpid(pid, 0)
        self.reaped.add(pid)
        if data:
            try:
                return pickle.loads(data)
            except Exception as exc:  # an error whose class takes other arguments than it was raised with
                raise PlanError(f"The search's process for share {share} of {self.jobs} failed ({exc}).") from exc
        how = f"signal {-code}" if (code := os.waitstatus_to_exitcode(status)) < 0 else f"exit status {code}"
        raise PlanError(
            f"The search's process for share {share} of {self.jobs} stopped ({how}) before it sent its plans; "
            "plan again, with --jobs 1 to search in one process."
        )

    def stop(self) -> None:
        """Close the pipes and end every child not yet reaped (the parent failed or was interrupted); the search's
        progress callback is the caller's again."""
        if self.bar is not None:
            self.search.options = replace(self.search.options, progress=self.bar)
        for pid, read in self.children:
            with contextlib.suppress(OSError):
                os.close(read)
            if pid not in self.reaped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                self.reaped.add(pid)


def _pickled(payload: tuple, share: int, jobs: int) -> bytes:
    """``payload`` pickled, or an error saying it could not be (one sentence for the parent to raise)."""
    try:
        return pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an unpicklable row or error is this sentence
        error = PlanError(
            f"The search's process for share {share} of {jobs} could not send what it found ({exc}); "
            "plan again with --jobs 1 to search in one process."
        )
        return pickle.dumps(("error", error), protocol=pickle.HIGHEST_PROTOCOL)
