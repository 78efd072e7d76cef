"""Skip connections between pipeline stages: carry values through the stages in between.

``torch.distributed.pipelining.PipelineStage`` receives only what the stage before it sends,
but the split that ``pipeline()`` exports can feed a stage from any earlier stage or from a
model input: rotary cos/sin tables computed once in the root ``forward`` and passed to every
block, attention masks, position ids, U-Net / DenseNet skips. With two chunks nothing lies in
between; with ``pp * virtual_stages > 2`` such a stage was called with too few arguments.

This rewrites every stage's fx graph so that, with boundary ``k`` between chunks ``k`` and
``k + 1``,

    live(k)          = values that are model inputs or made by a chunk <= k, and used by a
                       chunk > k (in one fixed order: model inputs, then by producing chunk)
    inputs of  k     = all model inputs (k = 0, as the schedule passes them) or live(k - 1)
    outputs of k     = live(k): its own outputs and, passed through unchanged, what it
                       received that a later chunk still needs (the last chunk is untouched)

A carried value is an identity in the chunks it passes, so in backward its gradient flows
back through them to the chunk that made it (or nowhere, for rotary tables and masks).
Only the stage modules change; ``pipe.split_gm``'s own forward is not used afterwards.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from autoplan.errors import PlanError


def carry_skip_values(split_gm: fx.GraphModule) -> list[fx.Node]:
    """Rewrite the stage modules of ``split_gm`` in place; return the split-graph values the last
    chunk receives, in the order of its placeholders. A value the model returns counts as used
    after the last chunk, so one made earlier (T5's ``encoder_last_hidden_state``) reaches it."""
    graph = split_gm.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    calls = stage_calls(split_gm)
    made_by = _producers(inputs, calls)
    last_use = {}
    for k, call in enumerate(calls):
        if call.kwargs:
            raise PlanError(f"pipeline stage {k} takes keyword arguments from the split; plan pp=1 for this model.")
        for arg in call.args:
            last_use[arg] = k
    for value in graph.output_node().all_input_nodes:
        last_use[value] = len(calls)
    order = list(inputs) + [v for v in made_by if v not in inputs]
    live = [[v for v in order if made_by[v] <= k < last_use.get(v, -1)] for k in range(len(calls) - 1)]
    stage_in = [list(inputs)] + live
    if all(list(call.args) == stage_in[k] and _plain_outputs(call, live, k) for k, call in enumerate(calls)):
        return stage_in[-1]
    for k, call in enumerate(calls):
        out_keys = live[k] if k < len(calls) - 1 else None
        _rewrite_stage(getattr(split_gm, call.target), call=call, in_keys=stage_in[k], out_keys=out_keys)
    return stage_in[-1]


def stage_calls(split_gm: fx.GraphModule) -> list[fx.Node]:
    """The split graph's stage calls in stage order (``submod_pp_<k>``), which the schedule runs them in. The graph
    may list them otherwise: a chunk that reads only an earlier chunk's value can come before a chunk between the
    two (SegFormer's decoder projects each encoder stage's output: stage 2 read stage 0's, and was called with stage
    1's outputs)."""
    calls = [n for n in split_gm.graph.nodes if n.op == "call_module"]
    return sorted(calls, key=lambda call: int(str(call.target).rpartition("_")[2]))


def _producers(inputs: list[fx.Node], calls: list[fx.Node]) -> dict[fx.Node, int]:
    """value node -> chunk that makes it (-1 for model inputs); a chunk's outputs are the call
    node itself (single output) or its getitem users."""
    made_by = {n: -1 for n in inputs}
    for k, call in enumerate(calls):
        made_by[call] = k
        for user in call.users:
            if user.op == "call_function" and user.target is operator.getitem:
                made_by[user] = k
    return made_by


def _plain_outputs(call: fx.Node, live: list[list[fx.Node]], k: int) -> bool:
    """Whether chunk k already outputs exactly live(k), in order."""
    if k >= len(live):
        return True
    getitems = sorted((u for u in call.users if u.target is operator.getitem), key=lambda u: u.args[1])
    outputs = getitems if getitems else [call]
    return outputs == live[k]


def _rewrite_stage(module: fx.GraphModule, *, call: fx.Node, in_keys: list, out_keys: list | None) -> None:
    graph = module.graph
    old = [n for n in graph.nodes if n.op == "placeholder"]
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        new = {key: graph.placeholder(f"carry_{i}_{key.name}") for i, key in enumerate(in_keys)}
    for placeholder, key in zip(old, call.args):
        placeholder.replace_all_uses_with(new[key])
        graph.erase_node(placeholder)
    if out_keys is not None:
        output = next(n for n in graph.nodes if n.op == "output")
        own = own_outputs(output, call)
        values = tuple(own[key] if key in own else new[key] for key in out_keys)
        output.args = (values[0] if len(values) == 1 else values,)
    graph.lint()
    module.recompile()


def own_outputs(output: fx.Node, call: fx.Node) -> dict:
    """split-graph value node -> this stage's graph node that produces it."""
    result = output.args[0]
    getitems = [u for u in call.users if u.target is operator.getitem]
    if not getitems:
        return {call: result}
    return {u: result[u.args[1]] for u in getitems}
