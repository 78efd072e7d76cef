"""The outer search space, and how the user's pins (solve/pins.py) narrow it (the rules in full,
with their reasons: docs/ilp.md, section 4). Each choice and the rule that makes it legal:

- expert parallelism: ``ep`` divides ``dp`` and every MoE layer's expert count, ``tp = 1``; beside tp > 1,
  or with ``expert_tp``, the experts' own layout where the runtime runs it (solve/expert_layout.py);
- degrees ``dp * cp * tp * pp = devices``; tp inside a node unless pinned; ``pp`` at most the blocks;
  ``dp`` divides the global batch; ``tp = 1`` where DTensor cannot run an op (solve/tp_runnable.py);
  context parallelism ``cp`` where the model and its sequence allow it, with ``ep = 1``
  (solve/context_parallel.py);
- micro-batch size: every divisor of ``batch / dp``;
- schedule (solve/schedules.py): "1f1b" at ``pp = 1``; else gpipe, 1f1b, interleaved 1F1B and the
  zero-bubble schedules;
- ZeRO 0-3 (1-3 only with ``dp > 1``, :func:`check_zero_pin`); recomputation none, selective, full;
- sequence parallelism (``tp > 1``, tp dividing every sequence: solve/sequence_parallel.py);
  TP communication overlap (with SP, on NCCL, tp inside a node);
- precision: fp32; bf16, or fp16 without bf16; fp8 only with ``allow_fp8`` or a pin, where the
  profile has fp8 and bf16 peaks; a model built in bf16 or fp16 only that (solve/built_in_precision.py);
- gradient sync: fp32; with ``allow_lossy`` a 16-bit reduction, where the executor runs DDP PowerSGD at the
  pinned rank or :data:`DEFAULT_POWERSGD_RANK` and top-k at DGC's ratios (solve/sparsify.py), and local SGD
  and DiLoCo over the replicas (solve/local_sgd.py); the cost model knows no accuracy; under ZeRO-1 without
  experts, the weights' all-gather after the step or under the next forward;
- HSDP under ZeRO 1-3: full sharding, or shard groups of a node's dp ranks times a power of two (solve/hsdp.py).
- offload (solve/offload.py): "optimizer" beside ZeRO-1, "full" beside ZeRO-3 at pp = 1, where the profile
  has a host section and the runtime runs it; chosen only where it pays (it always costs step time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from autoplan.errors import PlanError
from autoplan.solve.context_parallel import cp_allows
from autoplan.solve.expert_layout import layout_options, zero_runs
from autoplan.solve.hsdp import check_hsdp_pin, replicate_options
from autoplan.solve.local_sgd import outer_sync_options
from autoplan.solve.offload import offload_options
from autoplan.solve.pins import check_budget_pin
from autoplan.solve.schedules import schedule_options  # noqa: F401 (space.schedule_options: the search's name)
from autoplan.solve.sparsify import check_compression_pins, keep_pinned, lossy_topk_pins, topk_ratios
from autoplan.types.graph import Graph
from autoplan.types.plan import RECOMPUTE, runs_ddp
from autoplan.types.prediction import OBJECTIVES  # noqa: F401 (space.OBJECTIVES: the search's name)
from autoplan.types.profile import Profile
from autoplan.types.runtime import check_runtime_choices, runtime_named

#: PowerSGD's rank when the planner picks it unpinned: Vogels et al. (NeurIPS 2019) section 5
#: reach the uncompressed test accuracy with rank 2 on ResNet-18/CIFAR-10 and rank 4 on an
#: LSTM/WikiText-2; the larger of the two is the safer default for language models.
DEFAULT_POWERSGD_RANK = 4


@dataclass(frozen=True)
class Degrees:
    devices: int
    dp: int
    tp: int
    pp: int
    ep: int = 1
    cp: int = 1
    expert_tp: int = 1  # the experts' own layout (solve/expert_layout.py)

    @property
    def dp_cp(self) -> int:
        """The ranks that hold the same weights and reduce gradients together (types/layout.py's dp x cp
        group): what ZeRO partitions over and the gradient sync spans."""
        return self.dp * self.cp


def check_cluster(profile: Profile, devices: int) -> None:
    """Bad device counts for this profile, in one sentence each."""
    per_node = profile.devices_per_node
    if not isinstance(devices, int) or devices < 1:
        raise PlanError(f"--devices {devices!r} is not a positive integer.")
    if devices > per_node and profile.inter_node is None:
        raise PlanError(
            f"profile '{profile.name}' describes one node of {per_node} devices and no inter-node link; "
            f"plan for at most {per_node} devices."
        )
    if devices > per_node and devices % per_node:
        raise PlanError(
            f"--devices {devices} does not fill whole nodes of {per_node} on profile '{profile.name}'; "
            f"use a multiple of {per_node} (or at most {per_node})."
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_in_node(tp: int, *, devices: int, per_node: int) -> bool:
    return tp <= per_node and (per_node % tp == 0 if devices >= per_node else devices % tp == 0)


@dataclass(frozen=True)
class RefusedShape:
    """A (dp, tp, pp, cp) on ``devices`` no plan may take, and the rule that refused it: ``pin KEY``, ``layers``
    (pp above the blocks), ``batch`` (it does not divide by dp), ``tp node`` or ``tp ops`` (max_tp)."""

    devices: int
    dp: int
    tp: int
    pp: int
    rule: str
    cp: int = 1


def degree_options(
    *,
    devices: int,
    per_node: int,
    layers: int,
    batch: int,
    fixes: dict,
    eps: tuple[int, ...] = (1,),
    max_tp: int | None = None,
    refused: list[RefusedShape] | None = None,
    cp_seq_len: int = 0,
    runtime: str = "autoplan",
    etp_ok: Any = True,
    cp_beside_pp: bool = True,
    whole_batch: bool = False,
) -> list[Degrees]:
    """Every (dp, tp, pp, ep, cp) the rules and the pins allow (module docstring); ``eps`` are the
    expert-parallel degrees the model's MoE layers allow (cost/moe/experts.py:ep_options), ``max_tp`` the
    largest tp its ops run under (solve/tp_runnable.max_tp; None: no limit), ``cp_seq_len`` the sequence
    cp may split (solve/context_parallel.cp_sequence; 0: cp = 1 only), ``cp_beside_pp`` whether cp > 1 may
    share a plan with pp > 1 (solve/context_parallel.cp_beside_pp), ``whole_batch`` whether the model's output couples
    the batch's samples (Graph.batch_coupled: dp = 1 only, solve/whole_batch.py). Each shape a rule
    refuses is appended to ``refused`` (the search's record: solve/notes.py reads it)."""
    refused = [] if refused is None else refused
    options, experts = [], dict(eps=eps, fixes=fixes, runtime=runtime, etp_ok=etp_ok)  # solve/expert_layout.py
    for tp in _divisors(devices):
        for cp in [c for c in _divisors(devices // tp) if cp_allows(c, seq_len=cp_seq_len)]:
            for pp in _divisors(devices // (tp * cp)):
                dp = devices // (tp * cp * pp)
                rule = _tp_rule(tp, devices, per_node, fixes, max_tp) or _shape_rule(dp, pp, layers, batch, fixes)
                rule = rule or ("pin cp" if "cp" in fixes and cp != fixes["cp"] else "")
                rule = rule or ("cp masks pp" if cp > 1 and pp > 1 and not cp_beside_pp else "")
                rule = rule or ("whole batch" if whole_batch and dp > 1 else "")
                if rule:
                    refused.append(RefusedShape(devices=devices, dp=dp, tp=tp, pp=pp, rule=rule, cp=cp))
                    continue
                options += [
                    Degrees(devices=devices, dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, expert_tp=etp)
                    for ep, etp in layout_options(dp=dp, tp=tp, cp=cp, **experts)
                ]
    return options


def _tp_rule(tp: int, devices: int, per_node: int, fixes: dict, max_tp: int | None) -> str:
    if max_tp is not None and tp > max_tp:
        return "tp ops"
    if "tp" in fixes:
        return "pin tp" if tp != fixes["tp"] else ""
    return "" if tp_in_node(tp, devices=devices, per_node=per_node) else "tp node"


def _shape_rule(dp: int, pp: int, layers: int, batch: int, fixes: dict) -> str:
    if pinned := [key for key, value in (("dp", dp), ("pp", pp)) if key in fixes and value != fixes[key]]:
        return f"pin {pinned[0]}"
    if pp > max(layers, 1):
        return "layers"
    return "batch" if batch % dp else ""


def micro_batch_options(*, batch: int, dp: int, fixes: dict, whole: bool = False) -> list[int]:
    """The micro-batch sizes a dp replica's share of the batch splits into; ``whole``: the share as one micro-batch
    (a model whose output couples the batch's samples, Graph.batch_coupled)."""
    per_replica = batch // dp
    if whole:
        return [per_replica] if fixes.get("mbs", per_replica) == per_replica else []
    if "mbs" in fixes:
        return [fixes["mbs"]] if per_replica % fixes["mbs"] == 0 else []
    return _divisors(per_replica)


def tp_overlap_options(*, profile: Profile, tp: int, sequence_parallel: bool, fixes: dict) -> list[bool]:
    """tp_comm_overlap choices (module docstring); pinning it on where it cannot run is an error."""
    runs = sequence_parallel and profile.backend == "nccl" and 1 < tp <= profile.devices_per_node
    if fixes.get("tp_overlap") is True:
        if not sequence_parallel:
            return []  # the pin asks for sp as well; the group without it has no plan
        if not runs:
            raise PlanError(
                f"--fix tp_overlap=on needs an NCCL (GPU) profile with the tp group inside one node; profile "
                f"'{profile.name}' runs {profile.backend}"
                f"{'' if tp <= profile.devices_per_node else f' and tp={tp} spans nodes'}: drop the pin."
            )
        return [True]
    if fixes.get("tp_overlap") is False:
        return [False]
    return [False, True] if runs else [False]


@dataclass(frozen=True)
class GradSync:
    """How data-parallel gradients and weights travel: the plan's grad_reduce_dtype, grad_compression,
    powersgd_rank and overlap_param_gather (``param_gather``)."""

    reduce_dtype: str = "fp32"
    compression: str = "none"
    rank: int = 0
    param_gather: bool = False
    replicate: int = 1  # HSDP's dp_replicate (solve/hsdp.py)
    offload: str = "none"
    sync_every: int = 1  # local SGD / DiLoCo (solve/local_sgd.py)
    outer_optimizer: str = "average"
    ratio: float = 0.0  # top-k's topk_ratio (solve/sparsify.py)


EXACT = GradSync()


def check_lossy_pins(graph: Graph, fixes: dict, *, allow_lossy: bool) -> None:
    """A lossy pin without --allow-lossy, or a PowerSGD rank no matrix can use: one sentence."""
    asked = [f"reduce={fixes['reduce']}"] if fixes.get("reduce", "fp32") != "fp32" else []
    asked += [f"powersgd={fixes['powersgd']}"] if fixes.get("powersgd") else []
    asked += lossy_topk_pins(fixes)
    check_compression_pins(fixes)
    if asked and not allow_lossy:
        raise PlanError(
            f"--fix {', '.join(asked)} is lossy (the optimizer then sees a rounded or compressed gradient "
            "sum, not the exact one); add --allow-lossy to allow it."
        )
    if fixes.get("powersgd"):
        from autoplan.cost import check_rank  # the CLI parser imports this module: no torch yet

        check_rank(graph, fixes["powersgd"])


def dp_options(profile: Profile, *, deg: Degrees, fixes: dict, options: Any) -> list[tuple[int, GradSync]]:
    """(ZeRO stage, gradient sync with its HSDP split and offload) choices of one degree under the search's
    ``options`` (``allow_lossy``: --allow-lossy; ``runtime``: which ZeRO stages run as HSDP, solve/hsdp.py,
    and which offloads, solve/offload.py); offload runs without HSDP (types/offload.py)."""
    layouts = [
        (zero, replace(grads, replicate=replicate, offload=offload))
        for zero in zero_options(dp=deg.dp_cp, fixes=fixes)
        if zero_runs(deg, zero, runtime=options.runtime)  # solve/expert_layout.py
        for grads in grad_sync_options(profile, deg=deg, zero=zero, fixes=fixes, allow_lossy=options.allow_lossy)
        for replicate in replicate_options(
            dp=deg.dp,
            tp=deg.tp,
            ep=deg.ep * deg.expert_tp,  # HSDP without the experts' own layout
            cp=deg.cp,
            zero=zero,
            per_node=profile.devices_per_node,
            runtime=options.runtime,
            fixes=fixes,
        )
        for offload in offload_options(profile, deg=deg, zero=zero, grads=grads, fixes=fixes, runtime=options.runtime)
        if offload == "none" or replicate == 1
    ]
    outer = partial(outer_sync_options, deg=deg, fixes=fixes, allow_lossy=options.allow_lossy, runtime=options.runtime)
    return [
        (zero, replace(grads, sync_every=every, outer_optimizer=name))
        for zero, grads in layouts
        for every, name in outer(zero=zero, grads=grads)
    ]


def grad_sync_options(profile: Profile, *, deg: Degrees, zero: int, fixes: dict, allow_lossy: bool) -> list[GradSync]:
    """The gradient-sync choices of one (degrees, ZeRO stage) (module docstring)."""
    if deg.dp_cp == 1:
        return [EXACT]
    options = [EXACT]
    if allow_lossy:
        low = "bf16" if "bf16" in profile.device.peak_flops else "fp16"
        pinned = fixes.get("reduce")
        options.append(replace(EXACT, reduce_dtype=pinned if pinned and pinned != "fp32" else low))
        ddp = runs_ddp(dp=deg.dp, tp=deg.tp, pp=deg.pp, zero_stage=zero)  # the search overlaps the reduction
        if ddp and deg.ep == deg.cp == 1 and fixes.get("powersgd", 1):
            rank = fixes.get("powersgd") or DEFAULT_POWERSGD_RANK
            options.append(GradSync(compression="powersgd", rank=rank))
    if runs_ddp(dp=deg.dp, tp=deg.tp, pp=deg.pp, zero_stage=zero) and deg.ep == deg.cp == 1:
        options += [GradSync(compression="topk", ratio=r) for r in topk_ratios(fixes, allow_lossy=allow_lossy)]
    if "reduce" in fixes:
        options = [o for o in options if o.reduce_dtype == fixes["reduce"]]
    if fixes.get("powersgd"):
        options = [o for o in options if o.compression == "powersgd"]
    options = keep_pinned(options, fixes)
    return param_gather_options(options, deg=deg, zero=zero, fixes=fixes)


def param_gather_options(options: list[GradSync], *, deg: Degrees, zero: int, fixes: dict) -> list[GradSync]:
    """ZeRO-1 without experts may also all-gather its updated weights per block under the next
    forward (``overlap_param_gather``, execute/param_gather.py): each option twice, unless pinned."""
    pinned = fixes.get("param_gather")
    if zero != 1 or deg.ep * deg.expert_tp > 1:
        return [] if pinned else options
    both = [o for o in options] + [replace(o, param_gather=True) for o in options]
    return both if pinned is None else [o for o in both if o.param_gather == pinned]


def zero_options(*, dp: int, fixes: dict) -> list[int]:
    """ZeRO stages over ``dp`` ranks holding the same weights (a plan's dp x cp: :attr:`Degrees.dp_cp`)."""
    options = [0, 1, 2, 3] if dp > 1 else [0]
    return [z for z in options if z == fixes["zero"]] if "zero" in fixes else options


#: What each ZeRO stage partitions over the data-parallel ranks (Rajbhandari et al., SC'20, section 5).
ZERO_PARTITIONS = {
    1: "optimizer states",
    2: "optimizer states and gradients",
    3: "optimizer states, gradients and weights",
}


def check_zero_pin(degrees: list[Degrees], fixes: dict, *, runtime: str = "autoplan") -> None:
    """A ZeRO pin where every configuration the other pins leave has dp = 1: the rule, in one
    sentence. ZeRO partitions over the data-parallel ranks, and one rank has nothing to share
    with, so ZeRO-k at dp = 1 is the zero=0 plan and the search lists it once, as zero=0. And a
    dp_replicate pin with a ZeRO pin the runtime does not run HSDP at (solve/hsdp.py)."""
    check_hsdp_pin(fixes, runtime)
    if fixes.get("param_gather") and fixes.get("zero", 1) != 1:
        raise PlanError(
            f"--fix param_gather=on overlaps ZeRO-1's weight all-gather with the next forward, and --fix "
            f"zero={fixes['zero']} is not ZeRO-1; pin zero=1 or drop param_gather."
        )
    zero = fixes.get("zero", 0)
    if not zero or not degrees or any(d.dp_cp > 1 for d in degrees):
        return
    splits = sorted({f"tp={d.tp}, pp={d.pp}" for d in degrees})
    left = splits[0] if len(splits) == 1 else f"every split ({'; '.join(splits)})"
    raise PlanError(
        f"--fix zero={zero} partitions {ZERO_PARTITIONS[zero]} over the data-parallel ranks, and {left} on "
        f"{degrees[0].devices} devices leaves dp=1, one rank with nothing to partition; pin zero=0 (the same plan), "
        "or leave dp > 1 with a smaller tp or pp."
    )


def recompute_options(*, fixes: dict, layers: int) -> list[str]:
    """Recomputation checkpoints blocks: a model without blocks has only "none"."""
    check_budget_pin(fixes, layers=layers)
    if "recompute" in fixes:
        if fixes["recompute"] != "none" and not layers:
            raise PlanError(
                f"--fix recompute={fixes['recompute']} checkpoints repeated blocks and this model has none; "
                "use recompute=none."
            )
        return [fixes["recompute"]]
    budgeted = "recompute_blocks" in fixes  # a pinned budget budgets full or selective (solve/recompute_budget.py)
    return [mode for mode in RECOMPUTE if mode != "none" or not budgeted] if layers else ["none"]


def precision_options(
    profile: Profile, *, fixes: dict, allow_fp8: bool = False, runtime: str = "autoplan", built_in: str = ""
) -> list[str]:
    """The precisions searched (module docstring); fp8 only when allowed or pinned, and only for a
    runtime that runs an FP8 recipe (types/runtime.py). ``built_in``: the 16-bit precision a model's floating
    parameters were all built in (``torch_dtype=torch.bfloat16``), which it computes in whatever autocast says: that
    precision only, where the plan once read fp32 and --verify judged a bf16 model by fp32's tolerance."""
    if built_in:
        if fixes.get("precision", built_in) != built_in:
            raise PlanError(
                f"--fix precision={fixes['precision']}, but the model's parameters are all {built_in} (built so), and "
                f"it computes in {built_in}; pin precision={built_in}, or build the model in fp32."
            )
        return [built_in]
    peaks = profile.device.peak_flops
    if fixes.get("precision") == "fp8":
        check_runtime_choices(runtime=runtime, compile=False, precision="fp8", fp8_recipe="")
    runs_fp8 = bool(runtime_named(runtime).fp8_recipes)
    fp8 = runs_fp8 and "fp8" in peaks and "bf16" in peaks and (allow_fp8 or fixes.get("precision") == "fp8")
    options = (
        (["fp32"] if "fp32" in peaks or "tf32" in peaks else [])
        + (["bf16"] if "bf16" in peaks else ["fp16"] if "fp16" in peaks else [])
        + (["fp8"] if fp8 else [])
    )
    if "precision" in fixes:
        wanted = fixes["precision"]
        if wanted == "fp8" and wanted not in options:
            raise PlanError(
                f"--fix precision=fp8 but profile '{profile.name}' ({profile.device.name}) has no "
                f"{'fp8' if 'fp8' not in peaks else 'bf16'} peak: FP8 training needs a GPU with FP8 tensor cores "
                "(H100, H200, ...) and runs the rest in bf16; use precision=bf16."
            )
        if wanted != "fp32" and wanted not in peaks:
            raise PlanError(
                f"--fix precision={wanted} but profile '{profile.name}' has no {wanted} peak; "
                f"pick one of {', '.join(sorted(peaks))}."
            )
        return [wanted]
    return options


def device_counts(*, devices: int, objective: str, profile: Profile) -> list[int]:
    """The device counts searched: ``devices`` for the time objective; for a dollar objective every
    divisor of it that fills whole nodes, since fewer devices can train more cheaply."""
    if objective == "time":
        return [devices]
    return [d for d in range(1, devices + 1) if devices % d == 0 and fits_nodes(d, profile)]


def fits_nodes(devices: int, profile: Profile) -> bool:
    per_node = profile.devices_per_node
    return devices <= per_node or (devices % per_node == 0 and profile.inter_node is not None)
