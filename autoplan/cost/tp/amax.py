"""Tensorwise FP8's scale all-reduces under tensor parallelism: one scalar all-reduce (MAX) on the tp group
per cast of a tensor that is sharded where it is cast.

torchao's dynamic tensorwise scaling (torchao/float8/float8_utils.py ``tensor_to_amax``, ``amax_to_scale``)
takes ``s = fp8_max / max|T|`` over the whole tensor. On a sharded DTensor ``torch.max(torch.abs(T))`` is a
``Partial(max)`` scalar, reduced across the tp group before the scale is used; ``amax_to_scale`` first casts
it to float64, so each reduction moves :data:`AMAX_BYTES` (the audit measured 1,392 bytes in 174 of them).
A replicated tensor's amax is local. Per split linear and micro-batch ``Float8Linear``
(torchao/float8/float8_linear.py) casts:

| tensor | cast | colwise | rowwise |
|---|---|---|---|
| weight | forward, and again from its saved copy for the input's gradient | sharded: 1 + 1 | sharded: 1 + 1 |
| input | forward, after the redistribution (execute/float8.py ``tp_input``) | whole: 0 | sharded: 1 |
| output gradient | backward, in the output's layout before its redistribution (``tp_output``) | sharded: 1 | whole: 0 |

so 3 per split linear (forward + backward: colwise 1 + 2, rowwise 2 + 1); a replicated linear has none. A rowwise
output's gradient is whole (a partial sum's gradient); the saved input is cast already. Weights are cast per
micro-batch: torchao's precomputed scales and FP8 all-gather act on ZeRO-3's dp shards, not on tp.
torchtitan's float8 TP styles (``Float8RowwiseParallel``, ``Float8ColwiseParallel``, ``PrepareFloat8ModuleInput``;
compute/fp8.py ``TP_CAST_FIRST_RUNTIMES``) cast before the redistribution: the same count without sequence
parallelism (checked on two gloo ranks); under it a rowwise linear's output gradient arrives sequence-sharded (+1
backward, :func:`amax_reductions`) and so does the block input its colwise linears share, cast once for all of
them (+1 forward, :func:`shared_input_amaxes`). Rowwise scaling under tp and Transformer Engine: not priced.
"""

from __future__ import annotations

from autoplan.cost.compute.fp8 import Fp8Recipe

#: bytes of one amax all-reduce: a float64 scalar (module docstring)
AMAX_BYTES = 8
#: (forward, backward) scale all-reduces per split fp8 linear per micro-batch (module docstring's table)
AMAX_REDUCTIONS = {"colwise": (1, 2), "rowwise": (2, 1)}


def amax_reductions(split: str, *, fp8: bool, recipe: Fp8Recipe, tp: int, sequence_output: bool) -> tuple[int, int]:
    """(forward, backward) scalar all-reduces of one linear under ``split`` per micro-batch: the table's, for an
    FP8 linear (``fp8``) under tensorwise scaling at ``tp`` > 1, plus one backward for a rowwise output reduce-scattered
    to the sequence shard (``sequence_output``) where the recipe casts first; none otherwise."""
    if not fp8 or recipe.name != "tensorwise" or tp <= 1:
        return (0, 0)
    forward, backward = AMAX_REDUCTIONS.get(split, (0, 0))
    return forward, backward + int(recipe.tp_cast_first and split == "rowwise" and sequence_output)


def shared_input_amaxes(*, sequence_sharded: bool, recipe: Fp8Recipe, tp: int) -> int:
    """Forward all-reduces of a block input that colwise FP8 linears read: one where the recipe casts before the
    all-gather of a sequence-sharded input (``PrepareFloat8ModuleInput``), none where it casts after."""
    return int(sequence_sharded and recipe.name == "tensorwise" and recipe.tp_cast_first and tp > 1)
