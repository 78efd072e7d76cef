"""The predicted side of ``autoplan run --audit``: what the cost model says one rank of each
pipeline stage sends, holds and computes in one step, and its peak live memory.

``autoplan run --audit`` computes it before any rank starts (autoplan/cli/rank.py, from
``cost.volumes.predict`` and ``CostModel.stage_memory``) and writes it to the run folder as
``audit_predicted.json``; rank 0 reads it after the audited step and writes ``audit.csv``
(autoplan/execute/job/audit.py), so a rank never traces the model nor builds a cost model.
Units are in names (``_bytes``, ``_elements``, ``_flops``).

Under expert parallelism the prediction also says how a rank's price moves with the rows its experts receive
(cost/moe/routed_rows.py): ``expert_rows`` at balanced routing, and ``per_expert_row``, what one row more adds to
each of :data:`ROUTED` (the peak from ``balanced_peak_bytes``), so the audit compares each rank with the price at
the routing it ran (execute/job/routing_audit.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.errors import RunError
from autoplan.types._check import require, write_json_atomic

#: the file in the run folder
FILE_NAME = "audit_predicted.json"
#: the quantities that follow a rank's received rows: the ep all-to-alls' bytes (the audit's comm row), the FLOP
#: fields, and the peak
A2A_ROW, FORWARD_FLOPS, BACKWARD_FLOPS, PEAK = "comm ep all_to_all", "forward_flops", "backward_flops", "peak_bytes"
ROUTED = (A2A_ROW, FORWARD_FLOPS, BACKWARD_FLOPS, PEAK)


@dataclass(frozen=True)
class StageAuditPrediction:
    """One rank of one pipeline stage, per step: ``comm`` maps (mesh dim, collective) to
    [count (None when the count is not priced), bytes]."""

    comm: dict[tuple[str, str], list] = field(default_factory=dict)
    param_elements: float = 0.0
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    attention_forward_flops: float = 0.0
    attention_backward_flops: float = 0.0
    fused_regions: int = 0  # compiled blocks' fused regions (cost/compute/fusion.py), once per distinct block
    peak_bytes: float = 0.0
    expert_rows: float = 0.0  # rows this rank's experts receive in a step at balanced routing (module docstring)
    per_expert_row: dict[str, float] = field(default_factory=dict)  # of ROUTED: what a received row more adds
    balanced_peak_bytes: float = 0.0  # the peak at balanced routing (peak_bytes: at the plan's imbalance)

    def to_dict(self) -> dict[str, Any]:
        scalars = {k: v for k, v in self.__dict__.items() if k != "comm"}
        return {"comm": [[dim, kind, count, size] for (dim, kind), (count, size) in self.comm.items()], **scalars}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageAuditPrediction:
        comm = {(dim, kind): [count, size] for dim, kind, count, size in data.get("comm", [])}
        return cls(comm=comm, **{k: v for k, v in data.items() if k != "comm"})


@dataclass(frozen=True)
class AuditPrediction:
    """Per pipeline stage, the prediction for ``plan`` (its ``Plan.describe()``)."""

    plan: str
    stages: tuple[StageAuditPrediction, ...]

    def save(self, folder: str | Path) -> Path:
        data = {"plan": self.plan, "stages": [stage.to_dict() for stage in self.stages]}
        return write_json_atomic(Path(folder) / FILE_NAME, data)

    @classmethod
    def load(cls, folder: str | Path, *, plan: str) -> AuditPrediction:
        """The prediction written in ``folder`` for the plan described ``plan``; one sentence otherwise."""
        path = Path(folder) / FILE_NAME
        require(path.is_file(), RunError, f"--audit: '{path}' is missing; `autoplan run --audit` writes it.")
        data = json.loads(path.read_text())
        require(
            data.get("plan") == plan,
            RunError,
            f"--audit: '{path}' predicts plan '{data.get('plan')}', not the plan run ('{plan}').",
        )
        return cls(plan=plan, stages=tuple(StageAuditPrediction.from_dict(s) for s in data["stages"]))
