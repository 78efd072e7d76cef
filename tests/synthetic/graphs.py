"""Synthetic transformer graphs with the shape the tracer produces for a GPT block (norm -> q/k/v
-> attention -> o -> residual add -> norm -> fc1 -> gelu -> fc2 -> residual add), with FLOPs and
bytes from the usual formulas (a linear of m rows does 2*m*in*out FLOPs forward and twice that
backward; attention 4*b*s^2*h forward; Narayanan et al. SC'21, section 5.1), and
:func:`canonical_graph` to compare two graphs whose copied nodes are numbered differently.
"""

from __future__ import annotations

import json

from autoplan.types.graph import Graph, LayerGroup, OpNode, ParamInfo


class _Builder:
    def __init__(self, *, batch: int, seq: int):
        self.batch, self.seq = batch, seq
        self.nodes: list[OpNode] = []
        self.edges: list[tuple[str, str]] = []
        self.params: dict[str, ParamInfo] = {}

    def add(
        self,
        name: str,
        op: str,
        *,
        inputs: tuple[str, ...],
        width: int,
        layer: str | None,
        module: str = "",
        fwd_flops: int = 0,
        saved_width: int = 0,
        params: dict | None = None,
        attrs: dict | None = None,
        dtype: str = "float32",
    ) -> str:
        tokens = self.batch * self.seq
        elem = 8 if dtype == "int64" else 4
        param_names = []
        count = 0
        for pname, shape in (params or {}).items():
            numel = 1
            for d in shape:
                numel *= d
            self.params[pname] = ParamInfo(shape=list(shape), dtype="float32", numel=numel, bytes=numel * 4)
            param_names.append(pname)
            count += numel
        self.nodes.append(
            OpNode(
                name=name,
                op=op,
                target=op,
                module=module,
                layer=layer,
                param_names=param_names,
                param_count=count,
                param_bytes=count * 4,
                param_dtype="float32" if count else None,
                output_shape=[self.batch, self.seq, width],
                output_dtype=dtype,
                output_bytes=tokens * width * elem,
                saved_bytes=tokens * saved_width * 4,
                fwd_flops=fwd_flops,
                bwd_flops=2 * fwd_flops,
                attrs=attrs or {},
            )
        )
        self.edges.extend((i, name) for i in inputs)
        return name

    def linear(self, name: str, x: str, *, layer: str | None, module: str, n_in: int, n_out: int, **attrs) -> str:
        flops = 2 * self.batch * self.seq * n_in * n_out
        return self.add(
            name,
            "linear",
            inputs=(x,),
            width=n_out,
            layer=layer,
            module=module,
            fwd_flops=flops,
            saved_width=n_in,
            params={f"{module}.weight": (n_out, n_in)},
            attrs={"in_features": n_in, "out_features": n_out, "bias": False, **attrs},
        )


def synthetic_gpt(
    *,
    layers: int = 2,
    hidden: int = 512,
    heads: int = 8,
    kv_heads: int | None = None,
    vocab: int = 32000,
    seq: int = 512,
    batch: int = 16,
    ffn: int | None = None,
    fused_qkv: bool = False,
    name: str = "synthetic-gpt",
) -> Graph:
    """A GPT-style Graph with ``layers`` identical blocks (see the module docstring)."""
    kv_heads = kv_heads or heads
    ffn = ffn or 4 * hidden
    b = _Builder(batch=batch, seq=seq)
    x = b.add("tokens", "input", inputs=(), width=1, layer=None, dtype="int64")
    x = b.add(
        "wte",
        "embedding",
        inputs=(x,),
        width=hidden,
        layer=None,
        module="wte",
        params={"wte.weight": (vocab, hidden)},
        attrs={"num_embeddings": vocab, "embedding_dim": hidden},
    )
    names = [f"h.{i}" for i in range(layers)]
    for layer in names:
        x = _block(b, x, layer=layer, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, fused_qkv=fused_qkv)
    x = b.add(
        "ln_f",
        "norm",
        inputs=(x,),
        width=hidden,
        layer=None,
        module="ln_f",
        saved_width=hidden,
        fwd_flops=5 * batch * seq * hidden,
        params={"ln_f.weight": (hidden,)},
    )
    x = b.linear("head", x, layer=None, module="head", n_in=hidden, n_out=vocab)
    loss = b.add("loss", "loss", inputs=(x,), width=1, layer=None, saved_width=vocab, fwd_flops=3 * batch * seq * vocab)
    b.add("output", "output", inputs=(loss,), width=1, layer=None)
    return Graph(
        model_name=name,
        batch_size=batch,
        trace_method="fx",
        nodes=b.nodes,
        edges=b.edges,
        layers=names,
        groups=[LayerGroup(signature="block", layers=names)],
        parameters=b.params,
        seq_len=seq,
    )


