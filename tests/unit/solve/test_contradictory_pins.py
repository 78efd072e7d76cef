"""Pins of issue 34's options that no plan can take are one sentence naming the rule, not "no plan fits
in device memory": offload=full under a pipeline, offload with HSDP, a dp_replicate that does not divide
the pinned dp, and a recompute budget larger than the model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph

HOST = synthetic_host()
GRAPH = synthetic_gpt(layers=4, hidden=256, heads=4, vocab=1000, seq=128, batch=8)


@pytest.mark.parametrize(
    "fix, sentence",
    [
        ("offload=full,pp=2", "--fix offload=full with pp=2: FSDP2's CPU offload runs here without a pipeline"),
        ("offload=optimizer,dp_replicate=2", "--fix offload=optimizer with dp_replicate=2: the executor offloads"),
        ("dp_replicate=3,dp=4", "--fix dp_replicate=3 with dp=4: HSDP splits dp into dp_replicate groups"),
        ("dp_replicate=4,dp=4", "leave dp / dp_replicate >= 2; pin a divisor of 4 up to 2."),
        ("recompute_blocks=9,recompute=full", "--fix recompute_blocks=9 recomputes 9 blocks and this model has 4"),
        ("recompute_blocks=3/3,pp=2", "--fix recompute_blocks=3/3 recomputes 6 blocks and this model has 4"),
    ],
)
def test_a_pin_no_plan_can_take_is_one_sentence_naming_its_rule(fix, sentence):
    profile = replace(synthetic_profile(memory_bytes=80 * 2**30, devices_per_node=8), host=HOST)
    with pytest.raises(PlanError) as refused:
        plan_graph(GRAPH, devices=8, profile=profile, batch_size=8, fix=fix)
    assert sentence in str(refused.value) and "no plan fits" not in str(refused.value)
