"""A plan priced for the runtime that will run it once exported (docs/export.md, "Priced for the
target's runtime"; the runtimes: docs/cost-model.md, "Runtimes").

``autoplan export --to F`` hands the layout to framework F, which runs it with its own kernels and
overlaps (types/runtime.py). The same layout is priced again with ``Plan.runtime`` set to F's
runtime (:data:`FRAMEWORK_RUNTIME`), with ``compile`` kept only where F compiles blocks and the FP8
recipe left to F's default; its step time is shown beside the one autoplan's executor would take.
Accelerate hands the layout to FSDP or DeepSpeed through the user's own script: it has no preset.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoplan.types.graph import Graph
from autoplan.types.local_sgd import synchronous_fields
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.runtime import runtime_named

#: the runtime preset each export target runs (none for accelerate)
FRAMEWORK_RUNTIME = {"megatron": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}


@dataclass(frozen=True)
class RuntimePrice:
    """One plan's step time under autoplan's executor and under the target's runtime."""

    runtime: str
    autoplan_step_s: float
    runtime_step_s: float

    def to_dict(self) -> dict:
        return {"runtime": self.runtime, "autoplan_step_s": self.autoplan_step_s, "runtime_step_s": self.runtime_step_s}


def for_runtime(plan: Plan, runtime: str) -> Plan:
    """``plan``'s layout as ``runtime`` runs it (module docstring): synchronous outside autoplan's executor,
    which alone runs local SGD's outer sync (export/local_sgd.py)."""
    preset = runtime_named(runtime)
    sync = {} if runtime == "autoplan" else synchronous_fields()
    return replace(
        plan, runtime=runtime, compile=plan.compile and preset.compile, fp8_recipe="", predicted=None, **sync
    )


def price_for_framework(plan: Plan, *, graph: Graph, profile: Profile, framework: str) -> RuntimePrice | None:
    """The plan's step time for autoplan's executor and for ``framework``'s runtime; None for a
    framework without a runtime preset."""
    from autoplan.cost import CostModel

    runtime = FRAMEWORK_RUNTIME.get(framework)
    if runtime is None:
        return None
    model = CostModel(graph, profile)
    own = model.estimate(for_runtime(plan, "autoplan")).step_time_s
    return RuntimePrice(runtime, own, model.estimate(for_runtime(plan, runtime)).step_time_s)
