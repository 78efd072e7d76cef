"""The trace marks the parameters whose gradients are sparse (an embedding table read with
``sparse=True`` through nn.Embedding, nn.EmbeddingBag or F.embedding) and only those; a graph
without one serialises as before the flag (docs/trace.md)."""

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace.api import trace, trace_model_file
from autoplan.types.graph import Graph

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sparse_embedding.py"


class _Mixed(nn.Module):
    """A functional sparse read, a dense nn.Embedding, and a sparse table that a dense matmul also reads."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(50, 8))
        self.dense = nn.Embedding(20, 8)
        self.tied = nn.Embedding(30, 8, sparse=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        hidden = F.embedding(x, self.table, sparse=True) + self.dense(x % 20) + self.tied(x % 30)
        return self.head(hidden).mean(1) + (hidden @ self.tied.weight.t()).mean()


def test_example_marks_its_embedding_and_bag_tables():
    graph = trace_model_file(EXAMPLE, 2)
    sparse = {name for name, info in graph.parameters.items() if info.sparse_grad}
    assert sparse == {"tokens.weight", "categories.weight"}
    again = Graph.from_dict(graph.to_dict())
    assert again.parameters["tokens.weight"].sparse_grad


def test_functional_sparse_read_marked_and_a_dense_read_wins():
    graph = trace(_Mixed(), (torch.randint(0, 50, (2, 6)),))
    flags = {name: info.sparse_grad for name, info in graph.parameters.items()}
    assert flags == {
        "table": True,
        "dense.weight": False,
        "tied.weight": False,
        "head.weight": False,
        "head.bias": False,
    }
    assert "sparse_grad" not in graph.parameters["dense.weight"].to_dict()
