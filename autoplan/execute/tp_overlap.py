"""``plan.tp_comm_overlap`` as it runs: PyTorch's asynchronous tensor parallelism.

torch's async TP (the ``_micro_pipeline_tp`` pass of TorchInductor with symmetric memory on the
tp group) rewrites each all-gather -> matmul and matmul -> reduce-scatter pair of a compiled
block into ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, which move one rank's
shard at a time through peer (NVLink) memory while the matmul computes on the shards already
there: the decomposition autoplan/cost/tp/overlap.py prices. It needs CUDA devices of one node
with NCCL, and compiled blocks, as torchtitan's ``maybe_enable_async_tp`` requires; so the
executor compiles each block of the rank's stage after tensor parallelism and recomputation
(step 2-3 of autoplan/execute/api.py) and before FSDP wraps it.

On any other device the plan is refused before a rank starts (:func:`check_runs_here`), in
one sentence that says what to do instead. This machine has no GPU, so the CUDA path is
exercised only where one is present.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.errors import PlanError
from autoplan.execute.compiled import compile_blocks
from autoplan.types.moe_overlap import check_executor_runs
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import step_microbatches


def check_runs_here(plan: Plan) -> None:
    """Raise PlanError, in one sentence, when ``plan`` needs a device this machine lacks: every
    device rule of a plan, async TP's (:func:`check_tp_overlap_runs_here`), FP8's
    (autoplan/execute/float8.py) and context parallelism's (execute/context_parallel.py); or asks
    for what the executor does not run (``overlap_param_gather`` other than ZeRO-1's without experts:
    execute/param_gather.py; ``moe_a2a_overlap``: types/moe_overlap.py; 1F1B on fewer micro-batches than
    stages, which torch's Schedule1F1B refuses). The CLI calls it before a rank
    starts, ``parallelize`` first."""
    from autoplan.execute.float8 import check_runs_here as check_float8_runs_here

    if plan.overlap_param_gather and (plan.zero_stage != 1 or plan.ep * plan.expert_tp > 1):
        raise PlanError(
            f"plan overlap_param_gather=true with zero_stage={plan.zero_stage} and ep={plan.ep}: autoplan's executor "
            "overlaps only ZeRO-1's parameter all-gather without expert parallelism (ZeRO-2 runs as FSDP2, which "
            "gathers after the step); set overlap_param_gather to false or use zero_stage 1 to run here."
        )
    check_executor_runs(plan)  # moe_a2a_overlap runs only in DualPipeV's F&B pairs (types/moe_overlap.py)
    step_m = step_microbatches(plan)  # one schedule step's (types/schedule_steps.py)
    if plan.schedule == "1f1b" and plan.pp > 1 and step_m < plan.pp:  # solve/schedules.py
        per_step = f" ({step_m} in each of {plan.schedule_steps} schedule steps)" if plan.schedule_steps > 1 else ""
        raise PlanError(
            f"plan schedule='1f1b' with pp={plan.pp} and num_microbatches={plan.num_microbatches}{per_step}: torch's "
            "Schedule1F1B needs at least pp micro-batches a schedule step; set schedule to 'gpipe' (the same order "
            "with so few) or use more micro-batches."
        )
    check_tp_overlap_runs_here(plan)
    check_float8_runs_here(plan)
    if plan.cp > 1:  # the cp rules' module loads DTensor (1 s of the launcher's start-up): only for a cp plan
        from autoplan.execute.context_parallel import check_cp_runs_here

        check_cp_runs_here(plan)


def check_tp_overlap_runs_here(plan: Plan) -> None:
    """Raise PlanError when ``plan`` asks for tp_comm_overlap on a device that cannot run it."""
    if not plan.tp_comm_overlap:
        return
    if not torch.cuda.is_available():
        raise PlanError(
            "plan tp_comm_overlap=true runs as torch's async tensor parallelism, which needs CUDA devices with "
            "NCCL, and this machine has none; set tp_comm_overlap to false in the plan (or re-plan with "
            "--fix tp_overlap=off) to run here."
        )
    if plan.tp > torch.cuda.device_count():
        raise PlanError(
            f"plan tp_comm_overlap=true needs its tp group of {plan.tp} inside one node (async TP copies through "
            f"peer memory), but a node here has {torch.cuda.device_count()} GPUs; re-plan with --fix tp_overlap=off."
        )


def apply_async_tp(*, module: nn.Module, blocks: list[str], tp_mesh: DeviceMesh) -> int:
    """Enable async TP on the tp group and compile every block of ``blocks`` in ``module``;
    return how many were compiled."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    return compile_blocks(module=module, blocks=blocks, why="tp_comm_overlap")  # execute/compiled.py