def _block(
    b: _Builder, x: str, *, layer: str, hidden: int, heads: int, kv_heads: int, ffn: int, fused_qkv: bool
) -> str:
    head_dim = hidden // heads
    kv_width = kv_heads * head_dim
    tokens = b.batch * b.seq
    ln1 = b.add(
        f"{layer}.ln_1",
        "norm",
        inputs=(x,),
        width=hidden,
        layer=layer,
        module=f"{layer}.ln_1",
        saved_width=hidden,
        fwd_flops=5 * tokens * hidden,
        params={f"{layer}.ln_1.weight": (hidden,)},
    )
    att = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}
    if fused_qkv:
        qkv = b.linear(
            f"{layer}.attn.qkv",
            ln1,
            layer=layer,
            module=f"{layer}.attn.qkv",
            n_in=hidden,
            n_out=hidden + 2 * kv_width,
            fused_chunks=3,
            attention={"roles": ["q", "k", "v"], **att},
        )
        q = b.add(f"{layer}.attn.split_q", "view", inputs=(qkv,), width=hidden, layer=layer, module=f"{layer}.attn")
        k = b.add(f"{layer}.attn.split_k", "view", inputs=(qkv,), width=kv_width, layer=layer, module=f"{layer}.attn")
        v = b.add(f"{layer}.attn.split_v", "view", inputs=(qkv,), width=kv_width, layer=layer, module=f"{layer}.attn")
    else:
        q = b.linear(
            f"{layer}.attn.q",
            ln1,
            layer=layer,
            module=f"{layer}.attn.q",
            n_in=hidden,
            n_out=hidden,
            attention={"roles": ["q"], **att},
        )
        k = b.linear(
            f"{layer}.attn.k",
            ln1,
            layer=layer,
            module=f"{layer}.attn.k",
            n_in=hidden,
            n_out=kv_width,
            attention={"roles": ["k"], **att},
        )
        v = b.linear(
            f"{layer}.attn.v",
            ln1,
            layer=layer,
            module=f"{layer}.attn.v",
            n_in=hidden,
            n_out=kv_width,
            attention={"roles": ["v"], **att},
        )
    attn = b.add(
        f"{layer}.attn.sdpa",
        "attention",
        inputs=(q, k, v),
        width=hidden,
        layer=layer,
        module=f"{layer}.attn",
        fwd_flops=4 * tokens * b.seq * hidden,
        saved_width=4 * hidden,
        attrs={**att, "q_len": b.seq, "kv_len": b.seq, "causal": True},
    )
    o = b.linear(f"{layer}.attn.o", attn, layer=layer, module=f"{layer}.attn.o", n_in=hidden, n_out=hidden)
    x = b.add(
        f"{layer}.add_1",
        "elementwise",
        inputs=(x, o),
        width=hidden,
        layer=layer,
        module=layer,
        fwd_flops=tokens * hidden,
    )
    ln2 = b.add(
        f"{layer}.ln_2",
        "norm",
        inputs=(x,),
        width=hidden,
        layer=layer,
        module=f"{layer}.ln_2",
        saved_width=hidden,
        fwd_flops=5 * tokens * hidden,
        params={f"{layer}.ln_2.weight": (hidden,)},
    )
    fc1 = b.linear(f"{layer}.mlp.fc1", ln2, layer=layer, module=f"{layer}.mlp.fc1", n_in=hidden, n_out=ffn)
    act = b.add(
        f"{layer}.mlp.gelu",
        "elementwise",
        inputs=(fc1,),
        width=ffn,
        layer=layer,
        module=f"{layer}.mlp.act",
        saved_width=ffn,
        fwd_flops=8 * tokens * ffn,
    )
    fc2 = b.linear(f"{layer}.mlp.fc2", act, layer=layer, module=f"{layer}.mlp.fc2", n_in=ffn, n_out=hidden)
    return b.add(
        f"{layer}.add_2",
        "elementwise",
        inputs=(x, fc2),
        width=hidden,
        layer=layer,
        module=layer,
        fwd_flops=tokens * hidden,
    )


