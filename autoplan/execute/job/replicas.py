"""--verify of an approximate outer sync (local SGD at H > 1, or DiLoCo's outer step; types/local_sgd.py):
no single-process reference trains the same function, so the check is the invariant that holds, the
replicas' parameters identical right after each outer sync (docs/executor.md, "Local SGD and DiLoCo").

After a step that synced, every rank all-reduces its local parameter tensors' elementwise max and min over
the outer group; the spread ``max - min`` must be 0 (every replica wrote the same all-reduced average, or
the same outer step on it). Beside it the report gives how far the replicas had drifted apart before the
sync (max |theta_r - avg|): 0 there would mean the inner steps were in fact synchronous.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

#: outer syncs compared (the first, and one with DiLoCo's momentum in it)
SYNCS_WANTED = 2


@dataclass
class ReplicaSync:
    step: int
    spread_after: float  # max over elements and replicas of max_r theta_r - min_r theta_r
    drift_before: float  # max over replicas of max |theta_r - avg| before the sync


@dataclass
class ReplicaCheck:
    """The invariant check :meth:`check` runs after each step (module docstring)."""

    checks: list[ReplicaSync] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.checks) >= SYNCS_WANTED

    @torch.no_grad()
    def check(self, *, trainer, step: int, **_: Any) -> None:
        """After ``step``: the spread over the outer group when that step synced (a collective: every rank calls it)."""
        outer = trainer.outer
        if not outer.synced_last_step:
            return
        flat = torch.cat([t.reshape(-1).float() for t in outer.tensors])
        high, low = flat.clone(), flat.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=outer.group)
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=outer.group)
        values = torch.tensor([float((high - low).max()) if flat.numel() else 0.0, outer.spread_before])
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        self.checks.append(ReplicaSync(step=step, spread_after=float(values[0]), drift_before=float(values[1])))


def verdict(*, checks: list[ReplicaSync], plan: Any) -> tuple[bool, str]:
    """Passed when at least one outer sync was seen and every one left the replicas identical; the report."""
    head = (
        f"verify: {plan.describe()} is approximate (local SGD/DiLoCo: the replicas train apart between outer "
        "syncs), so it is not compared with a synchronous reference; checked instead: the replicas' parameters "
        "identical right after each outer sync"
    )
    lines = [head]
    for c in checks:
        state = "identical" if c.spread_after == 0 else f"NOT identical (spread {c.spread_after:.3e})"
        lines.append(f"  step {c.step}: outer sync; replicas had drifted {c.drift_before:.3e} apart, now {state}")
    if not checks:
        lines.append(f"  no outer sync ran: run at least {plan.sync_every} steps (--steps)")
    passed = bool(checks) and all(c.spread_after == 0 for c in checks)
    lines.append(f"verify: {'PASSED' if passed else 'FAILED'}")
    return passed, "\n".join(lines)
