"""Plan.schedule_steps exported (export/torchtitan.py, export/common.py): torchtitan says it as a local batch of one
schedule step's micro-batches under its global batch (its gradient accumulation steps), and reads it back;
Megatron-LM and DeepSpeed run every micro-batch of a step in one pipeline schedule and refuse it in one sentence."""

from __future__ import annotations

import pytest
import tomllib

import autoplan.trace
from autoplan.export import torchtitan as titan
from autoplan.export.api import export_plan
from autoplan.export.common import ExportError
from autoplan.types import Plan

STAGES = [["layers.0", "layers.1"], ["layers.2", "layers.3"]]


@pytest.fixture(scope="module")
def graph():
    return autoplan.trace.trace_model_file("examples/llama.py", 2)


def _plan(**changes) -> Plan:
    fields = dict(devices=4, dp=2, tp=1, pp=2, micro_batch_size=2, num_microbatches=8, schedule_steps=4,
                  precision="bf16", stages=STAGES)  # fmt: skip
    return Plan(**{**fields, **changes})


def test_torchtitan_accumulates_over_local_batches_of_one_schedule_step(graph):
    for steps, local in ((4, 2 * 2), (1, 2 * 8)):  # mbs x m / k
        text = export_plan(_plan(schedule_steps=steps), to="torchtitan", graph=graph, fmt="toml").text
        training = tomllib.loads(text)["training"]
        assert (training["local_batch_size"], training["global_batch_size"]) == (local, 2 * 2 * 8)
        back = titan.read(text, devices=4).plan()
        assert (back.num_microbatches, back.schedule_steps, back.micro_batch_size) == (8, steps, 2)


@pytest.mark.parametrize("framework, named", [("megatron", "Megatron-LM"), ("deepspeed", "DeepSpeed")])
def test_frameworks_with_one_schedule_per_step_refuse_it_in_one_sentence(graph, framework, named):
    with pytest.raises(ExportError) as caught:
        export_plan(_plan(), to=framework, graph=graph)
    said = str(caught.value)
    assert said.startswith(f"schedule_steps=4: {named} runs all 8 micro-batches") and "\n" not in said
    export_plan(_plan(schedule_steps=1), to=framework, graph=graph)
