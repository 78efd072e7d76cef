"""Which models context parallelism can split (autoplan/types/context_parallel.py ``cp_refusal``), on
tiny models traced as the planner traces them: what the executor runs (autoplan/execute/
context_parallel.py: causal or unmasked SDPA over the whole sequence, inside the blocks) passes,
and each thing it cannot run is one sentence."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace import trace
from autoplan.types.context_parallel import cp_divides, cp_refusal, masked_attention, runnable_cp_variants

SEQ, DIM = 8, 16


class Block(nn.Module):
    def __init__(self, mask: str):
        super().__init__()
        self.qkv, self.mask = nn.Linear(DIM, 3 * DIM), mask

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.size(0), SEQ, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4).unbind(0)
        if self.mask == "explicit":
            causal = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.mask == "causal")
        return x + y.transpose(1, 2).reshape(x.shape)


class RootMaskedBlock(Block):
    """Attention under the mask the model's root hands every block (Hugging Face's habit)."""

    def forward(self, x, mask):
        q, k, v = self.qkv(x).view(x.size(0), SEQ, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4).unbind(0)
        return x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(x.shape)


class RootMasked(nn.Module):
    """A sliding-window mask made from positions before the blocks: what cp applies (a rank's rows of it)."""

    def __init__(self):
        super().__init__()
        self.emb, self.layers = nn.Embedding(32, DIM), nn.ModuleList(RootMaskedBlock("root") for _ in range(2))

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        mask = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < 3)
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x, mask[None, None].expand(idx.size(0), 1, -1, -1))
        return x


