"""Which modules the tracer makes blocks, the units a pipeline places on stages: repeated blocks
where a container holds them, else the top-level modules when forward() calls each once."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autoplan.trace import trace


class TwoParts(nn.Module):
    """The textbook pipeline example: two unlike Linears."""

    def __init__(self):
        super().__init__()
        self.part1, self.part2 = nn.Linear(100, 10), nn.Linear(10, 10)

    def forward(self, x):
        return self.part2(torch.relu(self.part1(x)))


class Wrapped(nn.Module):
    """One child holding every parameter: the tracer looks through it."""

    def __init__(self):
        super().__init__()
        self.net = TwoParts()

    def forward(self, x):
        return 2 * self.net(x)


class CalledTwice(nn.Module):
    """``a`` runs again right after itself (no op of the parent between the two calls)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(100, 100), nn.Linear(100, 10)

    def forward(self, x):
        return self.b(self.a(self.a(x)))


class CalledAround(nn.Module):
    """``a`` runs before and after ``b``: no boundary between them is one cut."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(100, 100), nn.Linear(100, 100)

    def forward(self, x):
        return self.a(self.b(self.a(x)))


class OneUnused(nn.Module):
    """``spare`` holds parameters forward() never uses: no block, the other two are."""

    def __init__(self):
        super().__init__()
        self.a, self.spare, self.b = nn.Linear(100, 10), nn.Linear(3, 3), nn.Linear(10, 10)

    def forward(self, x):
        return self.b(self.a(x))


class BlocksAndModules(nn.Module):
    """Repeated blocks in a ModuleList between two projections: the blocks, as before."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(100, 32), nn.Linear(32, 10)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32)) for _ in range(3))

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.out(h)


@pytest.mark.parametrize(
    "model, blocks",
    [
        (TwoParts(), ["part1", "part2"]),
        (Wrapped(), ["net.part1", "net.part2"]),
        (CalledTwice(), []),
        (CalledAround(), []),
        (OneUnused(), ["a", "b"]),
        (BlocksAndModules(), ["layers.0", "layers.1", "layers.2"]),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else None,
)
def test_blocks_are_repeated_blocks_else_top_level_modules_called_once(model, blocks):
    graph = trace(model, (torch.randn(4, 100),))
    assert graph.layers == blocks
    assert sum(len(group.layers) for group in graph.groups) == len(blocks)
    for name in blocks:  # every parameter of a block is on one of its nodes
        held = {p for node in graph.nodes if node.layer == name for p in node.param_names}
        assert held == {n for n in graph.parameters if n.startswith(name + ".")}


class NamedBlocks(torch.nn.Module):
    """Blocks held by name in an nn.ModuleDict: not found before, so a pipeline put them all on one stage."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleDict({name: torch.nn.Linear(8, 8) for name in ("a", "b", "c", "d")})

    def forward(self, x):
        for layer in self.layers.values():
            x = torch.relu(layer(x))
        return x


def test_blocks_in_a_module_dict_are_found_by_name():
    assert trace(NamedBlocks(), (torch.randn(2, 8),)).layers == ["layers.a", "layers.b", "layers.c", "layers.d"]
