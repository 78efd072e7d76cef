"""``trace(model, example_inputs) -> Graph``: the tracer's public entry points.

Pipeline: swap the weights for meta tensors -> capture a GraphModule (torch.fx, else
torch.export non-strict) -> swap them for CPU FakeTensors -> run node by node, measuring
FLOPs, bytes and saved activations (autoplan.trace.propagate) -> run the loss the same way
-> dataflow annotations (autoplan.trace.dataflow) -> blocks and groups (autoplan.trace.layers).
No step allocates a real weight or activation; the caller's model is left as it was.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._mode_utils import no_dispatch

from autoplan.errors import AutoplanError, ModelFileError, TraceError
from autoplan.modelfile import ModelFile, default_loss, load_model_file
from autoplan.trace import dataflow, moe
from autoplan.trace.batch_coupling import coupled_output
from autoplan.trace.batch_dims import check_batch_dims
from autoplan.trace.build import build_graph, canonical_names, seq_len_of
from autoplan.trace.capture import capture, first_line
from autoplan.trace.dataclass_outputs import dataclass_outputs_known
from autoplan.trace.propagate import Measured, NodeFailure, Propagator
from autoplan.trace.sequence_mixing import LossMixing
from autoplan.trace.tensors import map_tensors, swapped, to_meta, training_mode
from autoplan.trace.windows import annotate_windows
from autoplan.types.graph import Graph
from autoplan.types.inputs import input_specs
from autoplan.types.moe import RoutingModel


@contextlib.contextmanager
def _grad_mode(enabled: bool):
    """Restore autograd's global mode on the way out, whatever the traced code left it as."""
    try:
        yield
    finally:
        torch.set_grad_enabled(enabled)


