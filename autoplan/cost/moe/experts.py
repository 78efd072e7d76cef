"""Mixture-of-Experts layers under expert parallelism: grouped GEMMs, all-to-all, expert memory
(docs/cost-model.md, "Mixture-of-Experts and expert parallelism"; docs/moe.md).

Per MoE layer, micro-batch and rank: ``E`` routed experts over ``ep`` ranks, each one's FFN over ``e = expert_tp``
(types/expert_layout.py), ``f`` = micro_batch_size / graph.batch_size, ``s`` the share of its tokens a rank routes
(1/tp under SP), ``C`` each expert's traced slots, ``H`` hidden, ``b`` bytes, ``i`` the imbalance (1 at ep = 1):

- grouped GEMM (each traced ``[E, C, K] x [E, K, N]``): ``G = E / ep`` GEMMs of ``M = i ep e C f s`` rows
  (the etp group's gathered rows) on ``N' = N / e`` of the weight, on one such GEMM's efficiency curve:

      t_fwd = G * max( 2 M' K N' / (peak * eff(2 M K N')),  (M K + K N' + M N') b / (mem_bw * mem_eff) )
      t_bwd = 2 t_fwd,   M' = ceil(M / m_tile) * m_tile   (m_tile 128 on GPUs: DeepGEMM's layout; 1 on a CPU)

  FP8 where the runtime runs experts so (compute/fp8.py ``FP8_EXPERT_RUNTIMES``): the FP8 peak x the recipe's
  GEMM speed, plus the casts of G M rows and G K N' weights (compute/fp8.py ``cast_bytes``);
- all-to-all (GShard, Lepikhin et al. 2021 section 2.3; Megatron-Core's ``MoEAlltoAllTokenDispatcher``), one
  message ``S = i E C f s H b`` on the ep group (mesh.ep_groups):

      t_a2a = t(counts) + 2 t(S) forward, 2 t(S) backward     (comm.collective_time_s; again under full recompute)
- e > 1: the etp group gathers the rows received and reduce-scatters the experts' output (Megatron-Core's
  dispatcher) as all-to-alls of ``e S`` (execute/expert_tp.py) with ``e`` copies of the counts forward:
  ``t(counts e) + 2 t_A2A(e S)`` forward, ``2 t_A2A(e S)`` backward;
- memory: ``1 / (ep e)`` of each routed expert's parameters, reduced and ZeRO-sharded over edp; the busiest rank's
  expert activations ``i`` times the mean, all-to-all outputs kept (selective), :func:`dispatch_saved_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cost.compute.fp8 import TENSORWISE, Fp8Recipe, cast_bytes
from autoplan.cost.compute.roofline import PRECISION_BYTES, memory_time_s, peak_dtype, with_host_overhead
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.types.graph import Graph, OpNode, within
from autoplan.types.hash_once import hash_once
from autoplan.types.moe import MoELayer
from autoplan.types.profile import Profile

GPU_M_TILE = 128  # DeepGEMM contiguous-layout M alignment (module docstring)
COUNT_BYTES = 8  # one int64 count per expert


@hash_once
@dataclass(frozen=True)
class ExpertPlacement:
    """How a plan places MoE experts: the ep degree, the busiest rank's load over the mean, and
    where the ep group's ranks sit; the experts' tensor-parallel degree and group, and the share of a
    micro-batch's tokens a rank routes (module docstring)."""

    ep: int
    imbalance: float
    group: AxisGroup
    etp: int = 1
    etp_group: AxisGroup = AxisGroup(size=1, ranks_per_node=1)
    tokens: float = 1.0
    weights_combined: bool = True  # the dispatch weights the combined rows, keeping them (dispatch_saved_bytes)

    @property
    def split(self) -> int:
        """The ranks one expert's parameters are split over: ep x etp."""
        return self.ep * self.etp


@dataclass(frozen=True)
class ExpertTimes:
    """One MoE layer, one micro-batch, on the busiest rank."""

    gemm_fwd_s: float
    gemm_bwd_s: float
    a2a_fwd_s: float
    a2a_bwd_s: float


def runs_grouped(moe: MoELayer) -> bool:
    """Whether the layer's experts are one module of stacked weights (the grouped interface)."""
    return moe.interface == "grouped"


