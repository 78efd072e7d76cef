"""A parameter every block reads directly, not through a module call: a relative-position table handed to each
layer (as DeBERTa-v2's encoder hands ``rel_embeddings.weight`` to every layer, and Perceiver its input embeddings).
torch's pipeline split copies it into each stage that reads it; each copy's gradient is only its own stage's part
of the one tensor's, so the stages' copies are summed as a tied weight's (execute/tied.py ``shared_names``). Its
blocks also fill masked scores with ``torch.finfo(s.dtype).min``, as DeBERTa-v2 does, which torch.export records as
fp32's -3.4e38: a bf16 pipeline stage must fill bf16's (execute/dtype_extremes.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D, POSITIONS = 32, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x, table, mask):
        scores = self.fc(x) + self.fc(table).unsqueeze(0)
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        return x + torch.softmax(scores, dim=-1)


class SharedTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(POSITIONS, D)
        self.layers = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(D, 5)

    def forward(self, x):
        mask = x[..., :1] > 1.0  # made in forward, read by every block
        for layer in self.layers:
            x = layer(x, self.table.weight, mask)
        return self.head(x.mean(1))


def build_model():
    return SharedTable()


def example_inputs(batch_size):
    return (torch.randn(batch_size, POSITIONS, D),)


def example_target(batch_size):
    return torch.randint(0, 5, (batch_size,))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
