"""A forward's ``torch.no_grad()`` regions kept through torch's pipeline split (docs/executor.md, "No-grad regions").

``torch.export`` keeps a region of forward() run under ``torch.no_grad()`` (a spectral norm's power iteration, a
running mean updated in place, a statistic taken without gradient) as a higher-order op,
``wrap_with_set_grad_enabled(False, submod_N, ...)``, whose body is a submodule the graph reads by name
(``get_attr``). torch's pipeline split (2.13, ``_IR.Pipe._from_traced``) rebuilds each stage's graph into the
model's nested modules (``_unflatten._outline_submodules``), and that rebuild lost the bodies two ways: it copies
parameters and buffers into the rebuilt modules but no submodule read by name, so the stage's graph named one it
did not hold ("Node submod_1 target submod_1 references nonexistent attribute"); and the ``get_attr`` export puts
at the top of the graph, tagged with the region's module, opened that module's call a second time with no input
("Expected positional argument for parameter x"). :func:`regions_kept` wraps the rebuild: each body's read moves
to just before its region, in its region's module, and once torch's rebuild has run, each rebuilt module is given
the bodies its graph reads; the graph is then checked as torch checks it. The region runs as in the model: the same
op and body, grad mode off inside.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.fx as fx
import torch.nn as nn

try:  # torch 2.13's split; another torch splits without this repair
    from torch.distributed.pipelining import _IR
except ImportError:  # pragma: no cover
    _IR = None


@contextlib.contextmanager
def regions_kept() -> Iterator[None]:
    """While torch's ``pipeline()`` runs, its stage rebuild keeps the no-grad regions' bodies (module docstring)."""
    outline = getattr(_IR, "_outline_submodules", None)
    if outline is None:
        yield
        return
    _IR._outline_submodules = lambda graph: _outline_keeping_bodies(graph, outline)
    try:
        yield
    finally:
        _IR._outline_submodules = outline


def _outline_keeping_bodies(graph: fx.Graph, outline) -> fx.GraphModule:
    """torch's ``outline(graph)``, each region's body read where its region runs and held by the module that reads
    it (module docstring)."""
    bodies = _bodies(graph)
    if not bodies:
        return outline(graph)
    for node in list(graph.nodes):
        if node.op == "get_attr" and node.target in bodies and len(node.users) == 1:
            user = next(iter(node.users))
            if "nn_module_stack" in user.meta:
                node.meta["nn_module_stack"] = user.meta["nn_module_stack"]
            user.prepend(node)
    with _lint_after():
        rebuilt = outline(graph)
    for module in rebuilt.modules():
        held = getattr(module, "graph", None)  # a GraphModule or torch's InterpreterModule
        for node in held.nodes if isinstance(held, fx.Graph) else ():
            if node.op == "get_attr" and node.target in bodies and not hasattr(module, node.target):
                module.register_module(node.target, bodies[node.target])
    rebuilt.graph.lint()
    return rebuilt


def _bodies(graph: fx.Graph) -> dict[str, nn.Module]:
    """The submodules ``graph`` reads by name (get_attr): the no-grad regions' bodies."""
    owner = graph.owning_module
    found = {node.target: getattr(owner, node.target, None) for node in graph.nodes if node.op == "get_attr"}
    return {name: module for name, module in found.items() if isinstance(module, nn.Module)}


@contextlib.contextmanager
def _lint_after() -> Iterator[None]:
    """torch's rebuild checks its graph before the bodies are in place; :func:`_outline_keeping_bodies` checks it
    after."""
    lint = fx.Graph.lint
    fx.Graph.lint = lambda self: None
    try:
        yield
    finally:
        fx.Graph.lint = lint
