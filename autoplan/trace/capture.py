"""Capture the forward pass as a torch.fx GraphModule: torch.fx first, torch.export second.

``torch.fx.symbolic_trace`` keeps ``torch.nn`` modules (Linear, Embedding, LayerNorm, ...) as
single ``call_module`` nodes, which gives the planner one node per parameterised layer. It
fails on data-dependent Python control flow and on most Hugging Face models; then
``torch.export.export(..., strict=False)`` runs the real Python code on fake tensors and
returns an ATen-level graph whose nodes carry ``nn_module_stack``. Both run on a meta copy of
the weights. When both fail, :class:`TraceError` names the module and the operation that
failed and the source line, for each path.
"""

from __future__ import annotations

import contextlib
import io
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.fx

from autoplan.errors import TraceError
from autoplan.trace.cut_watch import watched_cut
from autoplan.trace.hints import META_HINT, data_dependent_hint, device_mismatch
from autoplan.trace.none_args import none_arguments
from autoplan.trace.stitch import repeated_blocks, stitch

try:  # a GraphModule whose Python code is generated only if asked for: the trace runs its nodes one by one
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModule  # GPT-3 175B: capture 0.26 -> 0.19 s
except ImportError:  # a torch without it: the code generated at once
    _GraphModule = torch.fx.GraphModule

_TORCH_DIR = str(Path(torch.__file__).parent)
_AUTOPLAN_DIR = str(Path(__file__).parent.parent)


@dataclass
class Captured:
    module: torch.fx.GraphModule
    method: str  # 'fx' or 'export'
    source_lines: bool = True  # an exported node's meta holds the stack it was traced from (_stack_traces)


@dataclass
class Failure:
    method: str
    module: str
    where: str
    message: str
    raised: str = ""  # where code that needs tensor values raised (raised_in), when that is what failed

    def sentence(self) -> str:
        module = f"in module '{self.module}'" if self.module else "in the top-level forward()"
        where = f" at {self.where}" if self.where else ""
        return f"{self.method} failed {module}{where}: {self.message}"


class _Tracer(torch.fx.Tracer):
    """symbolic_trace's tracer, remembering the innermost module a failure happened in."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_module: str | None = None

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """torch's own layers (Linear, LSTM, ...) are leaves, as symbolic_trace keeps them; torch's own modules
        built of other modules are not (nn.Transformer, nn.TransformerEncoderLayer, nn.MultiheadAttention): as one
        node they hid their blocks (nn.Transformer planned with none) and their attention from the planner."""
        return super().is_leaf_module(m, module_qualified_name) and next(m.children(), None) is None

    def call_module(self, m, forward, args, kwargs):
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_module is None:
                self.failed_module = _path_or_empty(self, m)
            raise


def _path_or_empty(tracer: torch.fx.Tracer, module: torch.nn.Module) -> str:
    try:
        return tracer.path_of_module(module)
    except Exception:
        return ""


def capture(model: torch.nn.Module, meta_inputs: tuple, *, model_name: str, source_lines: bool = True) -> Captured:
    """The forward graph of ``model`` (already on meta) for positional ``meta_inputs``; without
    ``source_lines`` an exported graph's nodes carry no ``stack_trace`` (:func:`_stack_traces`)."""
    fx_failure = _try_fx(model, meta_inputs)
    if isinstance(fx_failure, Captured):
        return fx_failure
    with _code_on_demand(), _stack_traces(source_lines):
        export_result = _try_export(model, meta_inputs)
    if isinstance(export_result, Captured):
        export_result.source_lines = source_lines
        return export_result
    raise TraceError(
        f"could not trace {model_name}: {fx_failure.sentence()}; {export_result.sentence()}. "
        + (META_HINT if device_mismatch(export_result.message) else "")
        + (f"The export {data_dependent_hint(export_result.raised)} " if export_result.raised else "")
        + "Make the failing code traceable (no Python branching on tensor values, static shapes) "
        "or move it out of forward()."
    )


