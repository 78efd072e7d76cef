"""Synthetic inputs for the cost-model tests: a GPT graph and a DGX-A100-like profile.

The GPT graph mirrors what the tracer records for a nanoGPT block with flash attention
(torch SDPA) and dropout: per node the saved bytes that autograd keeps (Korthikanti et al.
2022 section 4.1 lists the same tensors) and the matmul FLOPs of Narayanan et al. SC'21.
The profile's numbers come from ../shared/reference/hardware.csv.
"""
from __future__ import annotations

from autoplan.types import Graph, LayerGroup, OpNode, ParamInfo
from autoplan.types.profile import CollectiveFit, DeviceSpec, Efficiency, LinkSpec, Profile, COLLECTIVES


def _typed_node(name, op, layer, *, out, saved=0, fwd=0, params=0, attrs=None, shape=None, dtype="float32"):
    return OpNode(name=name, op=op, target=op, module=name,
                  layer=layer, param_count=params, param_bytes=params * 4,
                  output_shape=shape or [], output_dtype=dtype, output_bytes=int(out),
                  saved_bytes=int(saved), fwd_flops=int(fwd), bwd_flops=int(2 * fwd), attrs=attrs or {})


def _typed_linear(name, layer, *, tokens, fin, fout, saved_out, shape_prefix, e=4):
    return _typed_node(name, "linear", layer, out=e * tokens * fout, saved=saved_out * e * tokens * fout,
                 fwd=2 * tokens * fin * fout, params=fin * fout + fout, dtype=DTYPES[e],
                 attrs={"in_features": fin, "out_features": fout, "bias": True}, shape=shape_prefix + [fout])


DTYPES = {4: "float32", 2: "bfloat16"}


