"""A node that reads a tensor's metadata (``x.dtype``, ``x.shape``) passes none of its values on: the tensor-parallel
terms (autoplan/cost/tp/block.py ``carries_values``) must not price a gather of a sharded output for it. The case:
rotary tables cast to q's dtype (``cos.to(q.dtype)``, examples/llama.py and Hugging Face's Llama), which the executor
runs on each rank's heads with no collective (benchmarks/audit.py's tp_sp, dp_tp_zero1 and tp_pp families)."""

import pytest
import torch
import torch.nn.functional as F
from synthetic import synthetic_profile

from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.block import analyse_block
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.splits import TPContext, block_messages
from autoplan.trace import trace

B, S, HEADS, D = 2, 16, 4, 8


def _rotate(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _RotaryAttention(torch.nn.Module):
    """q, k, v and o linears, rotary tables applied to q and k: cast to q's dtype first or not."""

    def __init__(self, cast: bool):
        super().__init__()
        self.cast = cast
        self.q, self.k, self.v, self.o = (torch.nn.Linear(HEADS * D, HEADS * D, bias=False) for _ in range(4))

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        q, k, v = (lin(x).view(b, s, HEADS, D).transpose(1, 2) for lin in (self.q, self.k, self.v))
        cos, sin = (cos.to(q.dtype), sin.to(q.dtype)) if self.cast else (cos, sin)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, h))


class _Net(torch.nn.Module):
    def __init__(self, cast: bool):
        super().__init__()
        self.layers = torch.nn.ModuleList(_RotaryAttention(cast) for _ in range(2))

    def forward(self, x):
        angles = torch.outer(torch.arange(x.shape[1], dtype=torch.float32), torch.ones(D))  # as examples/llama.py
        cos, sin = angles.cos(), angles.sin()  # nodes of the graph, passed to each block
        for layer in self.layers:
            x = x + layer(x, cos, sin)
        return x


def _messages(cast: bool, sp: bool) -> tuple[dict, dict]:
    graph = trace(
        _Net(cast), (torch.randn(B, S, HEADS * D),), loss_fn=lambda out, _: out.sum(), target=None, model_name="rot"
    )
    profile = synthetic_profile()
    ctx = TPContext(
        profile=profile,
        tp=2,
        group=mesh_groups(profile, dp=1, tp=2, pp=1)["tp"],
        sequence_parallel=sp,
        precision="fp32",
        batch_fraction=1.0,
    )
    fwd, bwd = block_messages(graph, graph.layers[0], default_tp_plan(graph, 2, sequence_parallel=sp), ctx=ctx)
    return fwd.by_kind, bwd.by_kind


@pytest.mark.parametrize("sp", [False, True])
def test_rotary_tables_cast_to_q_dtype_gather_nothing(sp):
    # Megatron's block: q, k, v colwise, o rowwise; the tables' cast reads q's dtype, not its values
    assert _messages(cast=True, sp=sp) == _messages(cast=False, sp=sp)
    fwd, _bwd = _messages(cast=True, sp=sp)
    stream = B * S * HEADS * D * 4  # fp32
    expected = {"all_gather": [1, stream], "reduce_scatter": [1, stream]} if sp else {"all_reduce": [1, stream]}
    assert fwd == expected  # no gather of q's or k's shards


class _BufferTables(torch.nn.Module):
    """The tables as buffers: their cast ``cos.to(q.dtype)`` reads nothing but q's dtype."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(_RotaryAttention(cast=True) for _ in range(2))
        angles = torch.outer(torch.arange(S, dtype=torch.float32), torch.ones(D))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x, self.cos, self.sin)
        return x


def test_a_cast_to_q_dtype_does_not_descend_from_q():
    # it runs whole on every rank (a table), not on q's head shard
    graph = trace(
        _BufferTables(), (torch.randn(B, S, HEADS * D),), loss_fn=lambda out, _: out.sum(), target=None, model_name="b"
    )
    block = analyse_block(graph, graph.layers[0])
    casts = [n.name for n in block.nodes if n.target == "to"]
    assert casts and not any(name in block.origins for name in casts)