def _try_fx(model: torch.nn.Module, inputs: tuple) -> Captured | Failure:
    tracer = _Tracer()
    found = _attributes(model)
    try:
        graph = tracer.trace(model, concrete_args=none_arguments(model, inputs) or None)
    except Exception as exc:
        return Failure("torch.fx", tracer.failed_module or "", user_line(exc), first_line(exc))
    finally:
        _put_back(found)
    return Captured(_GraphModule(tracer.root, graph, type(model).__name__), "fx")


#: a module's own tables, which symbolic tracing leaves alone
_TABLES = ("_parameters", "_buffers", "_modules")


def _attributes(model: torch.nn.Module) -> list[tuple[torch.nn.Module, dict]]:
    """Each module's plain attributes (what ``vars()`` holds besides its tables) before torch.fx runs forward()."""
    return [(module, {k: v for k, v in vars(module).items() if k not in _TABLES}) for module in model.modules()]


def _put_back(found: list[tuple[torch.nn.Module, dict]]) -> None:
    """Undo what forward() assigned to its modules while torch.fx ran it: Meta's original Llama code does
    ``self.freqs_cis = self.freqs_cis.to(h.device)``, which left a Proxy in the model where the graph reads the
    table ("internal error: AttributeError: ... '_tensor_constant0'"), or, when fx then failed, in the model
    torch.export traced next ("Found <class 'torch.fx.proxy.Proxy'> in output"). An attribute forward() added is
    dropped when it holds a Proxy; the constants fx itself stores on the root are kept."""
    for module, before in found:
        for key, value in list(vars(module).items()):
            if key in before and key not in _TABLES and value is not before[key]:
                setattr(module, key, before[key])
            elif key not in before and key not in _TABLES and isinstance(value, torch.fx.Proxy):
                delattr(module, key)


def _try_export(model: torch.nn.Module, meta_inputs: tuple) -> Captured | Failure:
    stitched = _try_stitched_export(model, meta_inputs)
    if stitched is not None:
        return stitched
    stack: list[str] = []
    try:
        with _module_stack(model, stack), _pytree_outputs(model), _quiet_logs():
            program = torch.export.export(model, meta_inputs, strict=False)
        return Captured(_without_region_checks(program.module()), "export")
    except Exception as exc:
        return _export_failure("torch.export (non-strict)", stack, exc)


def _export_failure(method: str, stack: list[str], exc: BaseException) -> Failure:
    """The export's failure: the innermost module running, the user's line, and where code that needs tensor
    values raised, when that is what stopped it."""
    raised = raised_in(exc, torch_modules_first=True) if data_dependent(exc) else ""
    return Failure(method, stack[-1] if stack else "", user_line(exc), first_line(exc), raised)


#: what torch.export writes after a ``.to()`` (the dtype and device as exported: meta); it returns nothing
EXPORT_CHECKS = (torch.ops.aten._assert_tensor_metadata.default,)