def _block(prefix, *, b, s, h, a, e=4):
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
        _node(f"{prefix}.ln_1", "norm", prefix, out=e * t, saved=e * t + stats, fwd=5 * t, params=2 * h, shape=sp + [h]),
        _linear(f"{prefix}.attn.c_attn", prefix, tokens=tok, fin=h, fout=3 * h, saved_out=1, shape_prefix=sp),
        _node(f"{prefix}.attn.sdpa", "attention", prefix, out=e * t, saved=e * t + 4 * b * a * s, fwd=4 * b * s * s * h,
              attrs={"num_heads": a, "num_kv_heads": a, "head_dim": h // a, "q_len": s, "kv_len": s, "causal": True}, shape=sp + [h]),
        _linear(f"{prefix}.attn.c_proj", prefix, tokens=tok, fin=h, fout=h, saved_out=0, shape_prefix=sp),
        _node(f"{prefix}.attn.resid_dropout", "elementwise", prefix, out=e * t, saved=t, fwd=t, shape=sp + [h]),
        _node(f"{prefix}.add_1", "elementwise", prefix, out=e * t, saved=e * t, fwd=t, shape=sp + [h]),
        _node(f"{prefix}.ln_2", "norm", prefix, out=e * t, saved=e * t + stats, fwd=5 * t, params=2 * h, shape=sp + [h]),
        _linear(f"{prefix}.mlp.c_fc", prefix, tokens=tok, fin=h, fout=4 * h, saved_out=1, shape_prefix=sp),
        _node(f"{prefix}.mlp.gelu", "elementwise", prefix, out=4 * e * t, saved=4 * e * t, fwd=8 * 4 * t, shape=sp + [4 * h]),
        _linear(f"{prefix}.mlp.c_proj", prefix, tokens=tok, fin=4 * h, fout=h, saved_out=0, shape_prefix=sp),
        _node(f"{prefix}.mlp.dropout", "elementwise", prefix, out=e * t, saved=t, fwd=t, shape=sp + [h]),
        _node(f"{prefix}.add_2", "elementwise", prefix, out=e * t, saved=e * t, fwd=t, shape=sp + [h]),
    ]


def gpt_graph(*, layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8, dtype_bytes=4) -> Graph:
    """A traced-looking GPT: embeddings, ``layers`` identical blocks, final norm, head, loss."""
    b, s, h, v = batch_size, seq_len, hidden, vocab
    t, tok = b * s * h, b * s
    nodes = [
        OpNode(name="idx", op="input", target="idx", module="", layer=None, output_shape=[b, s], output_dtype="int64", output_bytes=8 * tok),
        _typed_node("wte", "embedding", None, out=4 * t, params=v * h, attrs={"num_embeddings": v, "embedding_dim": h}, shape=[b, s, h]),
        _typed_node("wpe", "embedding", None, out=4 * s * h, params=s * h, attrs={"num_embeddings": s, "embedding_dim": h}, shape=[s, h]),
        _typed_node("emb_add", "elementwise", None, out=4 * t, fwd=t, shape=[b, s, h]),
        _typed_node("drop", "elementwise", None, out=4 * t, saved=4 * t + t, fwd=t, shape=[b, s, h]),
    ]
    names = [f"h.{i}" for i in range(layers)]
    for name in names:
        nodes += _block(name, b=b, s=s, h=h, a=heads, e=dtype_bytes)
    nodes += [
        _typed_node("ln_f", "norm", None, out=4 * t, saved=4 * t + 8 * tok, fwd=5 * t, params=2 * h, shape=[b, s, h]),
        _typed_node("lm_head", "linear", None, out=4 * tok * v, saved=4 * tok * v, fwd=2 * tok * h * v,
              attrs={"in_features": h, "out_features": v, "bias": False}, shape=[b, s, v]),
        _typed_node("loss", "loss", None, out=4, saved=4 * tok * v, fwd=3 * tok * v, shape=[]),
    ]
    edges = [(nodes[i].name, nodes[i + 1].name) for i in range(len(nodes) - 1)]
    params = {"wte.weight": ParamInfo(shape=[v, h], dtype="float32", numel=v * h, bytes=4 * v * h),
              "wpe.weight": ParamInfo(shape=[s, h], dtype="float32", numel=s * h, bytes=4 * s * h),
              "ln_f.weight": ParamInfo(shape=[2 * h], dtype="float32", numel=2 * h, bytes=8 * h)}
    for node in nodes:
        if node.layer is not None and node.param_count:
            params[f"{node.name}.weight"] = ParamInfo(shape=[node.param_count], dtype="float32",
                                                      numel=node.param_count, bytes=4 * node.param_count)
    return Graph(model_name="gpt-synthetic", batch_size=b, trace_method="fx", nodes=nodes, edges=edges,
                 layers=names, groups=[LayerGroup(signature="block", layers=names)], parameters=params,
                 seq_len=s, dtype=DTYPES[dtype_bytes])


def _link(name, busbw, alpha_s):
    return LinkSpec(name=name, collectives={kind: CollectiveFit(alpha_s=alpha_s, busbw_bytes_per_s=busbw, source="test")
                                            for kind in COLLECTIVES})


def a100_profile(*, inter_busbw=200e9, intra_busbw=230e9, price=None) -> Profile:
    """A DGX-A100-like profile (hardware.csv): 312 TFLOP/s bf16, 80 GB, NVLink, 8x HDR."""
    device = DeviceSpec(name="A100-SXM4-80GB", memory_bytes=80 * 2**30,
                        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
                        memory_bandwidth_bytes_per_s=2.039e12,
                        efficiency={"matmul": Efficiency(max_efficiency=0.8, half_saturation_flops=2e9, source="test"),
                                    "attention": Efficiency(max_efficiency=0.6, half_saturation_flops=2e9, source="test")},
                        source="test")
    return Profile(name="test-a100", device=device, devices_per_node=8,
                   intra_node=_link("nvlink", intra_busbw, 10e-6), inter_node=_link("ib", inter_busbw, 20e-6),
                   price_per_device_hour=price)
