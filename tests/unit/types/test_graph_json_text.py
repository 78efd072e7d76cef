"""Graph.json_text (types/graph.py): graph.json's text, the one write_json_atomic writes of ``to_dict``, made
once per Graph. A graph read back from it (Graph.from_json_text: the trace cache's) keeps it, and that is
the text its own ``to_dict`` gives; a graph made from another (``dataclasses.replace``: --touched-rows,
a runtime's fused graph) makes its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic.graphs import gpt_graph

from autoplan.types._check import json_file_text
from autoplan.types.graph import Graph


def _mixtral() -> Graph:
    pytest.importorskip("transformers")
    from synthetic.moe import mixtral_graph

    return mixtral_graph()


GRAPHS = {"gpt": gpt_graph, "mixtral": _mixtral}  # a traced MoE graph has moe_layers, inputs and attrs


@pytest.mark.parametrize("name", GRAPHS)
def test_the_text_is_write_json_atomics_of_to_dict(name, tmp_path):
    graph = GRAPHS[name]()
    assert graph.json_text() == json_file_text(graph.to_dict())
    assert graph.json_text() is graph.json_text()  # made once
    assert graph.save(tmp_path / "graph.json").read_text() == json_file_text(graph.to_dict())


@pytest.mark.parametrize("name", GRAPHS)
def test_a_graph_read_from_its_text_gives_that_text(name):
    text = GRAPHS[name]().json_text()
    read = Graph.from_json_text(text)
    assert json_file_text(read.to_dict()) == text  # what it wrote before it kept the text
    assert read.json_text() is text and read == Graph.from_dict(read.to_dict())


def test_a_graph_made_from_another_has_its_own_text():
    graph = gpt_graph()
    before = graph.json_text()
    first = graph.nodes[1]
    name, info = next(iter(graph.parameters.items()))
    variants = [
        replace(graph, batch_size=graph.batch_size * 2),
        replace(graph, model_name="other"),
        replace(graph, parameters={**graph.parameters, name: replace(info, touched_rows=7)}),
        replace(graph, nodes=[graph.nodes[0], replace(first, fwd_flops=first.fwd_flops + 1), *graph.nodes[2:]]),
        replace(graph, nodes=[graph.nodes[0], replace(first, attrs={**first.attrs, "x": 1}), *graph.nodes[2:]]),
        Graph.from_json_text(before.replace('"batch_size": 8', '"batch_size": 4', 1)),
    ]
    for variant in variants:
        assert variant.json_text() == json_file_text(variant.to_dict()) != before
    assert graph.json_text() is before
