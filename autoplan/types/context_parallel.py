"""Which models context parallelism can split, and over how many ranks: the one rule the search and
the executor both read (docs/executor.md, "Context parallelism").

Context parallelism shards every sequence over ``cp`` ranks, each holding chunks r and 2cp-1-r of
2cp equal chunks (head-tail load balancing), so a sequence of S tokens needs 2cp | S. Only attention
may mix tokens across the sequence (any other op that does, a scan, shift or convolution over it, is refused:
trace/sequence_mixing.py), and the executor splits it for scaled-dot-product attention over
the whole sequence (q_len = kv_len = S) that is causal, unmasked, or masked by a mask made before the
blocks (Hugging Face's traced causal or sliding-window mask, a padding mask): a rank's queries take
their rows of the whole mask against the whole sequence's keys (autoplan's all-gather), or the whole
mask on 1/cp of the heads (Ulysses); torch's ring attention takes no mask. A mask made inside a block
is made from the block's shard, so it is refused. The executor shards the sequence at the blocks'
inputs and routes attention from inside the blocks, so attention outside every block is refused too.
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
        if a.get("has_mask") and not _mask_made_before(graph, node):
            return (
                f"attention '{node.name}' in block '{node.layer}' takes an explicit mask that context parallelism "
                f"cannot split: it applies a mask of shape [batch or 1, heads or 1, {graph.seq_len}, "
                f"{graph.seq_len}] made before the first block (as Hugging Face models make theirs), and this one "
                "is made inside the block (which sees only its shard of the sequence) or has another shape; build "
                "such a mask before the first block and pass it in, use is_causal=True, or plan cp=1."
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
    if (shape := _output_without_sequence(graph)) is not None:
        return (
            f"context parallelism shards the sequence from the first block to the loss, and this model's output "
            f"(shape {shape}) has no sequence dim: something after the last block pools or picks tokens (a "
            "classifier's [CLS] or last token, a mean over the sequence), which on a shard picks another token or "
            "pools a part; plan cp=1."
        )
    if (node := _mixing_node(graph)) is not None and node.op == "loss":
        return (
            f"the loss function shifts, slices or picks along the sequence of {graph.seq_len} tokens (a causal LM's "
            "logits[:, :-1] against target[:, 1:]), and under context parallelism it meets each rank's shard of the "
            "output and the target, whose chunks are not contiguous: it would pair tokens across the shards; give "
            "example_target() the shifted targets (the token after each position) and score all positions, or plan "
            "cp=1."
        )
    if node is not None:
        return (
            f"'{node.name}' ({node.target}) {_where(node)} combines values along the sequence of {graph.seq_len} "
            "tokens (a scan, shift, convolution, pooling or slice over it), and under context parallelism each rank "
            "holds only its shard of the sequence from the first block on: only attention exchanges between the "
            "shards, so the op would compute on each shard alone; plan cp=1."
        )
    if (node := _positions_in_block(graph)) is not None:
        return (
            f"'{node.name}' (a torch.arange of {graph.seq_len}) {_where(node)} builds positions of the whole sequence "
            "from the first block on, and under context parallelism each block sees only its shard of the sequence; "
            "build positions (or rotary tables) before the first block and pass them in, or plan cp=1."
        )
    return None


def _mask_made_before(graph: Graph, node) -> bool:
    """Whether the mask of attention ``node`` comes from outside its block: an input of ``node`` outside the
    block shaped as SDPA takes a mask over the scores, ``[B or 1, H or 1, q_len or 1, kv_len]`` (the query, key
    and value come from inside the block). A mask built, sliced or viewed inside the block is not, nor a 2-D
    one, which a block's pre-hook cannot tell from a table of positions (execute/context_parallel.py)."""
    preds, _ = graph.adjacency()
    q_len, kv_len = node.attrs.get("q_len"), node.attrs.get("kv_len")
    for name in preds[node.name]:
        pred = graph.node(name)
        shape = pred.output_shape or []
        if pred.layer != node.layer and is_score_mask(shape, q_len=q_len, kv_len=kv_len):
            return True
    return False


def is_score_mask(shape, *, q_len: int | None, kv_len: int | None) -> bool:
    """A shape of a mask over attention scores as SDPA takes it: ``[B or 1, H or 1, q_len or 1, kv_len]``. A rotary
    table ``[1, S, 1, D]`` whose D happens to equal S is not: its dim 1 is the sequence."""
    if len(shape) != 4 or shape[-1] != kv_len:
        return False
    return shape[-2] == q_len or (shape[-2] == 1 and shape[1] != q_len)


def masked_attention(graph: Graph) -> bool:
    """Whether any attention of ``graph`` takes an explicit mask (which cp runs by MASKED_CP_VARIANTS only)."""
    return any(n.op == "attention" and n.attrs.get("has_mask") for n in graph.nodes)


def _output_without_sequence(graph: Graph) -> list[int] | None:
    """The shape of an output tensor of the model whose dim 0 is the batch and whose dim 1 is not the sequence
    (``[B, labels]`` of a sequence classifier), or None when every batched output carries it: under cp the loss
    meets each rank's shard of a per-token output (execute/context_parallel.py ``shard_target``)."""
    for node in graph.nodes:
        if node.op != "output":
            continue
        for shape in node.attrs.get("output_shapes") or [node.output_shape]:
            if shape and shape[0] == graph.batch_size and (len(shape) < 2 or shape[1] != graph.seq_len):
                return shape
    return None


def _mixing_node(graph: Graph):
    """The first node from the first block on that combines values along a dim as long as the sequence, other
    than attention (``attrs["mixes"]``, trace/sequence_mixing.py); None when every such op is token-wise."""
    started = False
    for node in graph.nodes:
        started = started or node.layer is not None
        if started and node.op not in ("attention", "output") and graph.seq_len in node.attrs.get("mixes", ()):
            return node
    return None


def _where(node) -> str:
    """Where a node runs: in its block, or in another module between two blocks (an op between two blocks counts
    in the one before: BART's decoder positions, made after the encoder's last block), or after the last one."""
    module = node.module or ""
    if node.layer is None:
        return "after the last block"
    if module and not module.startswith(str(node.layer)):
        return f"in module '{module}' (after block '{node.layer}')"
    return f"in block '{node.layer}'"


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


#: the cp variants that run attention with a mask made before the blocks: autoplan's all-gather (each rank's
#: rows of the mask against the gathered keys, on any backend) and Ulysses (the whole mask on 1/cp of the
#: heads); torch's CP attention (ring, and its all-gather on NCCL) takes no mask
MASKED_CP_VARIANTS = ("allgather", "ulysses")


def runnable_cp_variants(backend: str, *, masked: bool = False) -> tuple[str, ...]:
    """The cp variants autoplan's executor runs on ``backend`` (gloo or nccl); ``masked``: for a model whose
    attention takes an explicit mask (:func:`masked_attention`)."""
    runs = RUNNABLE_CP_VARIANTS.get(backend, ())
    return tuple(v for v in runs if v in MASKED_CP_VARIANTS) if masked else runs
