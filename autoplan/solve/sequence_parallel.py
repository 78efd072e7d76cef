"""Where the search may turn sequence parallelism on: ``tp > 1`` dividing every sequence it shards.

Sequence parallelism (Korthikanti et al. 2022) runs the residual stream, its norms and dropout on
``1/tp`` of the sequence (dim 1 of ``[batch, seq, hidden]``; autoplan/execute/tensor_parallel.py).
The cost model prices each all-gather and reduce-scatter at ``seq / tp`` positions per rank; a
sequence tp does not divide runs (DTensor's uneven shards keep the global shape) but pads every
collective past that price, so it is not offered, and a pin of it is one sentence.
"""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.graph import Graph

#: ops whose ``[batch, seq, features]`` outputs show a sequence: where tokens enter (an embedding) and
#: the residual stream's norms. Not every linear: seq-first code (nn.MultiheadAttention) puts the batch there.
SEQUENCE_OPS = ("embedding", "norm")


def sequence_lengths(graph: Graph) -> tuple[int, ...]:
    """Every sequence length sequence parallelism would shard, in increasing order: the first integer
    input's (``graph.seq_len``) and the middle dim of every 3-D output of :data:`SEQUENCE_OPS`. An
    encoder-decoder has two (T5: its encoder's and its decoder's, which the first input does not
    show); () for a model without a sequence (no integer input), where SP is never offered."""
    if not graph.seq_len:
        return ()
    found = {n.output_shape[1] for n in graph.nodes if n.op in SEQUENCE_OPS and len(n.output_shape) == 3}
    return tuple(sorted(found | {graph.seq_len}))


def sp_options(*, tp: int, seq_lens: tuple[int, ...], fixes: dict, pp: int = 1, moe: bool = False) -> list[bool]:
    """Sequence parallelism where tp divides every sequence it shards (``seq_lens``,
    :func:`sequence_lengths`): an uneven shard pads each all-gather and reduce-scatter past what the
    cost model prices. Not for a model with MoE blocks (``moe``) under a pipeline: a block runs on the
    rank's sequence shard (autoplan/execute/expert_sequence.py), which a pipeline stage's exported
    graph, shaped for the whole sequence, cannot."""
    in_pipeline = moe and pp > 1
    if in_pipeline and fixes.get("sp") is True and fixes.get("pp", 1) > 1:
        raise PlanError(
            "--fix sp=on with pp > 1 cannot run this model's MoE blocks on a sequence shard inside a pipeline "
            "stage; pin sp=off or pp=1."
        )
    uneven = [n for n in seq_lens if n % tp]
    if uneven and tp > 1 and fixes.get("sp") is True and fixes.get("tp") == tp:
        raise PlanError(
            f"--fix sp=on shards every sequence over tp={tp}, but this model has a sequence of length {uneven[0]} "
            f"(of {', '.join(map(str, seq_lens))}), which {tp} does not divide; pin sp=off or a tp that divides "
            "every sequence length."
        )
    legal = [False] + ([True] if tp > 1 and seq_lens and not uneven and not in_pipeline else [])
    return [s for s in legal if s == fixes["sp"]] if "sp" in fixes else legal