def layers_in(graph: Graph, nodes: tuple[OpNode, ...]) -> list[MoELayer]:
    """The grouped MoE layers whose experts run among ``nodes``."""
    enclosing = set()  # every module a node runs in, and each module enclosing one: within(m, p) for any m
    for module in {n.module for n in nodes}:
        enclosing.add(module)
        dot = module.find(".")
        while dot >= 0:
            enclosing.add(module[:dot])
            dot = module.find(".", dot + 1)
    return [moe for moe in graph.moe_layers if runs_grouped(moe) and moe.experts_module in enclosing]


def is_expert_gemm(node: OpNode, moe: MoELayer) -> bool:
    """A batched matmul over the layer's experts: ``[E, C, N]`` in the experts module."""
    shape = node.output_shape
    return (
        node.op in ("matmul", "linear")  # a bmm, or one that adds a bias (GPT-OSS)
        and within(node.module, moe.experts_module)
        and len(shape) == 3
        and shape[0] == moe.num_experts
        and node.fwd_flops > 0
    )


def grouped_gemm_s(
    node: OpNode,
    moe: MoELayer,
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    place: ExpertPlacement,
    recipe: Fp8Recipe = TENSORWISE,
    casts: bool = True,
) -> tuple[float, float]:
    """(forward, backward) seconds of one traced expert matmul run as a grouped GEMM, in FP8 when ``recipe``
    covers the experts (module docstring); without FP8's ``casts`` for the search's floor (cost/bounds.py)."""
    experts, slots, n_out = node.output_shape
    k_in = node.fwd_flops / (2.0 * experts * slots * n_out)
    groups = experts // place.ep
    rows = place.imbalance * place.ep * place.etp * slots * batch_fraction * place.tokens
    n_out = n_out / place.etp  # each etp rank holds 1/etp of the FFN: gate/up's outputs, down's inputs alike
    if rows <= 0:
        return 0.0, 0.0
    gpu = profile.backend == "nccl"
    tile = GPU_M_TILE if gpu else 1
    padded = math.ceil(rows / tile) * tile
    flops = 2.0 * rows * k_in * n_out
    fp8 = precision == "fp8" and recipe.experts
    dtype = "fp8" if fp8 else peak_dtype(profile, precision)
    device = profile.device
    speed = device.peak_flops[dtype] * device.efficiency_for("grouped_matmul", dtype)(flops)
    compute_s = 2.0 * padded * k_in * n_out / (speed * (recipe.gemm_efficiency if fp8 else 1.0))
    moved = (rows * k_in + k_in * n_out + rows * n_out) * PRECISION_BYTES[precision]
    memory_s = moved / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    one_s = groups * max(compute_s, memory_s)
    overhead = device.op_overhead
    launches = 1 if gpu else groups
    fwd_over = overhead.forward_s * launches if overhead else 0.0
    bwd_over = overhead.backward_s * launches if overhead else 0.0
    cast_s = [0.0, 0.0]
    if fp8 and casts:  # every local expert's rows and weights, cast as the recipe casts an FP8 linear's
        shape = dict(rows=groups * rows, k=k_in, n=n_out, weights=groups * k_in * n_out, recipe=recipe)
        cast_s = [memory_time_s(profile, cast_bytes(**shape, backward=b)) for b in (False, True)]
    return (
        with_host_overhead(one_s, fwd_over, gpu=gpu) + cast_s[0],
        with_host_overhead(2.0 * one_s, bwd_over, gpu=gpu) + cast_s[1],
    )


def dispatch_bytes(
    moe: MoELayer, *, precision: str, batch_fraction: float, imbalance: float, tokens: float = 1.0
) -> float:
    """S of the module docstring: one dispatch (or combine) message of the busiest rank."""
    rows = moe.num_experts * moe.slots_per_expert * batch_fraction * tokens
    return imbalance * rows * moe.hidden_size * PRECISION_BYTES[precision]


@dataclass(frozen=True)
class A2AMessages:
    """The all-to-alls of one MoE layer (module docstring): messages of the per-expert counts (E
    int64) and of tokens (S bytes each)."""

    counts: int
    tokens: int

    def seconds(self, counts_s: float, tokens_s: float) -> float:
        return self.counts * counts_s + self.tokens * tokens_s


