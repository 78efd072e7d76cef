"""Memory per device: model states as the executor holds them, activations in flight, buffers (the
table of bytes per parameter by executor and the discussion: docs/cost-model.md, "Memory").

Model states total 16 bytes per parameter in mixed precision, 16/N under ZeRO-3 (Rajbhandari et
al., "ZeRO", SC'20 section 3). With W, G, O the model states, S the saved activations of one
micro-batch (autoplan/cost/blocks.py), n the micro-batches in flight and n' those in flight after
the stage's first backward (autoplan/cost/pp/schedule.py), T the backward's transient (the loss's
gradients, or a block recomputed under full recomputation, autoplan/cost/stages.py), the peak is
the largest of three moments (:func:`stage_memory`):

    M1 = n S + T + buffers (+ G under DDP)                the forward's end, the backward's start
    M2 = n' S + G + max(T, scatter - S_block) + buffers   every later backward, gradients made
    M3 = G + sync                                         after the backward, activations gone
    peak = W + O + max(M1, M2, M3)

ZeRO-3's ``scatter`` is ``b + r + r/N`` bytes per block parameter (FSDP2's ``foreach_reduce``).
A plan fits when the most loaded stage's peak is at most ``(1 - ALLOCATOR_HEADROOM)`` of the
device memory.
"""

from __future__ import annotations

from dataclasses import dataclass

ALLOCATOR_HEADROOM = 0.10
DDP_BUCKET_BYTES = 25 * 2**20
#: (weights, grads, optimizer) bytes per parameter in the textbook split, Rajbhandari et al. SC'20
#: section 3; the planner's lower bounds (cost/bounds.py) use it: it never exceeds model_states.
#: fp8 holds every state as bf16 does (torchao's FP8 linears cast on the fly, autoplan/cost/compute/roofline.py)
STATE_BYTES = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp8": (2, 2, 12)}
#: the low-precision copy autocast keeps of each fp32 weight (module docstring); fp8 as bf16
LOW_BYTES = {"fp32": 0, "bf16": 2, "fp16": 2, "fp8": 2}


@dataclass(frozen=True)
class ModelStates:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        """W + G + O."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def model_states(
    *,
    params: float,
    precision: str,
    zero_stage: int,
    dp: int,
    pp: int = 1,
    trainable: float | None = None,
    offload: str = "none",
) -> ModelStates:
    """Model-state bytes for ``params`` parameters on one device, ``trainable`` of them trained
    (all when None), as the executor holds them (module docstring): a frozen parameter holds its
    weights only, no gradient and no optimizer state (docs/cost-model.md, "Frozen parameters");
    what ``offload`` holds on the host instead is left out (cost/memory/offload.py)."""
    states = _all_states(params=params, precision=precision, zero_stage=zero_stage, dp=dp, pp=pp, trainable=trainable)
    if offload == "optimizer":  # ZeRO-Offload: the fp32 master and Adam moments live on the host
        return ModelStates(weights_bytes=states.weights_bytes, grads_bytes=states.grads_bytes, optimizer_bytes=0.0)
    if offload == "full":  # FSDP2's CPUOffloadPolicy: every fp32 shard on the host, gathered blocks are buffers
        return ModelStates(weights_bytes=0.0, grads_bytes=0.0, optimizer_bytes=0.0)
    return states


def _all_states(
    *, params: float, precision: str, zero_stage: int, dp: int, pp: int, trainable: float | None
) -> ModelStates:
    low = LOW_BYTES[precision]
    trained = params if trainable is None else trainable
    if dp > 1 and zero_stage >= 2:  # FSDP2: fp32 shards; ZeRO-2 keeps the compute-dtype weights gathered
        gathered = params * (low or 4) if zero_stage == 2 else 0.0
        grads = 4 * trained if pp > 1 else 4 * trained / dp  # a pipeline stage accumulates them unsharded
        return ModelStates(
            weights_bytes=4 * params / dp + gathered, grads_bytes=grads, optimizer_bytes=8 * trained / dp
        )
    optimizer = 12 * trained / dp if zero_stage == 1 and dp > 1 else 8 * trained
    return ModelStates(weights_bytes=(4 + low) * params, grads_bytes=4 * trained, optimizer_bytes=optimizer)


def comm_buffer_bytes(
    *, zero_stage: int, dp: int, pp: int, boundary_bytes: float, block_params: float, precision: str
) -> float:
    """Bytes of communication buffers on one device through the forward and backward (module
    docstring): ZeRO-3's two gathered blocks and the pipeline's send and receive buffers. The
    backward's reduce-scatter is :func:`scatter_buffer_bytes`, the flattening after it
    :func:`sync_buffer_bytes`."""
    weight_bytes = LOW_BYTES[precision] or 4
    total = 0.0
    if zero_stage >= 3 and dp > 1:
        total += block_params * 2 * weight_bytes
    if pp > 1:
        total += 2 * boundary_bytes
    return total


def scatter_buffer_bytes(
    *, zero_stage: int, dp: int, pp: int, block_params: float, precision: str, reduce_bytes: int
) -> float:
    """ZeRO-3's reduce-scatter of one block in the backward (module docstring): its unsharded
    gradients in the compute dtype, FSDP2's flat input in the reduce dtype and the output slice.
    Under a pipeline the unsharded gradients are the accumulated ones, already in G."""
    if zero_stage < 3 or dp == 1:
        return 0.0
    unsharded = 0 if pp > 1 else (LOW_BYTES[precision] or 4)
    return block_params * (unsharded + reduce_bytes + reduce_bytes / dp)


@dataclass(frozen=True)
class StageMemory:
    """One stage's memory on one device: the parts, each at its largest, and the peak, the
    largest of three moments (module docstring)."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float  # n S + T
    buffers_bytes: float  # forward buffers + the largest backward or sync buffer
    peak_bytes: float
    #: the peak moment split into (weights, grads, optimizer, activations, buffers): they sum to peak_bytes
    at_peak_bytes: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)


