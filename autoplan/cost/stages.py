"""Per-stage totals of a plan: block summaries summed over the blocks each pipeline stage runs.

Chunk ``c`` of ``plan.stages`` (``pp * virtual_stages`` chunks) runs on stage ``c % pp``
(autoplan/types/layout.py). Nodes outside every block go to the first stage when
they run before the first block (embeddings) and to the last stage otherwise (final norm,
head, loss), as docs/architecture.md fixes. Recomputation (autoplan/cost/blocks.py) applies to
blocks only, to the first k of each chunk under a budget (autoplan/types/recompute.py, the others
add as under "none"); a block recomputed in full re-runs its all-to-alls (torch.utils.checkpoint re-runs the
forward's collectives), a selective one does not (its policy keeps their outputs: cost/moe/experts.py
``reruns_a2a``); either re-runs the block's context-parallel K,V exchange. A recomputed block re-runs its
forward ``reruns`` times per micro-batch, twice where B and W split its backward (cost/pp/reruns.py), each
re-run charged in full: its time, and its TP, EP and CP collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.cost.blocks import LayerSummary
from autoplan.cost.moe.experts import reruns_a2a


@dataclass
class StageTotals:
    """One pipeline stage, per micro-batch (times) or per device (parameters)."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    wgrad_s: float = 0.0  # of bwd_s, the weight gradients (W: cost/pp/split_backward.py)
    wgrad_held_bytes: float = 0.0  # their output gradients, kept from B to W by a zero-bubble schedule
    recompute_s: float = 0.0
    offload_s: float = 0.0  # activation offload's host copies, out and back (cost/memory/activation_offload.py)
    tp_s: float = 0.0
    ep_s: float = 0.0  # expert-parallel all-to-all (autoplan/cost/moe/experts.py)
    cp_s: float = 0.0  # context parallelism's K,V traffic left exposed (autoplan/cost/cp/)
    saved_bytes: float = 0.0  # activations kept per micro-batch after the recompute choice
    offloaded_bytes: float = 0.0  # of the blocks' saved activations, those sent to the host, per micro-batch
    peak_block_bytes: float = 0.0  # a recomputed block's re-made activations: all (full), the dropped (selective)
    loss_grad_bytes: float = 0.0  # the loss backward's gradients (cost/blocks.py), on the stage holding the loss
    loss_saved_bytes: float = 0.0  # of saved_bytes, the loss's own (cost/blocks.py), on the stage holding the loss
    params: float = 0.0
    expert_params: float = 0.0  # the routed experts' share of params (held 1/ep, reduced over dp/ep)
    frozen_params: float = 0.0  # of params, the frozen ones: held, never given gradients or optimizer state
    frozen_expert_params: float = 0.0  # of expert_params, the frozen ones
    flops: float = 0.0
    blocks: list[LayerSummary] = field(default_factory=list)  # in forward order, outside nodes included
    recomputed: list[bool] = field(default_factory=list)  # per entry of blocks: under the plan's recompute
    reruns: list[float] = field(default_factory=list)  # per entry of blocks: forward re-runs (cost/pp/reruns.py)
    boundary_bytes: float = 0.0  # D_in: the activation its chunks receive (index > 0), the largest, per micro-batch
    boundary_grad_bytes: float = 0.0  # D_g,in: of it, the tensors whose gradient it sends back (input_grad_bytes)
    output_bytes: float = 0.0  # D_out: the activation its chunks send on (not the loss's), the next chunk's input
    output_grad_bytes: float = 0.0  # D_g,out: the gradients of it that come back, into its gradient receive slots
    param_names: set[str] = field(default_factory=set)  # the outside nodes' weights: a tied one is held once
    #: per chunk the stage runs, its share of saved_bytes and wgrad_held_bytes (a replayed schedule weighs each
    #: chunk's own: cost/pp/rank_memory.py); the outside nodes count with the chunk they run beside
    chunk_saved_bytes: dict[int, float] = field(default_factory=dict)
    chunk_held_bytes: dict[int, float] = field(default_factory=dict)
    #: per chunk, one forward re-run of its recomputed blocks with the collectives it runs again (recompute_s and
    #: the collectives hold ``reruns`` of them: a V schedule's replay prices each backward's own, cost/pp/replay.py)
    chunk_rerun_s: dict[int, float] = field(default_factory=dict)

    @property
    def micro_batch_s(self) -> float:
        """Forward + backward + recompute + offload copies + TP, EP and CP collectives of one micro-batch."""
        return self.fwd_s + self.bwd_s + self.recompute_s + self.offload_s + self.tp_s + self.ep_s + self.cp_s

    @property
    def forward_s(self) -> float:
        """The forward's part of :attr:`micro_batch_s`: its compute, and the TP, EP and CP collectives in the
        forward's share of the compute (recomputation runs in the backward)."""
        compute = self.fwd_s + self.bwd_s
        return self.fwd_s * (1.0 + (self.tp_s + self.ep_s + self.cp_s) / compute) if compute else 0.0

    @property
    def dense_params(self) -> float:
        """Parameters reduced and ZeRO-sharded over all dp ranks (all but the routed experts')."""
        return self.params - self.expert_params

    @property
    def trainable_params(self) -> float:
        """Parameters that get gradients, optimizer state and sync (docs/cost-model.md, "Frozen parameters")."""
        return self.params - self.frozen_params

    @property
    def trainable_dense_params(self) -> float:
        return self.dense_params - (self.frozen_params - self.frozen_expert_params)

    @property
    def trainable_expert_params(self) -> float:
        return self.expert_params - self.frozen_expert_params

    @property
    def transient_bytes(self) -> float:
        """Activations alive beyond the saved ones at the backward's peak: a block recomputed
        (full recomputation) and the loss's gradients happen at different moments, so the larger."""
        return max(self.peak_block_bytes, self.loss_grad_bytes)

    @property
    def held_boundary_bytes(self) -> tuple[float, float]:
        """(D, D_g) a replayed state's counts of boundary tensors and of gradients weigh (cost/pp/rank_memory.py):
        its tensors count forward slots (inputs, D_in) with outputs sent (D_out), its gradients gradient slots
        (output gradients, D_g,out) with input gradients sent (D_g,in), so each count at the larger of its two: the
        bytes where the stage's boundaries are equal, and stage 0 of a one-chunk pipeline at its output's alone."""
        return max(self.boundary_bytes, self.output_bytes), max(self.boundary_grad_bytes, self.output_grad_bytes)

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s + self.offload_s