#: forward: the counts, dispatch and combine; backward: the gradients of dispatch and combine
FORWARD_A2A, BACKWARD_A2A = A2AMessages(counts=1, tokens=2), A2AMessages(counts=0, tokens=2)


def reruns_a2a(recompute: str) -> bool:
    """Whether a block recomputed under ``recompute`` sends its forward all-to-alls again: only under "full",
    which re-runs the whole forward; selective keeps the all-to-alls' outputs (types/saved_ops.py
    ``SAVED_COLLECTIVES``) and re-runs only computation, as DeepSeek-V3's recomputation does (arXiv 2412.19437
    section 3.2.3: RMSNorm and the MLA up-projections, no communication)."""
    return recompute == "full"


def a2a_per_microbatch(*, recomputed: bool, reruns: float = 1.0) -> A2AMessages:
    """A layer's all-to-alls per micro-batch: forward and backward, the forward ``reruns`` times again when
    recomputation re-runs it (:func:`reruns_a2a`; cost/pp/reruns.py: twice where B and W split the backward;
    what the audit counts; the step time adds ep_fwd_s as often, cost/stages.py)."""
    forwards = 1 + reruns if recomputed else 1
    return A2AMessages(
        counts=forwards * FORWARD_A2A.counts + BACKWARD_A2A.counts,
        tokens=forwards * FORWARD_A2A.tokens + BACKWARD_A2A.tokens,
    )


def a2a_times_s(
    moe: MoELayer, profile: Profile, *, precision: str, batch_fraction: float, place: ExpertPlacement
) -> tuple[float, float]:
    """(forward, backward) all-to-all seconds of one MoE layer and micro-batch (module docstring)."""
    message = dispatch_bytes(
        moe, precision=precision, batch_fraction=batch_fraction, imbalance=place.imbalance, tokens=place.tokens
    )
    etp_fwd_s, etp_bwd_s = etp_times_s(profile, message, place=place, num_experts=moe.num_experts)
    if place.ep <= 1:
        return etp_fwd_s, etp_bwd_s
    tokens_s = collective_time_s(profile, "all_to_all", message, group=place.group)
    counts_s = collective_time_s(profile, "all_to_all", moe.num_experts * COUNT_BYTES, group=place.group)
    return FORWARD_A2A.seconds(counts_s, tokens_s) + etp_fwd_s, BACKWARD_A2A.seconds(counts_s, tokens_s) + etp_bwd_s


def etp_message_bytes(message_bytes: float, *, num_experts: int, etp: int) -> tuple[float, float]:
    """(counts, rows) bytes of one etp all-to-all (module docstring): ``e`` copies of the ``E`` counts, and
    ``e S``, the etp group's gathered rows."""
    return etp * num_experts * COUNT_BYTES, etp * message_bytes


def etp_times_s(
    profile: Profile, message_bytes: float, *, place: ExpertPlacement, num_experts: int
) -> tuple[float, float]:
    """(forward, backward) seconds of one MoE layer's etp exchanges per micro-batch, the gather of the rows the
    etp group received and the reduce-scatter of their output, in the messages of the ep all-to-alls (module
    docstring); 0 at e = 1."""
    if place.etp <= 1:
        return 0.0, 0.0
    counts, rows = etp_message_bytes(message_bytes, num_experts=num_experts, etp=place.etp)
    counts_s = collective_time_s(profile, "all_to_all", counts, group=place.etp_group)
    rows_s = collective_time_s(profile, "all_to_all", rows, group=place.etp_group)
    return FORWARD_A2A.seconds(counts_s, rows_s), BACKWARD_A2A.seconds(counts_s, rows_s)


@dataclass(frozen=True)
class BlockExperts:
    """The MoE part of one block under a placement: which nodes are expert GEMMs, the block's
    all-to-all seconds per micro-batch, and the parameters split over ep."""

    gemms: dict[str, MoELayer]
    a2a_fwd_s: float
    a2a_bwd_s: float
    param_names: frozenset[str]
    ep: int  # the ranks each expert's parameters are split over: ep x expert_tp
    imbalance: float = 1.0  # the busiest rank's rows over the mean (its expert activations too)
    modules: tuple[str, ...] = ()  # the experts modules
    a2a_kept_bytes: float = 0.0  # the forward all-to-alls' outputs selective recompute keeps (a2a_output_bytes)
    dispatch_saved_bytes: float = 0.0  # the combined rows the dispatch's weighting keeps (dispatch_saved_bytes)


