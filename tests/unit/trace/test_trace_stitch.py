"""A stitched export (autoplan/trace/stitch.py) gives the graph a full export gives, or is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from synthetic import canonical_graph

import autoplan.trace.capture as capture
from autoplan.trace import stitch, trace

WIDTH, BLOCKS = 16, 7


class Block(nn.Module):
    """Splits with a generator, which torch.fx cannot trace: the model goes through torch.export."""

    def __init__(self, position: int, scale: float = 1.0):
        super().__init__()
        self.layer_idx, self.width, self.scale = position, WIDTH, scale
        self.groups = 5  # equal to block 5's position, and to no other's
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        a, b = (t * self.scale for t in self.up(x).split(WIDTH, dim=-1))
        return x + self.down(torch.relu(a) * b)


class Stack(nn.Module):
    def __init__(self, scales=None, collect=False, indexed=False):
        super().__init__()
        self.inp, self.out = nn.Linear(8, WIDTH), nn.Linear(WIDTH, 4)
        self.blocks = nn.ModuleList(Block(i, (scales or {}).get(i, 1.0)) for i in range(BLOCKS))
        self.collect, self.indexed = collect, indexed

    def forward(self, x):
        h = self.inp(x)
        seen = []
        for i in range(BLOCKS) if self.indexed else range(len(self.blocks)):
            h = self.blocks[i](h)
            seen.append(h)
        return self.out(sum(seen) if self.collect else h)


def _traced(model: nn.Module, monkeypatch, *, stitched: bool) -> tuple[dict, list[bool]]:
    results: list[bool] = []
    real = stitch.stitch

    def spy(gm, **kwargs):
        results.append(real(gm, **kwargs))
        return results[-1]

    monkeypatch.setattr(capture, "stitch", spy)
    if not stitched:
        monkeypatch.setattr(capture, "_try_stitched_export", lambda m, i: None)
    graph = trace(model, (torch.randn(2, 8),))
    monkeypatch.undo()
    return canonical_graph(graph), results


def test_stitched_export_is_the_full_export_node_for_node(monkeypatch):
    model = Stack()
    stitched, used = _traced(model, monkeypatch, stitched=True)
    full, _ = _traced(model, monkeypatch, stitched=False)
    assert used == [True]
    assert stitched == full
    assert len(model.blocks) == BLOCKS and stitched["trace_method"] == "export"
    assert [n["module"] for n in stitched["nodes"] if n["module"].endswith(".down")] == [
        f"blocks.{i}.down" for i in range(BLOCKS)
    ]


def test_leading_unlike_blocks_are_exported_as_they_are_and_the_run_stitched(monkeypatch):
    """Three blocks unlike the rest (DeepSeek-V3's dense layers before its MoE ones), then six
    alike: six blocks are exported (three of the run) and three copied."""
    model = Stack()
    model.blocks = nn.ModuleList(Block(i, 2.0 if i < 3 else 1.0) for i in range(9))
    assert stitch.repeated_blocks(model)[2] == 6
    stitched, used = _traced(model, monkeypatch, stitched=True)
    full, _ = _traced(model, monkeypatch, stitched=False)
    assert used == [True]
    assert stitched == full
    assert [n["module"] for n in stitched["nodes"] if n["module"].endswith(".down")] == [
        f"blocks.{i}.down" for i in range(9)
    ]


def test_a_model_that_reads_every_block_is_exported_whole(monkeypatch):
    model = Stack(collect=True)
    stitched, used = _traced(model, monkeypatch, stitched=True)
    full, _ = _traced(model, monkeypatch, stitched=False)
    assert used == [False]
    assert stitched == full


def test_a_forward_that_indexes_every_block_is_exported_whole(monkeypatch):
    model = Stack(indexed=True)
    stitched, used = _traced(model, monkeypatch, stitched=True)
    full, _ = _traced(model, monkeypatch, stitched=False)
    assert used == []  # the truncated export failed; the full one ran
    assert stitched == full
    assert len(model.blocks) == BLOCKS


def test_blocks_that_differ_are_not_stitched():
    assert stitch.repeated_blocks(Stack(scales={4: 2.0})) is None


def test_a_layer_index_is_not_a_difference_even_where_it_equals_another_attribute():
    found = stitch.repeated_blocks(Stack())  # block 5: layer_idx == groups == 5, elsewhere they differ
    assert found is not None and found[0] == "blocks"


def test_an_attribute_equal_to_the_position_must_follow_it():
    a, b = Block(3), Block(4)
    a.width = 3  # equals a's position; b's width (16) does not equal b's position (4)
    assert not stitch._alike(stitch._signature(a), 3, stitch._signature(b), 4)


@pytest.mark.parametrize("count", [2, 5])
def test_short_stacks_are_exported_whole(count):
    model = Stack()
    model.blocks = nn.ModuleList(list(model.blocks)[:count])
    assert stitch.repeated_blocks(model) is None


def test_export_with_code_on_demand_is_the_same_graph_and_runs(monkeypatch):
    """capture._code_on_demand defers the exporter's code generation: the same graph node for node, and the
    captured module still runs (its code made on its first call) and computes what the model computes."""
    import contextlib

    model = Stack()
    deferred, _ = _traced(model, monkeypatch, stitched=False)
    monkeypatch.setattr(capture, "_code_on_demand", contextlib.nullcontext)
    eager, _ = _traced(model, monkeypatch, stitched=False)
    assert deferred == eager and deferred["trace_method"] == "export"
    x = torch.randn(2, 8)
    with capture._code_on_demand():
        program = torch.export.export(model, (x,), strict=False)
    torch.testing.assert_close(program.module()(x), model(x))