def _outside_params(stage: StageTotals, block: LayerSummary) -> tuple[float, float]:
    """Parameters of the outside nodes not already on the stage, and how many of them are frozen:
    with one stage, an output head tied to the input embedding is the same weight (block summaries
    are shared by a group, so only the outside summaries carry their own names)."""
    named = dict(zip(block.param_names, block.param_numels))
    loose = block.param_count - sum(named.values())  # parameters the trace could not name
    new = sum(n for name, n in named.items() if name not in stage.param_names)
    frozen = sum(n for name, n in named.items() if name not in stage.param_names and name in block.frozen_names)
    stage.param_names.update(named)
    return loose + new, frozen


def add_block(
    stage: StageTotals,
    block: LayerSummary,
    *,
    recompute: str,
    is_block: bool = True,
    chunk: int | None = None,
    reruns: float = 1.0,
) -> None:
    """Add one block (or the outside nodes, ``is_block=False``) of pipeline chunk ``chunk`` to ``stage`` (None: the
    last chunk the stage has run so far, or chunk 0: the nodes before the first block, or after the last), its
    forward re-run ``reruns`` times per micro-batch when recomputed (cost/pp/reruns.py forward_reruns)."""
    saved = stage.saved_bytes
    _add(stage, block, recompute=recompute, is_block=is_block, reruns=reruns)
    chunk = max(stage.chunk_saved_bytes, default=0) if chunk is None else chunk
    stage.chunk_saved_bytes[chunk] = stage.chunk_saved_bytes.get(chunk, 0.0) + stage.saved_bytes - saved
    stage.chunk_held_bytes[chunk] = stage.chunk_held_bytes.get(chunk, 0.0) + block.wgrad_held_bytes
    if is_block and recompute != "none":
        stage.chunk_rerun_s[chunk] = stage.chunk_rerun_s.get(chunk, 0.0) + one_rerun_s(block, recompute)


