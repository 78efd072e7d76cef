"""Small models for the executor's distributed tests: a GPT block with one fused qkv Linear
(nanoGPT-style global-head reshapes), a Llama-style block with GQA, RMSNorm and SwiGLU, and a
"third-party" Llama (in-place ops on activations, rotary tables as forward args, a long skip)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

#: examples/gpt.py at a size a 2-rank CPU run takes seconds on (its AUTOPLAN_GPT_* variables)
SMALL_GPT = {
    "AUTOPLAN_GPT_N_LAYER": "2",
    "AUTOPLAN_GPT_N_EMBD": "32",
    "AUTOPLAN_GPT_N_HEAD": "4",
    "AUTOPLAN_GPT_VOCAB_SIZE": "128",
    "AUTOPLAN_GPT_BLOCK_SIZE": "16",
}

VOCAB, DIM, HEADS, KV_HEADS, SEQ, LAYERS, EXPERTS = 64, 32, 4, 2, 8, 4, 4


class FusedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(DIM), FusedAttention(), nn.LayerNorm(DIM)
        self.c_fc, self.c_proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.h = nn.ModuleList(GPTBlock() for _ in range(LAYERS))
        self.ln_f, self.lm_head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class TiedGPT(TinyGPT):
    """TinyGPT whose head shares the token embedding's weight (GPT-2's tie): a pipeline puts the
    two on different stages, which sum their gradients (autoplan/execute/tied.py)."""

    def __init__(self):
        super().__init__()
        self.lm_head.weight = self.wte.weight


class SparseGPT(TinyGPT):
    """TinyGPT whose token embedding takes sparse gradients (``sparse=True``): DDP syncs its touched
    rows (autoplan/execute/sparse_grads.py, cost/dp/sparse_embedding.py)."""

    def __init__(self):
        super().__init__()
        self.wte.sparse = True


class BiasBlock(GPTBlock):
    """A GPT block over a second stream beside the first's output (``memory``), with T5's position bias: the
    first such block makes it from its own weight alone and hands it to the next (T5's relative attention)."""

    def __init__(self, *, makes_bias: bool):
        super().__init__()
        self.rel = nn.Embedding(SEQ, DIM) if makes_bias else None

    def forward(self, x, memory, bias=None):
        if self.rel is not None:
            bias = self.rel(torch.arange(x.size(1), device=x.device))
        return super().forward(x + bias + memory), bias


class EncoderDecoderGPT(nn.Module):
    """T5's two stage outputs that depend on weights alone, in a 4-chunk pipeline: the second stream's tied
    token embedding, looked up after block 1 (the end of chunk 1), and block 2's position bias, sent to
    block 3 (autoplan/execute/split_backward.py)."""

    def __init__(self):
        super().__init__()
        self.wte, self.dec_wte = nn.Embedding(VOCAB, DIM), nn.Embedding(VOCAB, DIM)
        self.h = nn.ModuleList([GPTBlock(), GPTBlock(), BiasBlock(makes_bias=True), BiasBlock(makes_bias=False)])
        self.ln_f, self.lm_head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.dec_wte.weight = self.wte.weight  # T5's one shared embedding

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h[:2]:
            x = block(x)
        y, bias = self.dec_wte(idx.flip(1)), None
        for block in self.h[2:]:
            y, bias = block(y, x, bias)
        return self.lm_head(self.ln_f(y))


class GQAAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, HEADS, self.head_dim)
        k = self.wk(x).view(B, T, KV_HEADS, self.head_dim)
        v = self.wv(x).view(B, T, KV_HEADS, self.head_dim)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=2)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


