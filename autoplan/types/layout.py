"""Where each rank and each pipeline chunk sits: the one statement the cost model, the search, the executor,
the reports and the exporters all read (docs/architecture.md, "The mesh" and "Pipeline stages").

**The mesh.** Ranks form a ``(pp, dp, cp, tp)`` mesh, tp innermost, row-major as torch's
``init_device_mesh`` lays out its ``mesh_dim_names`` (torchtitan's and Megatron-Core's order):

    rank(ip, id, ic, it) = ((ip * dp + id) * cp + ic) * tp + it

so a tp group is ``tp`` consecutive ranks, a cp group has stride ``tp``, a dp group stride ``cp *
tp`` and a pp group stride ``dp * cp * tp``. The ranks that hold the same weights, and so reduce
their gradients together, are a dp x cp group ("dp_cp"); with cp = 1 it is the dp group. Expert
parallelism (tp = 1) unflattens the dp axis into ``(edp, ep)``, ep innermost: an ep group is ``ep``
consecutive dp ranks, an edp group the ``dp / ep`` ranks holding the same experts (autoplan/execute/
mesh.py); beside tp > 1 or with ``expert_tp``, ``(edp, ep, etp)`` over a stage's ranks (types/expert_layout.py).

**Pipeline chunks.** ``Plan.stages`` lists ``pp * v`` chunks (``v`` = virtual stages); chunk ``c`` runs
on stage ``c % pp`` as its ``c // pp``-th chunk: interleaved 1F1B's looping placement (Narayanan et al.
SC'21 section 2.2; torch's ``ScheduleInterleaved1F1B``); the V schedules (zbv, dualpipev) place two chunks
per stage in a V (torch's ``style="v"``): chunk c on stage c for c < p, else 2p - 1 - c; the V's turn
(chunks p - 1, p) stays on the last stage, unsent (:func:`sent_from_prior`). With v = 1 chunk c is stage c.

**Pipeline sends under TP** (:func:`pipeline_scatter_dim`): each tp rank sends 1/tp of a floating
boundary tensor and the receiver all-gathers it over the tp group (Narayanan et al. SC'21 section 4.1,
"scatter/gather"); under sequence parallelism a tensor split along the sequence stays so on arrival.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

#: The plan's mesh axes, outermost first (tp innermost).
MESH_AXES = ("pp", "dp", "cp", "tp")
#: The dp axis of an expert-parallel plan, unflattened (ep innermost).
EXPERT_AXES = ("edp", "ep")
#: The experts' tensor-parallel axis, innermost in their own layout (autoplan/types/expert_layout.py).
EXPERT_TP_AXIS = "etp"


def mesh_shape(*, pp: int, dp: int, tp: int, cp: int = 1) -> tuple[int, int, int, int]:
    """The degrees in :data:`MESH_AXES` order, the shape ``init_device_mesh`` takes."""
    return pp, dp, cp, tp


def axis_groups(degrees: Sequence[tuple[str, int]], axis: str) -> list[list[int]]:
    """The ranks of every group along ``axis`` of a row-major mesh of ``degrees`` ((name, size),
    outermost first): one group per coordinate of the other axes, each in ``axis`` order."""
    names = [name for name, _ in degrees]
    sizes = [size for _, size in degrees]
    at = names.index(axis)
    others = [range(size) for i, size in enumerate(sizes) if i != at]
    groups = []
    for rest in itertools.product(*others):
        groups.append([_rank([*rest[:at], i, *rest[at:]], sizes) for i in range(sizes[at])])
    return groups


def _rank(coordinates: Sequence[int], sizes: Sequence[int]) -> int:
    """Row-major rank of ``coordinates`` (module docstring)."""
    rank = 0
    for coordinate, size in zip(coordinates, sizes):
        rank = rank * size + coordinate
    return rank


def plan_groups(*, pp: int, dp: int, tp: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """Every tp, cp, dp and pp group of the ``(pp, dp, cp, tp)`` mesh, and every dp x cp group (the
    ranks holding the same weights: "dp_cp", dp-major), as global ranks."""
    degrees = list(zip(MESH_AXES, mesh_shape(pp=pp, dp=dp, cp=cp, tp=tp)))
    groups = {axis: axis_groups(degrees, axis) for axis in ("tp", "cp", "dp", "pp")}
    flat = [("pp", pp), ("dp_cp", dp * cp), ("tp", tp)]
    groups["dp_cp"] = axis_groups(flat, "dp_cp")
    return groups


def expert_groups(
    *, pp: int, dp: int, ep: int, tp: int = 1, cp: int = 1, expert_tp: int = 1
) -> dict[str, list[list[int]]]:
    """Every ep, edp and etp group of the experts' ``(pp, edp, ep, etp)`` mesh, as global ranks: each
    stage's ``dp * cp * tp`` ranks laid out again, etp innermost (autoplan/types/expert_layout.py); at
    tp = cp = expert_tp = 1 the dp axis unflattened into ``(edp, ep)``."""
    edp = dp * cp * tp // (ep * expert_tp)
    degrees = [("pp", pp), (EXPERT_AXES[0], edp), (EXPERT_AXES[1], ep), (EXPERT_TP_AXIS, expert_tp)]
    return {axis: axis_groups(degrees, axis) for axis in ("ep", "edp", EXPERT_TP_AXIS)}


def stage_of_chunk(chunk: int, *, pp: int, v_shape: bool = False) -> int:
    """The pipeline stage that runs chunk ``chunk`` of ``Plan.stages`` (module docstring): looping, or in a V
    (``v_shape``: types/schedules.v_shaped of the plan's schedule)."""
    if v_shape:
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def local_chunk(chunk: int, *, pp: int) -> int:
    """Chunk ``chunk``'s position among its stage's chunks (0 for the first), in either placement."""
    return chunk // pp


def chunk_index(*, stage: int, local: int, pp: int, v_shape: bool = False) -> int:
    """The chunk that stage ``stage`` runs as its ``local``-th: the inverse of
    (:func:`stage_of_chunk`, :func:`local_chunk`)."""
    if v_shape and local % 2:
        return (local + 1) * pp - 1 - stage
    return local * pp + stage


def chunks_of_stage(stage: int, *, pp: int, virtual_stages: int, v_shape: bool = False) -> list[int]:
    """The chunks stage ``stage`` runs, in order: stage, stage + pp, ... (in a V: stage, 2 pp - 1 - stage)."""
    return [chunk_index(stage=stage, local=q, pp=pp, v_shape=v_shape) for q in range(virtual_stages)]


def sent_from_prior(chunk: int, *, pp: int, v_shape: bool = False) -> bool:
    """Whether chunk ``chunk`` receives its input from another stage (and sends its input gradient back): False
    for the first chunk and where the chunk before it runs on the same stage (the turn of a V)."""
    if chunk == 0:
        return False
    return stage_of_chunk(chunk - 1, pp=pp, v_shape=v_shape) != stage_of_chunk(chunk, pp=pp, v_shape=v_shape)


def last_stage(*, pp: int, virtual_stages: int, v_shape: bool = False) -> int:
    """The stage that runs the last chunk, and with it the modules after the last block and the loss: pp - 1,
    or stage 0 in a V."""
    return stage_of_chunk(pp * virtual_stages - 1, pp=pp, v_shape=v_shape)


def stage_of_block(stages: Sequence[Sequence[str]], *, pp: int, v_shape: bool = False) -> dict[str, int]:
    """Block FQN -> the pipeline stage that runs it, for ``Plan.stages``-shaped chunks."""
    return {block: stage_of_chunk(c, pp=pp, v_shape=v_shape) for c, chunk in enumerate(stages) for block in chunk}


#: The sequence dim of a ``[batch, seq, ...]`` activation (sequence parallelism's shard dim).
SEQ_DIM = 1


def pipeline_scatter_dim(shape: Sequence[int], *, floating: bool, tp: int, sequence_parallel: bool) -> int | None:
    """The dim along which one tp rank sends its 1/tp of a pipeline boundary tensor of ``shape``
    (module docstring); None: every tp rank sends it whole. Under sequence parallelism a tensor
    of at least three dims whose sequence tp divides is split along it (:data:`SEQ_DIM`, as SP
    holds the residual stream), else along its last dim when tp divides it; integer tensors go whole."""
    if tp == 1 or not floating or not shape:
        return None
    if sequence_parallel and len(shape) >= 3 and shape[SEQ_DIM] % tp == 0:
        return SEQ_DIM
    return len(shape) - 1 if shape[-1] % tp == 0 else None


def kept_sharded(dim: int | None, *, sequence_parallel: bool) -> bool:
    """Whether a boundary tensor split along ``dim`` stays split on arrival (a sequence shard
    under SP, as the receiving blocks take it) instead of being all-gathered over the tp group."""
    return sequence_parallel and dim == SEQ_DIM