def add_boundary(receiver: StageTotals, sender: StageTotals, block: LayerSummary, *, whole: int) -> None:
    """The boundary before ``block``, the first of a chunk but the first: ``receiver`` (the chunk's stage) holds it
    as its input and sends its gradient back; ``sender`` (the previous chunk's) sends it on and holds its gradient's
    receive slots (torch 2.13 stage.py ``_create_grad_recv_info``: a stage's gradient buffers are its output's).
    ``whole``: received whole on every tp rank, tp under sequence parallelism (execute/pipeline.py)."""
    size, grads = block.input_bytes * whole, block.input_grad_bytes * whole
    receiver.boundary_bytes = max(receiver.boundary_bytes, size)
    receiver.boundary_grad_bytes = max(receiver.boundary_grad_bytes, grads)
    sender.output_bytes = max(sender.output_bytes, size)
    sender.output_grad_bytes = max(sender.output_grad_bytes, grads)


def one_rerun_s(block: LayerSummary, recompute: str) -> float:
    """One forward re-run of a ``block`` recomputed under ``recompute`` (what :func:`_add` charges per re-run): its
    time (the block's forward in full, the re-run nodes' under selective), its TP and CP collectives, and its
    all-to-alls in full (``reruns_a2a``); cost/pp/partition.py ``rerun_s`` sums the same."""
    again = block.selective_recompute_s if recompute == "selective" else block.fwd_s
    return again + block.tp_fwd_s + block.cp_fwd_s + (block.ep_fwd_s if reruns_a2a(recompute) else 0.0)


def _add(stage: StageTotals, block: LayerSummary, *, recompute: str, is_block: bool, reruns: float) -> None:
    stage.fwd_s += block.fwd_s
    stage.bwd_s += block.bwd_s
    stage.wgrad_s += block.wgrad_s
    stage.wgrad_held_bytes += block.wgrad_held_bytes
    stage.tp_s += block.tp_fwd_s + block.tp_bwd_s
    stage.ep_s += block.ep_fwd_s + block.ep_bwd_s
    stage.cp_s += block.cp_fwd_s + block.cp_bwd_s
    params, frozen = (block.param_count, block.frozen_param_count) if is_block else _outside_params(stage, block)
    stage.params += params
    stage.frozen_params += frozen
    stage.expert_params += block.expert_param_count
    stage.frozen_expert_params += block.frozen_expert_param_count
    stage.flops += block.flops
    stage.blocks.append(block)
    stage.loss_grad_bytes = max(stage.loss_grad_bytes, block.loss_grad_bytes)
    stage.loss_saved_bytes = max(stage.loss_saved_bytes, block.loss_saved_bytes)
    stage.recomputed.append(recompute != "none")  # outside nodes: only dp/sync.py's backward slots read it
    stage.reruns.append(reruns if is_block and recompute != "none" else 0.0)
    if not is_block or recompute == "none":
        stage.saved_bytes += block.saved_bytes
        return
    if reruns_a2a(recompute):  # a forward recomputed in full dispatches and combines again
        stage.ep_s += reruns * block.ep_fwd_s
    stage.cp_s += reruns * block.cp_fwd_s  # and exchanges keys and values again
    stage.tp_s += reruns * block.tp_fwd_s  # and runs its TP collectives again
    if recompute == "selective":  # everything but matmul-class ops re-runs
        stage.recompute_s += reruns * block.selective_recompute_s
        stage.saved_bytes += block.saved_bytes - block.selective_dropped_bytes
        # torch's checkpoint re-runs the block whole at its backward's first unpack (utils/checkpoint.py 2.13,
        # _checkpoint_hook.unpack_hook; early stop off) and keeps what it saves until unpacked: the dropped bytes
        stage.peak_block_bytes = max(stage.peak_block_bytes, block.selective_dropped_bytes)
        return
    stage.recompute_s += reruns * block.fwd_s
    stage.saved_bytes += block.input_bytes
    stage.peak_block_bytes = max(stage.peak_block_bytes, block.saved_bytes)