def stage_memory(
    *,
    states: ModelStates,
    saved_bytes: float,
    transient_bytes: float,
    in_flight: float,
    in_flight_after: float,
    last_block_bytes: float,
    buffers_bytes: float,
    scatter_bytes: float,
    sync_bytes: float,
    grads_persist: bool,
) -> StageMemory:
    """The three moments of the module docstring:

    M1 = n S + T + buffers + (G if gradients persist)        the forward's end, backward's start
    M2 = n' S + G + max(T, scatter - S_block) + buffers      the backward after the first one
    M3 = G + sync                                            after the backward
    peak = W + O + max(M1, M2, M3)
    """
    grads = states.grads_bytes
    held = in_flight * saved_bytes + transient_bytes
    kept = in_flight_after * saved_bytes
    m1 = held + buffers_bytes + (grads if grads_persist else 0.0)
    m2 = kept + grads + max(transient_bytes, scatter_bytes - last_block_bytes) + buffers_bytes
    m3 = grads + sync_bytes
    most = max(m1, m2, m3)  # one of the three objects: the first of them at the largest
    if most is m1:  # (grads, activations, buffers) of the moment at the peak
        peak = (grads if grads_persist else 0.0, held, buffers_bytes)
    elif most is m2 and transient_bytes >= scatter_bytes - last_block_bytes:
        peak = (grads, kept + transient_bytes, buffers_bytes)
    elif most is m2:  # the block's activations freed
        peak = (grads, kept - last_block_bytes, buffers_bytes + scatter_bytes)
    else:
        peak = (grads, 0.0, sync_bytes)
    return StageMemory(
        weights_bytes=states.weights_bytes,
        grads_bytes=grads,
        optimizer_bytes=states.optimizer_bytes,
        activations_bytes=held,
        buffers_bytes=buffers_bytes + max(scatter_bytes, sync_bytes),
        peak_bytes=states.weights_bytes + states.optimizer_bytes + most,
        at_peak_bytes=(states.weights_bytes, peak[0], states.optimizer_bytes, peak[1], peak[2]),
    )