# ---- the cost-model tests' GPT and DGX-A100 profile ------------------------------------------
# Synthetic inputs for the cost-model tests: a GPT graph and a DGX-A100-like profile.
#
# The GPT graph mirrors what the tracer records for a nanoGPT block with flash attention
# (torch SDPA) and dropout: per node the saved bytes that autograd keeps (Korthikanti et al.
# 2022 section 4.1 lists the same tensors) and the matmul FLOPs of Narayanan et al. SC'21.
# The profile's numbers come from ../shared/reference/hardware.csv.


def _typed_node(name, op, layer, *, out, saved=0, fwd=0, params=0, attrs=None, shape=None, dtype="float32"):
    return OpNode(
        name=name,
        op=op,
        target=op,
        module=name,
        layer=layer,
        param_count=params,
        param_bytes=params * 4,
        output_shape=shape or [],
        output_dtype=dtype,
        output_bytes=int(out),
        saved_bytes=int(saved),
        fwd_flops=int(fwd),
        bwd_flops=int(2 * fwd),
        attrs=attrs or {},
    )


def _typed_linear(name, layer, *, tokens, fin, fout, saved_out, shape_prefix, e=4):
    return _typed_node(
        name,
        "linear",
        layer,
        out=e * tokens * fout,
        saved=saved_out * e * tokens * fout,
        fwd=2 * tokens * fin * fout,
        params=fin * fout + fout,
        dtype=DTYPES[e],
        attrs={"in_features": fin, "out_features": fout, "bias": True},
        shape=shape_prefix + [fout],
    )


DTYPES = {4: "float32", 2: "bfloat16"}


