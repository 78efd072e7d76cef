"""What the planner predicted for a plan, as typed data: ``Plan.predicted``.

A :class:`Prediction` is the cost model's headline numbers for the plan (from a
:class:`autoplan.types.cost.Cost`), its time and memory breakdowns, and, when the planner made
the plan, a :class:`SearchSummary` of the search that chose it (what ``autoplan explain``
re-runs from). In plan.json it is the ``predicted`` object, with the same keys as before it was
typed (docs/plan-format.md); a plan nobody priced has ``predicted: {}``.

When the profile has storage and reliability sections the prediction also records the
checkpoint interval that minimises expected lost time and the expected goodput of the plan on
its cluster (autoplan/cost/run/reliability.py); otherwise those keys are absent from the JSON.
When the planner was given the whole run's length (``--tokens`` or ``--steps``), ``run`` holds
its :class:`autoplan.types.run.RunEstimate`: steps, wall time, device-hours and dollars.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.errors import PlanError
from autoplan.types._check import require, require_known_fields
from autoplan.types.cost import Cost
from autoplan.types.run import RunEstimate

#: What the search minimises (``--objective``, ``SearchSummary.objective``): step time, or dollars per sample.
OBJECTIVES = ("time", "cost")


@dataclass
class SearchSummary:
    """How the search that chose the plan went, and the options it ran with."""

    candidates_evaluated: int = 0
    candidates_pruned: int = 0
    search_time_s: float = 0.0
    ilp_solves: int = 0
    ilp_status: str = ""
    ilp_gap: float = 0.0
    batch_size: int | None = None
    fixes: dict[str, Any] = field(default_factory=dict)
    objective: str = "time"
    allow_lossy: bool = False  # lossy gradient sync was searched (--allow-lossy)
    allow_fp8: bool = False  # fp8 was searched (--allow-fp8); absent in plans of before, which searched it
    search_processes: int = 1  # the processes the search ran on (solve/shares.py); absent in plans of before: 1

    def __post_init__(self) -> None:
        for name in ("candidates_evaluated", "candidates_pruned", "ilp_solves", "search_processes"):
            value = getattr(self, name)
            require(
                isinstance(value, int) and value >= 0,
                PlanError,
                f"plan predicted.search.{name}={value!r}; expected an integer >= 0.",
            )
        require(
            isinstance(self.fixes, dict), PlanError, f"plan predicted.search.fixes={self.fixes!r}; expected a mapping."
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SearchSummary":
        require_known_fields(data, cls, PlanError, "plan predicted.search")
        return cls(**data)


@dataclass
class Prediction:
    """The predicted step of a plan (module docstring); times in seconds, memory in bytes per device."""

    step_time_s: float
    samples_per_s: float = 0.0
    tokens_per_s: float | None = None
    peak_memory_bytes: float = 0
    memory_capacity_bytes: float = 0
    mfu: float = 0.0
    cost_per_step_usd: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)  # Cost.TIME_FIELDS
    memory: dict[str, float] = field(default_factory=dict)  # Cost.MEMORY_FIELDS
    search: SearchSummary | None = None
    # checkpoints and failures (cost/run/reliability.py); None when the profile cannot price them
    checkpoint_bytes: float | None = None
    checkpoint_write_s: float | None = None
    checkpoint_read_s: float | None = None
    checkpoint_interval_s: float | None = None
    checkpoint_every_steps: int | None = None
    job_mtbf_s: float | None = None
    expected_goodput: float | None = None
    run: RunEstimate | None = None  # the whole run (types/run.py); None without --tokens/--steps

    RELIABILITY_FIELDS = (
        "checkpoint_bytes",
        "checkpoint_write_s",
        "checkpoint_read_s",
        "checkpoint_interval_s",
        "checkpoint_every_steps",
        "job_mtbf_s",
        "expected_goodput",
    )

    def __post_init__(self) -> None:
        value = self.step_time_s
        require(
            isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
            PlanError,
            f"plan predicted.step_time_s={value!r}; expected a number of seconds >= 0.",
        )
        for name, allowed in (("breakdown", Cost.TIME_FIELDS), ("memory", Cost.MEMORY_FIELDS)):
            unknown = sorted(set(getattr(self, name)) - set(allowed))
            first = unknown[0] if unknown else ""
            require(
                not unknown,
                PlanError,
                f"plan predicted.{name} has unknown term '{first}'; expected some of {', '.join(allowed)}.",
            )
        if isinstance(self.search, dict):
            self.search = SearchSummary.from_dict(self.search)
        if isinstance(self.run, dict):
            self.run = RunEstimate.from_dict(self.run)
        goodput = self.expected_goodput
        require(
            goodput is None or (isinstance(goodput, (int, float)) and 0.0 <= goodput <= 1.0),
            PlanError,
            f"plan predicted.expected_goodput={goodput!r}; expected a fraction in [0, 1].",
        )
        steps = self.checkpoint_every_steps
        require(
            steps is None or (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1),
            PlanError,
            f"plan predicted.checkpoint_every_steps={steps!r}; expected an integer >= 1.",
        )

    @property
    def has_goodput(self) -> bool:
        return self.expected_goodput is not None

    @classmethod
    def from_cost(
        cls, cost: Cost, search: SearchSummary | None = None, run: RunEstimate | None = None, **reliability: Any
    ) -> "Prediction":
        """From a Cost; ``reliability`` = cost/run/reliability.py ``prediction_fields`` (may be empty),
        ``run`` = the whole run's estimate (cost/run/whole_run.py), if any."""
        return cls(
            step_time_s=cost.step_time_s,
            samples_per_s=cost.samples_per_s,
            tokens_per_s=cost.tokens_per_s,
            peak_memory_bytes=cost.peak_memory_bytes,
            memory_capacity_bytes=cost.memory_capacity_bytes,
            mfu=cost.mfu,
            cost_per_step_usd=cost.cost_per_step_usd,
            breakdown={name: getattr(cost, name) for name in Cost.TIME_FIELDS},
            memory={name: getattr(cost, name) for name in Cost.MEMORY_FIELDS},
            search=search,
            run=run,
            **reliability,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.search is None:
            del data["search"]
        if self.run is None:
            del data["run"]
        else:
            data["run"] = self.run.to_dict()
        for name in self.RELIABILITY_FIELDS:
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Prediction":
        require_known_fields(data, cls, PlanError, "plan predicted")
        require(
            "step_time_s" in data,
            PlanError,
            "plan predicted has no 'step_time_s'; a prediction needs at least the step time (or use predicted: {}).",
        )
        return cls(**data)