def sync_buffer_bytes(
    *,
    params: float,
    zero_stage: int,
    dp: int,
    tp: int,
    pp: int,
    reduce_bytes: int,
    unit_params: float = 0.0,
    flat: bool = False,
    staged: bool = False,
) -> float:
    """The reduction's buffers beyond the fp32 gradients G of the explicit all-reduce (ZeRO-0 under tp
    or pp) and of ZeRO-1, alive after the backward; DDP reduces in place and FSDP2 per block.
    ``unit_params``: the largest unit's parameters where ZeRO-1 keeps one flat buffer per unit
    (overlap_param_gather). ``flat``: the gradients are views of one flat fp32 buffer
    (types/plan.py ``flat_grads``), reduced in place: a copy only to cast to a 16-bit reduce dtype.
    ``staged``: the backend copies a reduce-scatter's input into a flat buffer of its own (gloo's
    ``_reduce_scatter_base``, measured by the execution audit; NCCL reads the input in place)."""
    if dp == 1 or zero_stage >= 2 or (zero_stage == 0 and tp == 1 and pp == 1):
        return 0.0
    if zero_stage == 1 and unit_params:
        return _zero1_unit_sync_bytes(params=unit_params, dp=dp, reduce_bytes=reduce_bytes, flat=flat, staged=staged)
    if zero_stage == 1:
        return _zero1_sync_bytes(params=params, dp=dp, reduce_bytes=reduce_bytes, flat=flat, staged=staged)
    cast = params * reduce_bytes if reduce_bytes != 4 else 0.0
    # the all-reduce's flat copy: the buffer's cast (flat), else the concatenated fp32 gradients and
    # their cast to the reduce dtype, both alive while the cast runs (execute/data_parallel.py)
    return cast if flat else params * 4 + cast


def _flat_copy_bytes(*, params: float, reduce_bytes: int, flat: bool, staged: bool = False) -> float:
    """The flat gradient the reduce-scatter reads, beyond G: none when it is the flat buffer itself
    (fp32), else its cast or the flat copy of the gradients in the reduce dtype (``r P``); with the
    flat buffer, a ``staged`` backend's own copy of it (``r P``; without it that copy is counted
    where G is released, :func:`_zero1_sync_bytes`)."""
    copy = 0.0 if flat and reduce_bytes == 4 else params * reduce_bytes
    return copy + (params * reduce_bytes if flat and staged else 0.0)


def _zero1_sync_bytes(*, params: float, dp: int, reduce_bytes: int, flat: bool = False, staged: bool = False) -> float:
    """ZeRO-1's step beyond the fp32 gradients G = 4 P (execute/zero.py), the largest of three
    moments, as the execution audit measures them: the flat gradient in the reduce dtype (none when
    the flat buffer is reduced in place, :func:`_flat_copy_bytes`) and its reduce-scattered slice,
    beside the gradients (``r P + r P / N``); once the copy is released, the slice's fp32 copy when r
    is 16-bit (``r P / N + 4 P / N``; without the flat buffer G is released too: ``r P + (r + 4) P / N``,
    less G); the all-gather of the updated parameters into a whole fp32 vector beside the slice's fp32
    gradient (``4 P / N``: into the flat buffer, or into a new one once G is released: ``4 P + 4 P / N``
    less G)."""
    widened = 4 if reduce_bytes != 4 else 0
    copied = _flat_copy_bytes(params=params, reduce_bytes=reduce_bytes, flat=flat, staged=staged)
    scattered = copied + params / dp * reduce_bytes
    released = params / dp * (reduce_bytes + widened)
    widening = released if flat else params * reduce_bytes + released - 4 * params
    gathered = params / dp * 4
    return max(scattered, widening, gathered)


def _zero1_unit_sync_bytes(
    *, params: float, dp: int, reduce_bytes: int, flat: bool = False, staged: bool = False
) -> float:
    """ZeRO-1 with one flat buffer per unit (execute/param_gather.py), U the largest unit's
    parameters: its flat gradient in the reduce dtype (:func:`_flat_copy_bytes`) and slice
    (``r U + r U / N``), one unit at a time; or the two fp32 units of gathered weights alive under
    the next forward (the one being copied in and the one prefetched: ``2 * 4 U``)."""
    copied = _flat_copy_bytes(params=params, reduce_bytes=reduce_bytes, flat=flat, staged=staged)
    return max(copied + params / dp * reduce_bytes, 2 * 4 * params)


def usable_bytes(memory_bytes: float) -> float:
    """Device memory a plan may use: all of it less the allocator headroom."""
    return memory_bytes * (1.0 - ALLOCATOR_HEADROOM)
