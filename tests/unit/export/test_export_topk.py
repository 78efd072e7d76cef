"""Top-k sparsification (issue 36 item 3) in the four exports: no framework has it, and each export
says so in one sentence (DeepSpeed's compressed optimizers are sign quantisers; Accelerate takes the
hook as code)."""

import pytest
from synthetic import synthetic_gpt

from autoplan.export.api import export_plan
from autoplan.types import Plan

PLAN = Plan(
    devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, grad_compression="topk", topk_ratio=0.01
)


@pytest.mark.parametrize(
    "framework, words",
    [
        ("deepspeed", "grad_compression=topk (ratio 0.01) has no DeepSpeed switch"),
        ("megatron", "top-k sparsification (0.01): Megatron-LM has no gradient compression."),
        ("torchtitan", "top-k sparsification (0.01): torchtitan has no gradient compression."),
        ("accelerate", "model.register_comm_hook(TopKState(group=None, ratio=0.01), topk_hook)"),
    ],
)
def test_each_export_says_it_cannot_express_topk(framework, words):
    graph = synthetic_gpt(layers=2, hidden=64, heads=4, vocab=256, seq=32, batch=8)
    exported = export_plan(PLAN, to=framework, graph=graph)
    said = " ".join(" ".join(exported.unexpressed).split())
    assert words in said, said