def _cost_block(prefix, *, b, s, h, a, e=4):
    """One GPT block; saved bytes as autograd keeps them in an e-byte dtype (dropout masks are
    1 byte, norm statistics and attention's logsumexp fp32)."""
    t = b * s * h
    tok = b * s
    sp = [b, s]
    stats = 2 * 4 * tok

    def _node(*args, **kw):
        return _typed_node(*args, dtype=DTYPES[e], **kw)

    def _linear(*args, **kw):
        return _typed_linear(*args, e=e, **kw)

    return [
        _node(
            f"{prefix}.ln_1", "norm", prefix, out=e * t, saved=e * t + stats, fwd=5 * t, params=2 * h, shape=sp + [h]
        ),
        _linear(f"{prefix}.attn.c_attn", prefix, tokens=tok, fin=h, fout=3 * h, saved_out=1, shape_prefix=sp),
        _node(
            f"{prefix}.attn.sdpa",
            "attention",
            prefix,
            out=e * t,
            saved=e * t + 4 * b * a * s,
            fwd=4 * b * s * s * h,
            attrs={"num_heads": a, "num_kv_heads": a, "head_dim": h // a, "q_len": s, "kv_len": s, "causal": True},
            shape=sp + [h],
        ),
        _linear(f"{prefix}.attn.c_proj", prefix, tokens=tok, fin=h, fout=h, saved_out=0, shape_prefix=sp),
        _node(f"{prefix}.attn.resid_dropout", "elementwise", prefix, out=e * t, saved=t, fwd=t, shape=sp + [h]),
        _node(f"{prefix}.add_1", "elementwise", prefix, out=e * t, saved=e * t, fwd=t, shape=sp + [h]),
        _node(
            f"{prefix}.ln_2", "norm", prefix, out=e * t, saved=e * t + stats, fwd=5 * t, params=2 * h, shape=sp + [h]
        ),
        _linear(f"{prefix}.mlp.c_fc", prefix, tokens=tok, fin=h, fout=4 * h, saved_out=1, shape_prefix=sp),
        _node(
            f"{prefix}.mlp.gelu",
            "elementwise",
            prefix,
            out=4 * e * t,
            saved=4 * e * t,
            fwd=8 * 4 * t,
            shape=sp + [4 * h],
        ),
        _linear(f"{prefix}.mlp.c_proj", prefix, tokens=tok, fin=4 * h, fout=h, saved_out=0, shape_prefix=sp),
        _node(f"{prefix}.mlp.dropout", "elementwise", prefix, out=e * t, saved=t, fwd=t, shape=sp + [h]),
        _node(f"{prefix}.add_2", "elementwise", prefix, out=e * t, saved=e * t, fwd=t, shape=sp + [h]),
    ]


def gpt_graph(*, layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8, dtype_bytes=4) -> Graph:
    """A traced-looking GPT: embeddings, ``layers`` identical blocks, final norm, head, loss."""
    b, s, h, v = batch_size, seq_len, hidden, vocab
    t, tok = b * s * h, b * s
    nodes = [
        OpNode(
            name="idx",
            op="input",
            target="idx",
            module="",
            layer=None,
            output_shape=[b, s],
            output_dtype="int64",
            output_bytes=8 * tok,
        ),
        _typed_node(
            "wte",
            "embedding",
            None,
            out=4 * t,
            params=v * h,
            attrs={"num_embeddings": v, "embedding_dim": h},
            shape=[b, s, h],
        ),
        _typed_node(
            "wpe",
            "embedding",
            None,
            out=4 * s * h,
            params=s * h,
            attrs={"num_embeddings": s, "embedding_dim": h},
            shape=[s, h],
        ),
        _typed_node("emb_add", "elementwise", None, out=4 * t, fwd=t, shape=[b, s, h]),
        _typed_node("drop", "elementwise", None, out=4 * t, saved=4 * t + t, fwd=t, shape=[b, s, h]),
    ]
    names = [f"h.{i}" for i in range(layers)]
    for name in names:
        nodes += _cost_block(name, b=b, s=s, h=h, a=heads, e=dtype_bytes)
    nodes += [
        _typed_node("ln_f", "norm", None, out=4 * t, saved=4 * t + 8 * tok, fwd=5 * t, params=2 * h, shape=[b, s, h]),
        _typed_node(
            "lm_head",
            "linear",
            None,
            out=4 * tok * v,
            saved=4 * tok * v,
            fwd=2 * tok * h * v,
            attrs={"in_features": h, "out_features": v, "bias": False},
            shape=[b, s, v],
        ),
        _typed_node("loss", "loss", None, out=4, saved=4 * tok * v, fwd=3 * tok * v, shape=[]),
    ]
    edges = [(nodes[i].name, nodes[i + 1].name) for i in range(len(nodes) - 1)]
    params = {
        "wte.weight": ParamInfo(shape=[v, h], dtype="float32", numel=v * h, bytes=4 * v * h),
        "wpe.weight": ParamInfo(shape=[s, h], dtype="float32", numel=s * h, bytes=4 * s * h),
        "ln_f.weight": ParamInfo(shape=[2 * h], dtype="float32", numel=2 * h, bytes=8 * h),
    }
    for node in nodes:
        if node.layer is not None and node.param_count:
            params[f"{node.name}.weight"] = ParamInfo(
                shape=[node.param_count], dtype="float32", numel=node.param_count, bytes=4 * node.param_count
            )
    return Graph(
        model_name="gpt-synthetic",
        batch_size=b,
        trace_method="fx",
        nodes=nodes,
        edges=edges,
        layers=names,
        groups=[LayerGroup(signature="block", layers=names)],
        parameters=params,
        seq_len=s,
        dtype=DTYPES[dtype_bytes],
    )


def canonical_graph(graph: Graph) -> dict:
    """The graph's dict with node names replaced by their positions (a copied node is numbered anew)."""
    data = graph.to_dict()
    index = {node["name"]: i for i, node in enumerate(data["nodes"])}
    for node in data["nodes"]:
        node["name"] = index[node["name"]]
    data["edges"] = sorted([index[a], index[b]] for a, b in data["edges"])
    return json.loads(json.dumps(data, default=str))
