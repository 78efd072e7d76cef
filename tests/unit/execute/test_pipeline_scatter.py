"""What a pipeline chunk sends is read from torch.export's shapes (execute/pipeline_scatter.py), so
each tp rank sends 1/tp of a boundary and its receiver knows what to gather, and along which dim
(types/layout.pipeline_scatter_dim, the rule cost/pp/messages.py prices)."""

from __future__ import annotations

import torch
import torch.nn as nn

from autoplan.execute.pipeline import split_model
from autoplan.execute.pipeline_scatter import boundary_specs
from autoplan.types.layout import kept_sharded, pipeline_scatter_dim
from autoplan.types.plan import Plan

DIM, SEQ = 8, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x, table):
        return self.proj(x) + table


class Carried(nn.Module):
    """A table made before the first block and used by every block: carried through chunk 1."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, ids):
        x, table = self.embed(ids), torch.ones(ids.shape[1], DIM)
        for block in self.blocks:
            x = block(x, table)
        return x


def test_each_boundary_is_read_from_export_even_where_a_chunk_only_passes_it_on():
    plan = Plan(devices=3, dp=1, tp=1, pp=3, micro_batch_size=2, num_microbatches=1,
                stages=[["blocks.0"], ["blocks.1"], ["blocks.2"]])  # fmt: skip
    ids = torch.zeros(2, SEQ, dtype=torch.long)
    pipe, _ = split_model(model=Carried(), plan=plan, microbatch_args=(ids,))
    specs = boundary_specs([pipe.get_stage_module(i) for i in range(pipe.num_stages)], [ids])
    hidden, table = ((2, SEQ, DIM), True), ((SEQ, DIM), True)
    assert [sorted(s) for s in specs] == [sorted([hidden, table])] * 2  # chunk 1 passes the table on


def test_the_split_dim_follows_sequence_parallelism_and_divisibility():
    assert pipeline_scatter_dim((2, SEQ, DIM), floating=True, tp=2, sequence_parallel=True) == 1
    assert pipeline_scatter_dim((2, SEQ, DIM), floating=True, tp=2, sequence_parallel=False) == 2
    assert pipeline_scatter_dim((2, 5, DIM), floating=True, tp=2, sequence_parallel=True) == 2
    assert pipeline_scatter_dim((2, SEQ, 7), floating=True, tp=2, sequence_parallel=False) is None
    assert pipeline_scatter_dim((2, SEQ), floating=False, tp=2, sequence_parallel=False) is None
    assert pipeline_scatter_dim((2, SEQ, DIM), floating=True, tp=1, sequence_parallel=False) is None
    assert kept_sharded(1, sequence_parallel=True) and not kept_sharded(2, sequence_parallel=True)
