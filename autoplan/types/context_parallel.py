"""Which models context parallelism can split, and over how many ranks: the one rule the search and
the executor both read (docs/executor.md, "Context parallelism").

Context parallelism shards every sequence over ``cp`` ranks, each holding chunks r and 2cp-1-r of
2cp equal chunks (head-tail load balancing), so a sequence of S tokens needs 2cp | S. Only attention
mixes tokens across the sequence, and the executor splits it for scaled-dot-product attention over
the whole sequence (q_len = kv_len = S) that is causal or unmasked: an explicit mask has a query and
a key dimension the shards cannot both keep. The executor shards the sequence at the blocks' inputs
and routes attention from inside the blocks, so attention outside every block is refused too.
"""

from __future__ import annotations

from autoplan.types.graph import Graph


def cp_refusal(graph: Graph) -> str | None:
    """None when ``graph`` can run under context parallelism, else one sentence saying why not."""
    if not graph.seq_len:
        return (
            "context parallelism splits the token sequence a model takes as [batch, sequence] integer ids, and this "
            "model takes none (images, features); plan cp=1."
        )
    attention = [n for n in graph.nodes if n.op == "attention"]
    if not attention:
        return (
            "context parallelism splits attention written as F.scaled_dot_product_attention, and this model calls "
            "none (eager attention as matmul and softmax, or ALiBi through baddbmm, is not split); run the model's "
            "SDPA attention (Hugging Face: attn_implementation='sdpa') or plan cp=1."
        )
    for node in attention:
        a = node.attrs
        if a.get("has_mask"):
            return (
                f"attention '{node.name}' takes an explicit mask, which context parallelism cannot split; "
                "use is_causal=True (or no mask) to plan cp > 1."
            )
        if node.layer is None:
            return (
                f"attention '{node.name}' runs outside the model's blocks, and context parallelism shards the "
                "sequence at the blocks' inputs; plan cp=1."
            )
        if a.get("q_len") != graph.seq_len or a.get("kv_len") != graph.seq_len:
            return (
                f"attention '{node.name}' attends {a.get('q_len')} queries to {a.get('kv_len')} keys, not the "
                f"whole sequence of {graph.seq_len}; context parallelism splits self-attention over the sequence."
            )
    if (node := _positions_in_block(graph)) is not None:
        return (
            f"block '{node.layer}' builds positions of the whole sequence inside the block ('{node.name}', a "
            f"torch.arange of {graph.seq_len}), and under context parallelism a block sees only its shard of the "
            "sequence; build positions (or rotary tables) before the first block and pass them in, or plan cp=1."
        )
    return None


def _positions_in_block(graph: Graph):
    """A node inside a block that makes a range as long as the sequence (RoPE's ``torch.arange(x.shape[-2])``),
    which context parallelism's shards would make from their own length (execute/context_parallel.py shards at
    the blocks' inputs); None when positions come from before the blocks."""
    for node in graph.nodes:
        shape = node.output_shape or []
        if node.layer is not None and "arange" in (node.target or "") and shape[:1] == [graph.seq_len]:
            return node
    return None


def cp_divides(seq_len: int, cp: int) -> bool:
    """Whether a sequence of ``seq_len`` tokens splits into the 2cp equal chunks of head-tail balancing."""
    return cp == 1 or seq_len % (2 * cp) == 0


#: the cp variants the executor runs on each backend (autoplan/execute/context_parallel.py): the search
#: offers only these; the cost model prices every variant (a config from another trainer may use any)
RUNNABLE_CP_VARIANTS = {"gloo": ("allgather", "ulysses"), "nccl": ("allgather", "ring")}


def runnable_cp_variants(backend: str) -> tuple[str, ...]:
    """The cp variants autoplan's executor runs on ``backend`` (gloo or nccl)."""
    return RUNNABLE_CP_VARIANTS.get(backend, ())