class Model(nn.Module):
    def __init__(self, mask: str = "causal", attention_outside: bool = False):
        super().__init__()
        self.emb = nn.Embedding(32, DIM)
        self.layers = nn.ModuleList(Block(mask) for _ in range(2))
        self.attention_outside = attention_outside

    def forward(self, idx):
        x = self.emb(idx)
        if self.attention_outside:  # attention in the root forward, where no block shards it
            h = x.view(x.size(0), SEQ, 2, DIM // 2).transpose(1, 2)
            x = x + F.scaled_dot_product_attention(h, h, h, is_causal=True).transpose(1, 2).reshape(x.shape)
        for layer in self.layers:
            x = layer(x)
        return x


def _graph(model):
    return trace(model, (torch.randint(0, 32, (2, SEQ)),))


@pytest.mark.parametrize("mask", ["causal", "none"])
def test_causal_or_unmasked_attention_in_the_blocks_can_be_split(mask):
    assert cp_refusal(_graph(Model(mask))) is None


def test_a_mask_made_inside_a_block_is_refused():
    """Under cp a block sees its shard, so a mask it builds is the shard's; one made before the blocks is whole."""
    said = cp_refusal(_graph(Model("explicit")))
    assert said is not None and "in block 'layers.0' takes an explicit mask that context parallelism" in said
    assert "is made inside the block" in said and "is_causal=True" in said
    assert masked_attention(_graph(Model("explicit"))) and not masked_attention(_graph(Model("causal")))


def test_a_mask_made_before_the_blocks_can_be_split_by_the_variants_that_apply_it():
    graph = _graph(RootMasked())
    assert masked_attention(graph) and cp_refusal(graph) is None
    assert runnable_cp_variants("gloo", masked=True) == ("allgather", "ulysses")
    assert runnable_cp_variants("nccl", masked=True) == ("allgather",)  # torch's ring and all-gather take no mask


def test_attention_outside_the_blocks_is_refused():
    said = cp_refusal(_graph(Model(attention_outside=True)))
    assert said is not None and "runs outside the model's blocks" in said and "plan cp=1" in said


def test_head_tail_chunks_need_2cp_to_divide_the_sequence():
    assert cp_divides(8, 2) and cp_divides(8, 4) and not cp_divides(8, 8) and not cp_divides(12, 4)


def test_gloo_runs_autoplans_allgather_and_ulysses_and_nccl_torchs_allgather_and_ring():
    assert runnable_cp_variants("gloo") == ("allgather", "ulysses")
    assert runnable_cp_variants("nccl") == ("allgather", "ring")


class RopeInside(nn.Module):
    """A block that builds its rotary positions from its own input's length, as much hand-written RoPE does."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)

    def forward(self, x):
        positions = torch.arange(x.shape[1], dtype=torch.float32, device=x.device)
        q, k, v = self.qkv(x).view(x.size(0), SEQ, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4).unbind(0)
        angle = positions[:, None] * torch.ones(DIM // 2, device=x.device)
        q, k = q * angle.cos(), k * angle.cos()
        return x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)


def test_positions_built_inside_a_block_refuse_context_parallelism():
    """Under cp a block sees its shard of the sequence, so ``torch.arange(x.shape[1])`` inside it counts from 0 on
    every rank: the run computed other gradients (--verify failed at 0.75). Positions built before the blocks
    (Model above, Hugging Face's models) are what the executor keeps global."""
    model = Model()
    model.layers = nn.ModuleList(RopeInside() for _ in range(2))
    graph = trace(model, (torch.zeros(2, SEQ, dtype=torch.long),))
    assert "in block 'layers.0' builds positions of the whole sequence" in cp_refusal(graph)
    assert "layers.0" in cp_refusal(graph)
    assert cp_refusal(trace(Model(), (torch.zeros(2, SEQ, dtype=torch.long),))) is None


class Classifier(Model):
    """A sequence classifier: the first token's hidden state after the blocks, as BERT's pooler takes [CLS]."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(DIM, 3)

    def forward(self, idx):
        return self.head(super().forward(idx)[:, 0])


def test_an_output_without_the_sequence_is_refused():
    """Under cp each rank's hidden states leave the blocks as its shard: HF BertForSequenceClassification pooled
    another token on cp rank 1 (--verify 70% off, no error) and LlamaForSequenceClassification's last-token index
    fell off the shard (a raw IndexError)."""
    said = cp_refusal(_graph(Classifier()))
    assert said is not None and "output (shape [2, 3]) has no sequence dim" in said and "plan cp=1" in said


class MixingBlock(Block):
    """Causal SDPA, then an op that combines values along the sequence (``mix``), or none."""

    def __init__(self, mix: str):
        super().__init__("causal")
        self.mix, self.conv = mix, nn.Conv1d(DIM, DIM, 3, padding=2, groups=DIM)
        self.rnn = nn.LSTM(DIM, DIM, batch_first=True)

    def forward(self, x):
        x = super().forward(x)
        if self.mix == "cumsum":  # a minGRU / RetNet scan
            return x + x.cumsum(dim=1)
        if self.mix == "shift":  # RWKV's token shift
            return x + F.pad(x, (0, 0, 1, -1))
        if self.mix == "conv":  # Mamba's or Hyena's short causal filter
            return x + self.conv(x.transpose(1, 2))[..., : x.size(1)].transpose(1, 2)
        if self.mix == "lstm":
            return x + self.rnn(x)[0]
        if self.mix == "loop":  # a recurrence written as a Python loop over the positions
            h, out = torch.zeros_like(x[:, 0]), []
            for t in range(x.size(1)):
                h = torch.tanh(h + x[:, t])
                out.append(h)
            return x + torch.stack(out, dim=1)
        if self.mix == "pool":  # a mean over the tokens, added back to each
            return x + x.mean(dim=1, keepdim=True)
        # token-wise ops over a hidden size equal to the sequence's length: an RMSNorm, a softmax gate, a half
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return norm + x.softmax(-1) + x[..., : DIM // 2].sum(-1, True)


@pytest.mark.parametrize(
    "mix, op", [("cumsum", "cumsum"), ("shift", "pad"), ("conv", "Conv1d"), ("lstm", "LSTM"), ("loop", "select"),
                ("pool", "mean")],
)  # fmt: skip
def test_an_op_that_combines_values_along_the_sequence_in_a_block_is_refused(mix, op):
    """Under cp each rank holds its shard of the sequence in the blocks and only attention exchanges between them:
    a cumsum, a token shift or a causal Conv1d trained with gradients 20-40% off, no error (--verify failed)."""
    model = Model()
    model.layers = nn.ModuleList(MixingBlock(mix) for _ in range(2))
    said = cp_refusal(_graph(model))
    assert said is not None and "in block 'layers.0' combines values along the sequence of 8 tokens" in said, said
    assert op in said and "plan cp=1" in said


def test_token_wise_ops_over_a_hidden_size_as_long_as_the_sequence_are_no_mixing():
    """With the hidden size equal to the sequence's length, a reduction over the last dim reads as either: it is
    left to the hidden size (trace/sequence_mixing.py), so a norm or a gate does not refuse cp."""
    global SEQ
    model = Model()
    model.layers = nn.ModuleList(MixingBlock("none") for _ in range(2))
    saved, SEQ = SEQ, DIM
    try:
        assert cp_refusal(trace(model, (torch.randint(0, 32, (2, DIM)),))) is None
    finally:
        SEQ = saved


def _shifted(logits, target):  # a causal LM's loss: position t scored against token t + 1
    return F.cross_entropy(logits[:, :-1].reshape(-1, DIM), target[:, 1:].reshape(-1))


def _shifted_as_hf(logits, target):  # transformers' ForCausalLMLoss idiom
    return F.cross_entropy(logits[..., :-1, :].reshape(-1, DIM), target[..., 1:].reshape(-1))


def _aligned(logits, target):
    return F.cross_entropy(logits.reshape(-1, DIM), target.reshape(-1))


def test_a_loss_that_shifts_the_sequence_refuses_cp_and_an_aligned_one_does_not():
    """Under cp the loss meets each rank's head-tail shard of the output and the target, so a shift inside the loss
    pairs tokens across the chunks: HF Llama trained with gradients 26-36% off, no error."""
    ids, target = torch.randint(0, 32, (2, SEQ)), torch.randint(0, DIM, (2, SEQ))
    for loss in (_shifted, _shifted_as_hf):
        said = cp_refusal(trace(Model(), (ids,), loss_fn=loss, target=target))
        assert said is not None and "the loss function shifts, slices or picks along the sequence of 8 tokens" in said
    assert cp_refusal(trace(Model(), (ids,), loss_fn=_aligned, target=target)) is None