@contextlib.contextmanager
def _onednn_on():
    """oneDNN on while tracing, as a CPU run has it: torch picks an RNN's ops by it (``mkldnn_rnn_layer`` with it,
    native ops without), and execute/precision.py turns it off for a process whose CPU lacks a low dtype's
    kernels, so a graph does not depend on what ran in this process before."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = torch.backends.mkldnn.is_available()
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


def trace(
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Callable | None = None,
    target: Any = None,
    model_name: str = "model",
    routing: RoutingModel | None = None,
) -> Graph:
    """Trace one training step of ``model`` on ``example_inputs`` (one global batch) into a Graph."""
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"trace() needs a torch.nn.Module; got {type(model).__name__}.")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not inputs:
        raise TraceError(
            f"example_inputs must be a non-empty tuple of forward() arguments; got {type(example_inputs).__name__}."
        )
    step = dict(inputs=tuple(inputs), loss_fn=loss_fn, target=target, model_name=model_name)
    step["routing"] = routing or RoutingModel()
    try:
        return _traced(model, **step, source_lines=False)
    except _Unplaced:  # a node failed on fake tensors: export again with stack traces to name its source line
        return _traced(model, **step, source_lines=True)


class _Unplaced(Exception):
    """A node of an export without stack traces failed (capture.py, _stack_traces)."""


def _traced(
    model: torch.nn.Module,
    *,
    inputs: tuple,
    loss_fn: Callable | None,
    target: Any,
    model_name: str,
    routing: RoutingModel,
    source_lines: bool,
) -> Graph:
    """trace()'s work; an exported graph's nodes carry their source lines only with ``source_lines``."""
    batch = _batch_size(inputs)
    grad_mode = torch.is_grad_enabled()  # an op that fails inside a set_grad_enabled region must not leak it
    with (
        training_mode(model),
        swapped(model, to_meta),
        moe.routed(model, routing) as log,
        _grad_mode(grad_mode),
        _onednn_on(),
        dataclass_outputs_known(model),  # torch.export flattens the output
    ):
        meta_inputs = tuple(map_tensors(inputs, to_meta))
        captured = capture(model, meta_inputs, model_name=model_name, source_lines=source_lines)
        _move_meta_constants(captured.module)
        with FakeTensorMode() as mode:
            fake = _faker(mode)
            fake_in = map_tensors(inputs, fake)
            fake_target = map_tensors(target, fake)
            with swapped(captured.module, fake, make_param=_faker(mode, parameter=True)):
                try:
                    loss = loss_fn or _default_loss
                    records = _run(captured.module, fake_in, fake_target, loss, canonical_names(model))
                except NodeFailure as exc:
                    if captured.source_lines:
                        raise
                    raise _Unplaced() from exc
        dataflow.annotate(records, model)
        annotate_windows(records, model)
        graph = build_graph(
            records,
            model=model,
            model_name=model_name,
            batch_size=batch,
            trace_method=captured.method,
            seq_len=seq_len_of(inputs),
        )
        graph.inputs = input_specs(inputs, batch_size=batch)  # for parallelize's micro-batch (types/inputs.py)
        tokens = batch * (graph.seq_len or 1)
        graph.moe_layers = moe.describe(model, records, routing=routing, log=log, tokens=tokens, blocks=graph.layers)
        moe.keep_list_layers_whole(graph)
    return graph


def _built_on_meta(model_file: ModelFile) -> torch.nn.Module:
    """``build_model()`` under the meta device; a build that needs real values there (an orthogonal
    parametrization's ``.item()``) is refused with what autoplan does and what to change."""
    try:
        return model_file.build()
    except ModelFileError as exc:
        if "meta" not in str(exc):
            raise
        raise ModelFileError(
            f"{str(exc).rstrip('.')}: autoplan builds the model on the meta device, to plan without allocating its "
            "weights; build what needs real values on the CPU inside build_model() (`with torch.device('cpu'):`), or "
            "make it run on meta."
        ) from exc


def trace_model_file(
    path: str | Path,
    batch_size: int,
    *,
    routing: RoutingModel | None = None,
    load: Callable[[str | Path], ModelFile] | None = None,
) -> Graph:
    """Load a model file (with ``load``, else ``load_model_file``: the CLI imports it with the GC paused,
    cli/startup.py), build its model and inputs on the meta device, and trace them."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise AutoplanError(f"batch size {batch_size!r} is not a positive integer; pass --batch B with B >= 1.")
    model_file = (load or load_model_file)(path)
    with torch.device("meta"):
        model = _built_on_meta(model_file)
        inputs = model_file.inputs(batch_size)
        target = model_file.target(batch_size)
    check_batch_dims(model_file, batch_size, inputs, target)
    loss = model_file.loss if model_file.loss_fn is not None else None
    graph = trace(model, inputs, loss_fn=loss, target=target, model_name=model_file.name, routing=routing)
    graph.model_sha256 = model_file.sha256
    graph.batch_coupled = coupled_output(model, model_file, graph)
    return graph


def _default_loss(output: Any, target: Any) -> torch.Tensor:
    """No loss_fn: the mean of the output (modelfile.default_loss), ignoring the target."""
    return default_loss(output)


def _batch_size(inputs: Any) -> int:
    """Dim 0 of the first tensor among the inputs, looking inside tuples, lists and dicts (a forward() that takes
    one dict of tensors), as the executor's batch split does (execute/batch.py)."""
    for value in torch.utils._pytree.tree_leaves(tuple(inputs)):
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    raise TraceError(
        "example_inputs holds no tensor with a batch dimension; the first dim of the first tensor input is the batch."
    )


def _faker(mode: FakeTensorMode, *, parameter: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """tensor -> an uninitialised CPU FakeTensor of the same shape and dtype, made as ``torch.empty``
    under ``mode`` makes it (a fresh contiguous meta tensor wrapped by the mode's converter),
    without dispatching an op per parameter. With ``parameter``, the FakeTensor that
    ``nn.Parameter(fake(t), t.requires_grad)`` returns (a leaf marked ``_is_param``, which
    ``isinstance(x, nn.Parameter)`` reads), made directly: the Parameter's ``detach`` dispatched
    through the fake mode (~0.15 ms a parameter, 0.1-0.2 s on DeepSeek-V3); the converter's memo
    of the fresh meta tensor is never read, as in trace/memo.py's replay."""
    cpu = torch.device("cpu")

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        with no_dispatch():
            meta = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")
        if parameter:
            return FakeTensor(mode, meta, cpu, requires_grad=tensor.requires_grad, _is_param=True)
        return mode.fake_tensor_converter.from_meta_and_device(mode, meta, cpu).requires_grad_(tensor.requires_grad)

    return fake


def _move_meta_constants(gm: torch.fx.GraphModule) -> None:
    """torch.export bakes the capture device (meta) into factory calls and ``.to(device)``; propagation runs on CPU
    fakes. The top graph's nodes change without its code regenerated: propagation runs it node by node
    (autoplan.trace.propagate), never the generated code (about 0.5 s on a 10k-node graph; stitching,
    autoplan.trace.stitch, leaves it stale the same way). A region's body (a ``@torch.no_grad()`` or autocast
    submodule graph, run whole by its higher-order op) is recompiled: HF M2M100's position embedding moved its
    positions ``.to(input_ids.device)``, baked as meta, beside CPU fakes."""
    for name, sub in gm.named_modules():
        if isinstance(getattr(sub, "graph", None), torch.fx.Graph) and _meta_to_cpu(sub.graph) and name:
            sub.recompile()


def _meta_to_cpu(graph: torch.fx.Graph) -> bool:
    """Each node's meta device argument made cpu; whether any was."""
    meta, cpu = torch.device("meta"), torch.device("cpu")
    found: list[bool] = []

    def fix(value: Any) -> Any:
        if (isinstance(value, torch.device) and value == meta) or (isinstance(value, str) and value == "meta"):
            found.append(True)
            return cpu if isinstance(value, torch.device) else "cpu"
        return value

    changed = False
    for node in graph.nodes:
        found.clear()
        args, kwargs = torch.fx.node.map_aggregate(node.args, fix), torch.fx.node.map_aggregate(node.kwargs, fix)
        if found:
            node.args, node.kwargs, changed = args, kwargs, True
    return changed


def _run(
    gm: torch.fx.GraphModule, inputs: tuple, target: Any, loss_fn: Callable, canonical: dict[str, str]
) -> list[Measured]:
    prop = Propagator(gm, canonical)
    codegen = gm.graph._codegen
    pytree = isinstance(codegen, torch.fx.graph._PyTreeCodeGen)
    flat = list(torch.utils._pytree.tree_leaves((tuple(inputs), {}))) if pytree else list(inputs)
    records: list[Measured] = []
    outputs = None
    with prop.counter:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                value = flat.pop(0) if flat else (node.args[0] if node.args else None)
                records.append(prop.placeholder(node, value))
            elif node.op == "output":
                outputs = torch.fx.node.map_arg(node.args[0], lambda n: prop.env.get(n))
                if pytree and codegen.pytree_info.out_spec is not None:
                    outputs = torch.utils._pytree.tree_unflatten(list(outputs), codegen.pytree_info.out_spec)
                records.append(_output_record(node, prop, outputs))
            else:
                record = prop.run_node(node)
                if record is not None:
                    records.append(record)
        taken = {r.name for r in records}
        records.append(
            _loss_record(prop, loss_fn, outputs, target, records[-1].name, "loss" if "loss" not in taken else "loss_fn")
        )
    prop.finish(records)
    return records


def _output_record(node: torch.fx.Node, prop: Propagator, outputs: Any) -> Measured:
    from autoplan.trace.propagate import _input_names, _tensors

    return Measured(
        name=node.name,
        node=node,
        kind="output",
        op_name="output",
        target="output",
        module="",
        inputs=_input_names(node),
        params=[],
        outputs=_tensors(outputs),
    )


#: what fake tensors raise for an op whose output shape depends on its values (aten._ctc_loss) or that has no fake
#: kernel at all
NO_FAKE_KERNEL = (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException)
UNMEASURED = "unmeasured"  # the loss node's attribute naming the op the trace could not run


def _loss_node(name: str, loss_fn: Callable, after: str, loss: torch.Tensor, **measured: Any) -> Measured:
    """The loss's record: ``loss`` its output, ``measured`` its FLOPs or attributes."""
    target = getattr(loss_fn, "__name__", "loss_fn")
    return Measured(name=name, node=None, kind="loss", op_name="loss", target=target, module="", inputs=[after],
                    params=[], outputs=[loss], **measured)  # fmt: skip


def _loss_record(prop: Propagator, loss_fn: Callable, outputs: Any, target: Any, after: str, name: str) -> Measured:
    mixing = LossMixing()  # what the loss shifts or slices along (types/context_parallel.py)
    try:
        with mixing:
            loss, fwd, bwd = prop.measure(
                name=name, node=None, fn=loss_fn, args=(outputs, target), kwargs={}, extra_params=[]
            )
    except AutoplanError:
        raise
    except NO_FAKE_KERNEL as exc:  # CTC's aten._ctc_loss: its output shape depends on the target lengths' values
        # a node of no FLOPs, marked for the command to say: a pass or two over the logits, run for real in `run`
        op = str(getattr(exc, "func", "") or first_line(exc))
        return _loss_node(name, loss_fn, after, torch.empty((), device="meta"), attrs={UNMEASURED: op})
    except Exception as exc:
        raise TraceError(
            f"the loss function failed on the model's output: {first_line(exc)}; "
            "check loss_fn(output, target) and example_target()."
        ) from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TraceError(f"the loss function returned {type(loss).__name__}; expected a scalar tensor.")
    attrs = {"mixes": sorted(mixing.sizes)} if mixing.sizes else {}
    return _loss_node(name, loss_fn, after, loss, fwd_flops=int(fwd), bwd_flops=int(bwd), attrs=attrs)