def block_experts(
    graph: Graph,
    nodes: tuple[OpNode, ...],
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    place: ExpertPlacement | None,
) -> BlockExperts | None:
    """The grouped MoE layers among ``nodes`` as ``place`` runs them; None without any (or
    without a placement: tensor parallelism prices experts as the ops they trace to)."""
    found, gemms, param_names, modules = _expert_layout(graph, nodes) if place is not None else ([], {}, None, ())
    if not found:
        return None
    times = [a2a_times_s(m, profile, precision=precision, batch_fraction=batch_fraction, place=place) for m in found]
    kept = sum(a2a_output_bytes(m, precision=precision, batch_fraction=batch_fraction, place=place) for m in found)
    return BlockExperts(
        gemms=gemms,
        a2a_fwd_s=sum(t[0] for t in times),
        a2a_bwd_s=sum(t[1] for t in times),
        param_names=param_names,
        ep=place.split,
        imbalance=place.imbalance,
        modules=modules,
        a2a_kept_bytes=kept,
        dispatch_saved_bytes=sum(
            dispatch_saved_bytes(m, precision=precision, batch_fraction=batch_fraction, place=place) for m in found
        ),
    )


def _expert_layout(graph: Graph, nodes: tuple[OpNode, ...]) -> tuple:
    """(:func:`layers_in`, their expert GEMMs by node name, their experts' parameter names, their experts modules) of
    ``nodes``: they read the graph and the nodes alone, not the placement nor the context, so a tuple of nodes (a
    block's, asked once per summary) has them kept on the graph, the tuple held so that its id stays its own."""
    cache = graph.__dict__.setdefault("_expert_layout_cache", {})
    hit = cache.get(id(nodes))
    if hit is not None and hit[0] is nodes:
        return hit[1]
    found = layers_in(graph, nodes)
    gemms = {n.name: moe for moe in found for n in nodes if is_expert_gemm(n, moe)}
    names = frozenset(name for moe in found for name in moe.expert_param_names)
    layout = (found, gemms, names, tuple(moe.experts_module for moe in found))
    if type(nodes) is tuple:  # a list may change: priced afresh
        cache[id(nodes)] = (nodes, layout)
    return layout


def dispatch_saved_bytes(moe: MoELayer, *, precision: str, batch_fraction: float, place: ExpertPlacement) -> float:
    """One MoE layer's combined rows per micro-batch that autoplan's dispatch keeps at ``ep e > 1``, weighting them
    outside the experts module for the weights' gradient (execute/expert_dispatch.py): the rank's own rows, ``S`` at
    ``i = 1``. Other runtimes weight the outputs the traced experts save already (``place.weights_combined``)."""
    kw = dict(precision=precision, batch_fraction=batch_fraction, imbalance=1.0, tokens=place.tokens)
    return dispatch_bytes(moe, **kw) if place.split > 1 and place.weights_combined else 0.0


def a2a_output_bytes(moe: MoELayer, *, precision: str, batch_fraction: float, place: ExpertPlacement) -> float:
    """Bytes of one MoE layer's forward all-to-all outputs per micro-batch, which selective recompute keeps
    (types/saved_ops.py) and so no longer drops: an all-to-all's output is the size of its message, the
    received rows and the combined outputs (2 S at ep > 1) and the etp group's gathered rows and scattered
    outputs (2 e S at expert_tp > 1; module docstring)."""
    message = dispatch_bytes(
        moe, precision=precision, batch_fraction=batch_fraction, imbalance=place.imbalance, tokens=place.tokens
    )
    rows = FORWARD_A2A.tokens * message if place.ep > 1 else 0.0
    gathered = etp_message_bytes(message, num_experts=moe.num_experts, etp=place.etp)[1] if place.etp > 1 else 0.0
    return rows + FORWARD_A2A.tokens * gathered