def _without_region_checks(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` without torch.export's metadata checks inside its regions' bodies (the submodule graphs a
    ``torch.no_grad()`` or ``torch.autocast`` region runs as a higher-order op). The graph is propagated on CPU fake
    tensors (trace/tensors.py) where export ran on meta, and a region's op runs its body whole, so a ``.to(dtype)``
    in a ``@torch.no_grad()`` rotary embedding failed the trace ("Tensor device mismatch! Expected: meta"); the top
    graph's own checks are classified and never run (trace/classify.py). Eager code never runs any of them."""
    drop_export_checks(module, top=False)
    return module


def drop_export_checks(module: torch.nn.Module, *, top: bool = True) -> int:
    """Remove torch.export's metadata checks from ``module``'s graphs (with ``top``, its own graph's too); return
    how many. Eager code never runs them; DTensor has no sharding strategy for them, so under tp a pipeline stage
    whose model calls ``.to()`` was refused ("aten._assert_tensor_metadata.default does not have a sharding
    strategy registered"); and in a region's body they fail the trace (:func:`_without_region_checks`)."""
    dropped = 0
    for name, sub in module.named_modules():
        if not isinstance(getattr(sub, "graph", None), torch.fx.Graph) or (not top and not name):
            continue
        checks = [n for n in sub.graph.nodes if n.op == "call_function" and n.target in EXPORT_CHECKS and not n.users]
        for node in checks:
            sub.graph.erase_node(node)
        # a block torch.export unflattened (``InterpreterModule``) runs its graph, or the code of its graph_module
        compiled = sub if isinstance(sub, torch.fx.GraphModule) else getattr(sub, "graph_module", None)
        if checks and compiled is not None:
            compiled.recompile()
        dropped += len(checks)
    return dropped


def _try_stitched_export(model: torch.nn.Module, meta_inputs: tuple) -> Captured | Failure | None:
    """Export with the first few repeated blocks and stitch the rest (autoplan/trace/stitch.py);
    None when the model has no such blocks or refuses the shortcut: the full export follows.
    A failure is final, and its :class:`Failure` returned, when the full export would stop at the
    same op after running every block (a minute on a large model): one on data-dependent shapes
    (the full export runs the same code: the blocks before the cut and everything around them),
    or any other where the model cannot tell the cut from the whole (trace/cut_watch.py)."""
    found = repeated_blocks(model)
    if found is None:
        return None
    name, container, kept = found
    blocks = list(container)
    stack: list[str] = []
    try:
        with watched_cut(model, name, kept) as watch, _module_stack(model, stack), _pytree_outputs(model):
            with _quiet_logs():
                program = torch.export.export(model, meta_inputs, strict=False)
    except Exception as exc:
        if not (data_dependent(exc) or (watch.same_failure() and not indexed_a_container(exc))):
            return None
        cut = f" (the model cut to its first {kept} of {len(blocks)} blocks '{name}', which the whole model runs alike)"
        return _export_failure("torch.export (non-strict)" + cut, stack, exc)
    module = _without_region_checks(program.module())
    return Captured(module, "export") if stitch(module, prefix=name, blocks=blocks, kept=kept) else None


def indexed_a_container(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or one it came from) was raised inside an nn container's own code (ModuleList's index,
    ModuleDict's key): the cut, not the model, may be what failed (a loop over ``range(num_experts)`` indexing a
    ModuleList cut to 3 of 16). The watch does not see every such index under the exporter (tests/odd_models/
    loop_moe.py), so the traceback decides."""
    while exc is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        if any(Path(f.filename).parts[-3:] == ("nn", "modules", "container.py") for f in frames):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def data_dependent(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it came from) is a guard or an output size that depends
    on tensor values, which no export of the same code can get past."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    kinds = (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)
    while exc is not None:
        if isinstance(exc, kinds):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def _module_stack(model: torch.nn.Module, stack: list[str]) -> Iterator[None]:
    """Keep ``stack`` equal to the FQNs of the modules whose forward is running; a failure leaves
    the failing module on top."""
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
        handles.append(module.register_forward_hook(lambda m, a, o: _pop(stack)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _code_on_demand() -> Iterator[None]:
    """The exporter's graph modules generate their Python code when first called or read, not each
    time a pass replaces their graph (``torch.fx._lazy_graph_module``, as torch.compile uses them).
    The trace never calls them (propagation runs the graph node by node, autoplan.trace.propagate):
    on DeepSeek-V3's six exported blocks, 5 of the exporter's 10 code generations, ~0.1 s. The graph
    is the same; a torch without the switch exports as before."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        yield
        return
    with _use_lazy_graph_module(True):
        yield


@contextlib.contextmanager
def _stack_traces(enabled: bool) -> Iterator[None]:
    """torch.export records, for each node it creates, the Python stack it came from (``stack_trace``:
    a traceback extracted and symbolized per node). The trace reads it only to name the source line
    of a node that fails on fake tensors (autoplan.trace.propagate); off, DeepSeek-V3's export of six
    blocks takes 1.1-1.3 s of user CPU instead of 1.8-1.9 s, and trace() exports again with it on
    when a node fails (autoplan.trace.api). ``torch.fx.config.do_not_emit_stack_traces`` is torch's
    switch for it (torch 2.13 has it); a torch without it records them as before. The graph is the same."""
    config = torch.fx.config
    if not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    before = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = not enabled
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """torch.export logs the whole partial graph on a failure; the TraceError says what matters."""
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _pop(stack: list[str]) -> None:
    if stack:
        stack.pop()


@contextlib.contextmanager
def _pytree_outputs(model: torch.nn.Module) -> Iterator[None]:
    """Drop values torch.export cannot return (a Hugging Face cache object) from a dict-like output."""
    handle = model.register_forward_hook(lambda m, a, out: _tensor_fields(out))
    try:
        yield
    finally:
        handle.remove()


def _tensor_fields(out: Any) -> Any:
    if not isinstance(out, dict):
        return out
    kept = {k: v for k, v in out.items() if v is None or isinstance(v, (torch.Tensor, tuple, list))}
    if len(kept) == len(out):
        return out
    try:
        return type(out)(**kept)
    except Exception:
        return kept


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception message, shortened, with its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > 240:  # at a word's end, marked (a trailing "..." was stripped with the full stop: "can b")
        text = text[:230].rsplit(" ", 1)[0].rstrip(",;:") + " (...)"
    return f"{type(exc).__name__}: {text}".rstrip(": ").rstrip(".")


def user_line(exc: BaseException | None) -> str:
    """'file.py:LINE (`code`)' for the innermost traceback frame outside torch and autoplan,
    looking through the exception's causes."""
    while exc is not None:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user(f.filename)]
        if frames:
            return _frame_text(frames[-1])
        exc = exc.__cause__ or exc.__context__
    return ""


def raised_in(exc: BaseException, *, torch_modules_first: bool = False) -> str:
    """'raised in FILE:LINE (function)' for the code that raised ``exc``: its innermost user frame, else its
    innermost frame in torch.nn's modules (nn.Transformer's own check of a mask), else 'raised inside torch';
    ``torch_modules_first``: the innermost of both (an export runs the user's forward around torch's modules)."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if _is_user(f.filename)]
    modules = [f for f in frames if Path(f.filename).parts[-4:-2] == ("nn", "modules") or "/nn/modules/" in f.filename]
    if torch_modules_first:
        user = [f for f in frames if f in user or f in modules]
    frame = (user or modules or [None])[-1]
    if frame is None:
        return "raised inside torch"
    return f"raised in {Path(frame.filename).name}:{frame.lineno} ({frame.name})"


def stack_trace_line(stack_trace: str | None) -> str:
    """The innermost user frame of an fx node's recorded ``stack_trace``."""
    if not stack_trace:
        return ""
    frames = traceback.StackSummary.from_list([])
    entries = [line.strip() for line in stack_trace.splitlines()]
    for i, line in enumerate(entries):
        if line.startswith("File "):
            parts = line.split('"')
            if len(parts) >= 3 and _is_user(parts[1]):
                lineno = line.split("line ")[-1].split(",")[0]
                code = entries[i + 1] if i + 1 < len(entries) and not entries[i + 1].startswith("File ") else ""
                frames.append(traceback.FrameSummary(parts[1], int(lineno) if lineno.isdigit() else 0, "", line=code))
    return _frame_text(frames[-1]) if frames else ""


def _is_user(filename: str) -> bool:
    return not (filename.startswith(_TORCH_DIR) or filename.startswith(_AUTOPLAN_DIR) or filename.startswith("<"))


def _frame_text(frame: traceback.FrameSummary) -> str:
    code = f" (`{frame.line.strip()}`)" if frame.line else ""
    return f"{Path(frame.filename).name}:{frame.lineno}{code}"
