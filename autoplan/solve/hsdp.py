"""Which HSDP splits the search offers (types/hsdp.py; docs/ilp.md, "HSDP").

A ZeRO plan over dp ranks may also run as R replicas of S = dp / R shard groups. The search offers
full sharding (R = 1) and one split: the smallest shard group of a whole node's dp ranks, n =
devices_per_node / tp (tp dividing the node), or of a power-of-two multiple of it, S = n 2^k >= 2 with
S < dp and S | dp, as torchtitan and Megatron size HSDP (a node per shard group). A shard group inside a
node keeps the all-gathers and reduce-scatters on NVLink and sends only 1/S of the gradients across
nodes. Offering every n 2^k cost the GPT-3 175B case of benchmarks/planning_time.py twice the search
time (docs/ilp.md, "HSDP"); any other legal R is reached with ``--fix dp_replicate=R``. Beside context
parallelism a shard group is S x cp ranks (types/hsdp.py), so n and its multiples count dp x cp ranks and
S = n 2^k / cp. Offered only where the plan's runtime runs HSDP at that ZeRO stage (:func:`runs_hsdp`) and
with ep = 1 (the Plan's rule).
"""

from __future__ import annotations

from autoplan.errors import PlanError

#: The ZeRO stages each runtime runs as HSDP: autoplan's executor (FSDP2 on a 2-D mesh; ZeRO-1's sharded
#: optimizer with a replica all-reduce), torchtitan (FSDP2: ``data_parallel_replicate_degree``), Megatron-Core
#: (``--num-distributed-optimizer-instances``: its distributed optimizer, or Megatron-FSDP's hybrid FSDP);
#: DeepSpeed has none (ZeRO++'s hpZ keeps a second copy of the weights per node, which is not HSDP).
HSDP_STAGES = {"autoplan": (1, 2, 3), "torchtitan": (2, 3), "megatron": (1, 2, 3), "deepspeed": ()}


def runs_hsdp(runtime: str, zero_stage: int) -> bool:
    """Whether ``runtime`` runs HSDP at ``zero_stage`` (:data:`HSDP_STAGES`)."""
    return zero_stage in HSDP_STAGES.get(runtime, ())


def shard_sizes(*, dp: int, tp: int, per_node: int, cp: int = 1) -> list[int]:
    """The shard-group sizes S < dp the search offers (module docstring): the smallest S with S cp = n 2^k
    >= 2 and S dividing dp, n a node's dp x cp ranks."""
    node = per_node // tp if tp <= per_node and per_node % tp == 0 else 1
    size = node  # weight-sharing ranks: S x cp
    while size < dp * cp:
        if size >= 2 and size % cp == 0 and dp % (size // cp) == 0:
            return [size // cp]
        size *= 2
    return []


def replicate_options(
    *, dp: int, tp: int, ep: int, cp: int, zero: int, per_node: int, runtime: str, fixes: dict
) -> list[int]:
    """dp_replicate choices of one (degrees, ZeRO stage): 1, and R = dp / S for each offered S; a pin
    keeps only itself, and only where it is legal (no plan of the group otherwise)."""
    pinned = fixes.get("dp_replicate")
    legal = zero >= 1 and ep == 1 and runs_hsdp(runtime, zero)
    if pinned is not None:
        fits = pinned == 1 or (legal and dp % pinned == 0 and dp // pinned * cp >= 2)
        return [pinned] if fits else []
    if not legal:
        return [1]
    return [1] + [dp // size for size in shard_sizes(dp=dp, tp=tp, per_node=per_node, cp=cp)]


def check_hsdp_pin(fixes: dict, runtime: str) -> None:
    """A dp_replicate pin no plan can take, whatever the degrees: one sentence."""
    pinned = fixes.get("dp_replicate", 1)
    if pinned == 1:
        return
    dp, cp = fixes.get("dp"), fixes.get("cp", 1)
    if dp is not None and (dp % pinned or dp // pinned * cp < 2):
        raise PlanError(
            f"--fix dp_replicate={pinned} with dp={dp}: HSDP splits dp into dp_replicate groups of 2 or more ranks, "
            f"so dp_replicate must divide dp and leave dp / dp_replicate >= 2; pin a divisor of {dp} up to {dp // 2}."
        )
    if "zero" in fixes and not runs_hsdp(runtime, fixes["zero"]):
        stages = HSDP_STAGES.get(runtime, ())
        runs = f"ZeRO {', '.join(map(str, stages))}" if stages else "no ZeRO stage"
        raise PlanError(
            f"--fix dp_replicate={pinned} with zero={fixes['zero']}: HSDP replicates ZeRO-sharded states, and "
            f"runtime '{runtime}' runs it under {runs}; pin one of those stages or drop dp_replicate."
        )