def check_divides(graph: Graph, ep: int, *, expert_tp: int = 1) -> None:
    """Every grouped MoE layer's experts split evenly over ``ep`` ranks, and each one's FFN over
    ``expert_tp``, else one sentence."""
    from autoplan.errors import PlanError

    for moe in graph.moe_layers:
        if moe.expert_ffn_size % expert_tp:
            raise PlanError(
                f"plan expert_tp={expert_tp} does not divide the expert FFN width {moe.expert_ffn_size} of MoE layer "
                f"'{moe.module}'; use an expert_tp that divides it."
            )
        if ep > 1 and not runs_grouped(moe):
            raise PlanError(
                f"plan ep={ep} but MoE layer '{moe.module}' keeps its experts as separate modules, which autoplan "
                "cannot split over ranks; use ep=1 (docs/moe.md lists the experts interface EP runs)."
            )
        if moe.num_experts % ep:
            raise PlanError(
                f"plan ep={ep} does not divide the {moe.num_experts} experts of MoE layer '{moe.module}'; "
                f"use an ep that divides {moe.num_experts}."
            )


def check_ep_pin(graph: Graph, ep: int) -> None:
    """``--fix ep=N`` on a model that cannot take it, in one sentence."""
    from autoplan.errors import PlanError

    if not graph.moe_layers:
        raise PlanError(
            f"--fix ep={ep} needs a Mixture-of-Experts model, and this one has no MoE layers; drop the pin."
        )
    check_divides(graph, ep)


def pipeline_blocks(graph: Graph) -> int:
    """Blocks a pipeline may place on stages: all of them, or none when an MoE layer selects its
    experts' rows by data-dependent shapes (``MoELayer.data_dependent``): such a layer runs only
    eagerly as written, and torch.export, which splits pipelines (autoplan/execute/pipeline.py),
    cannot capture it."""
    return 0 if any(m.data_dependent for m in graph.moe_layers) else len(graph.layers)


def check_pp_pin(graph: Graph, pp: int) -> None:
    """``--fix pp=N`` on a model whose MoE layers cannot be pipelined, in one sentence."""
    from autoplan.errors import PlanError

    layer = next((m for m in graph.moe_layers if m.data_dependent), None)
    if pp > 1 and layer is not None:
        raise PlanError(
            f"--fix pp={pp} cannot split this model: MoE layer '{layer.module}' loops over its experts with "
            "data-dependent shapes, which torch.export (the pipeline split) cannot capture; use pp=1, or write "
            "its experts in the Hugging Face experts interface (docs/moe.md)."
        )


def ep_options(graph: Graph) -> list[int]:
    """Every ep the model's MoE layers allow (before the plan's dp): divisors of every layer's
    expert count; only 1 without grouped MoE layers."""
    if not graph.moe_layers or not all(runs_grouped(m) for m in graph.moe_layers):
        return [1]
    common = math.gcd(*(m.num_experts for m in graph.moe_layers))
    return [d for d in range(1, common + 1) if common % d == 0]


@dataclass(frozen=True)
class MoELimits:
    """What a model's MoE layers allow the search: the ep degrees (:func:`ep_options`) and the blocks
    a pipeline may place on stages (:func:`pipeline_blocks`)."""

    eps: tuple[int, ...]
    pipeline_blocks: int
    expert_biases: bool = False  # a routed expert holds a bias (Megatron-Core then refuses expert_tp > 1)
    expert_ffn: int = 0  # the gcd of the layers' expert FFN widths: expert_tp must divide it (0: no MoE)


def moe_limits(graph: Graph, fixes: dict) -> MoELimits:
    """The limits of :class:`MoELimits`, after refusing in one sentence an ep or pp pin in ``fixes``
    that the model's MoE layers cannot take."""
    if fixes.get("ep", 1) > 1:
        check_ep_pin(graph, fixes["ep"])
    check_pp_pin(graph, fixes.get("pp", 1))
    biases = any(name.endswith("bias") for moe in graph.moe_layers for name in moe.expert_param_names)
    ffn = math.gcd(*(m.expert_ffn_size for m in graph.moe_layers)) if graph.moe_layers else 0
    return MoELimits(
        eps=tuple(ep_options(graph)), pipeline_blocks=pipeline_blocks(graph), expert_biases=biases, expert_ffn=ffn
    )