def _rotate(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(DIM), GQAAttention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.w1, self.w3, self.w2 = (
            nn.Linear(DIM, 2 * DIM, bias=False),
            nn.Linear(DIM, 2 * DIM, bias=False),
            nn.Linear(2 * DIM, DIM, bias=False),
        )

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(LlamaBlock() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
        freqs = torch.outer(
            torch.arange(SEQ).float(), 1.0 / 10000 ** (torch.arange(0, DIM // HEADS, 2).float() / (DIM // HEADS))
        )
        emb = torch.cat((freqs, freqs), dim=-1)[None, :, None, :]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx):
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


class LoRA(nn.Module):
    """A frozen linear plus a trainable rank-2 update (LoRA's shape; ``b`` random, not zero, so both
    adapters get gradients from the first step)."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a, self.b = nn.Linear(base.in_features, 2, bias=False), nn.Linear(2, base.out_features, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


class LoRALlama(TinyLlama):
    """TinyLlama fine-tuned with adapters: the embedding, norms and head frozen, every linear of the
    blocks frozen with a trainable update beside it (each block an FSDP unit of frozen and trainable
    parameters, the root one of frozen parameters only)."""

    def __init__(self):
        super().__init__()
        self.requires_grad_(False)
        for layer in self.layers:
            for owner, names in ((layer.attention, ("wq", "wk", "wv", "wo")), (layer, ("w1", "w2", "w3"))):
                for name in names:
                    setattr(owner, name, LoRA(getattr(owner, name)))


class BidirectionalAttention(FusedAttention):
    """FusedAttention without a causal mask (an encoder's self-attention)."""

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class BidirectionalGPT(TinyGPT):
    def __init__(self):
        super().__init__()
        for block in self.h:
            block.attn = BidirectionalAttention()


class MaskedAttention(FusedAttention):
    """FusedAttention under an explicit mask handed in by the model's root (Hugging Face's habit)."""

    def forward(self, x, mask):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MaskedBlock(GPTBlock):
    def __init__(self):
        super().__init__()
        self.attn = MaskedAttention()

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class WindowMaskedGPT(TinyGPT):
    """TinyGPT whose attention takes an explicit additive mask the root makes from positions before the blocks,
    as Hugging Face models trace theirs: causal within a sliding window of WINDOW keys (0 where a query sees a
    key, the dtype's least value elsewhere), which no ``is_causal`` flag expresses."""

    WINDOW = 3

    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList(MaskedBlock() for _ in range(LAYERS))

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        seen = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < self.WINDOW)
        mask = torch.zeros(seen.shape, dtype=x.dtype, device=x.device).masked_fill(~seen, torch.finfo(x.dtype).min)
        mask = mask[None, None].expand(idx.size(0), 1, -1, -1)
        for block in self.h:
            x = block(x, mask)
        return self.lm_head(self.ln_f(x))


class SdpaGQAAttention(GQAAttention):
    """GQA handed to SDPA with fewer key/value heads than query heads (``enable_gqa``), not repeated first."""

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, HEADS, self.head_dim)
        k = self.wk(x).view(B, T, KV_HEADS, self.head_dim)
        v = self.wv(x).view(B, T, KV_HEADS, self.head_dim)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class SdpaGQALlama(TinyLlama):
    def __init__(self):
        super().__init__()
        for layer in self.layers:
            layer.attention = SdpaGQAAttention()


class InplaceGQAAttention(GQAAttention):
    """Third-party habits: an OLMo-2-style q norm over all heads whose variance gets an
    in-place ``add_`` (a Partial DTensor when wq is colwise), and ``.contiguous().view()``."""

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x)
        var = q.pow(2).mean(-1, keepdim=True)
        var.add_(1e-6)
        q = (q * var.rsqrt()).view(B, T, HEADS, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, KV_HEADS, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, KV_HEADS, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        k, v = k.repeat_interleave(HEADS // KV_HEADS, dim=1), v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).contiguous().view(B, T, -1))


class InplaceLlamaBlock(LlamaBlock):
    def __init__(self):
        super().__init__()
        self.attention = InplaceGQAAttention()

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        gate = F.silu(self.w1(h))
        gate.mul_(self.w3(h))  # in-place on an activation
        return x + self.w2(gate)


class ThirdPartyLlama(nn.Module):
    """Rotary tables computed in the root forward and passed to every block as arguments (a
    pipeline chunk needs them from chunk 0, not from the one before it), and a long skip
    from the embedding to the head (a carried value that needs a gradient)."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(InplaceLlamaBlock() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
        head_dim = DIM // HEADS
        self.register_buffer(
            "inv_freq", 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim), persistent=False
        )

    def forward(self, idx):
        freqs = torch.outer(torch.arange(idx.shape[1], device=idx.device).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x0 = x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x + x0))


class LoopExperts(nn.Module):
    """``EXPERTS`` SwiGLU FFNs in the Hugging Face experts interface (autoplan/trace/moe.py), run
    as transformers 4.x ran them: a loop over the experts that received tokens, index_add."""

    has_gate, has_bias, is_transposed = True, False, False

    def __init__(self):
        super().__init__()
        self.num_experts = EXPERTS
        self.gate_up_proj = nn.Parameter(torch.randn(EXPERTS, 4 * DIM, DIM) / DIM**0.5)
        self.down_proj = nn.Parameter(torch.randn(EXPERTS, DIM, 2 * DIM) / (2 * DIM) ** 0.5)

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for expert in torch.unique(top_k_index).tolist():
            token, choice = torch.where(top_k_index == expert)
            h = self._apply_gate(F.linear(hidden[token], self.gate_up_proj[expert]))
            h = F.linear(h, self.down_proj[expert]) * top_k_weights[token, choice, None]
            out.index_add_(0, token, h.to(out.dtype))
        return out


class MoEMLP(nn.Module):
    """A Mixtral-style sparse block: a router Linear, softmax, top-2 renormalised, the experts."""

    def __init__(self):
        super().__init__()
        self.top_k = 2
        self.router, self.experts = nn.Linear(DIM, EXPERTS, bias=False), LoopExperts()

    def forward(self, x):
        B, T, C = x.shape
        tokens = x.reshape(B * T, C)
        weights, chosen = F.softmax(self.router(tokens), dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return self.experts(tokens, chosen, weights).reshape(B, T, C)


class MoEBlock(LlamaBlock):
    def __init__(self):
        super().__init__()
        del self.w1, self.w2, self.w3
        self.moe = MoEMLP()

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.moe(self.ffn_norm(x))


class TinyMoE(TinyLlama):
    """TinyLlama with a routed MoE MLP in every block (Mixtral's shape, the Hugging Face experts interface)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(MoEBlock() for _ in range(LAYERS))


class SkewedMoE(TinyMoE):
    """TinyMoE whose routers favour the first half of the experts by a bias of 1 on their logits: under ep = 2
    the first ep rank's experts get most rows, an imbalance the audit measures (execute/job/routing_audit.py)."""

    def __init__(self):
        super().__init__()
        for layer in self.layers:
            router = nn.Linear(DIM, EXPERTS, bias=True)
            with torch.no_grad():
                router.weight.copy_(layer.moe.router.weight)
                router.bias.copy_(torch.arange(EXPERTS) < EXPERTS // 2)
            layer.moe.router = router


def tokens(batch_size: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(seed))


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1))
