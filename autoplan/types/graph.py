"""The traced model: a cost-annotated operator graph.

A :class:`Graph` is what the tracer hands to the cost model and the planner. It is plain
data (JSON in, JSON out); :meth:`Graph.nx` gives the ``networkx.DiGraph`` view.

Every number is for ONE global batch of ``batch_size`` samples, unsharded, in the dtype the
model was traced in. The cost model scales FLOPs and bytes to micro-batches, shards and
precisions; the tracer never does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import AutoplanError, PlanError
from autoplan.types._check import json_file_text, read_json, require, require_fields, write_text_atomic
from autoplan.types.inputs import InputSpec
from autoplan.types.moe import MoELayer

if TYPE_CHECKING:
    import networkx as nx

GRAPH_SCHEMA_VERSION = 1

#: The op kinds a node can have. Parameterised kinds (linear, embedding, conv) are the ones
#: the planner can split across tensor-parallel ranks.
OP_KINDS = (
    "input",  # a placeholder: a forward() argument
    "output",  # the graph's output
    "linear",  # y = x W^T + b; attrs: in_features, out_features, bias
    "embedding",  # a table lookup; attrs: num_embeddings, embedding_dim
    "conv",  # convolution; attrs: in_channels, out_channels, kernel_size, groups
    "matmul",  # a matmul between activations (bmm, einsum, @)
    "attention",  # scaled-dot-product attention; attrs: num_heads, num_kv_heads, head_dim, q_len, kv_len, causal
    "norm",  # layer norm, RMS norm, batch norm, group norm
    "elementwise",  # activations, adds, muls, dropout, softmax
    "reduction",  # sums, means, pooling
    "view",  # reshapes, transposes, slicing: no FLOPs, usually no bytes
    "loss",  # the loss function
    "other",
)
PARAM_KINDS = ("linear", "embedding", "conv")


class GraphError(AutoplanError):
    """A graph file is malformed."""


@dataclass
class ParamInfo:
    """One parameter of the model, by fully qualified name. ``trainable`` is its ``requires_grad``:
    a frozen one (LoRA's base weights, a frozen encoder) gets no gradient, optimizer state or
    gradient sync (docs/cost-model.md, "Frozen parameters"); omitted from JSON when True.
    ``sparse_grad``: an embedding table read with ``sparse=True``, whose gradient holds only the
    rows a batch reads (docs/cost-model.md, "Sparse embedding gradients"); omitted when False.
    ``touched_rows``: of such a table, the distinct rows one rank's step reads (``--touched-rows``); 0
    (omitted): priced as uniform reads (cost/dp/sparse_embedding.py)."""

    shape: list[int]
    dtype: str
    numel: int
    bytes: int
    trainable: bool = True
    sparse_grad: bool = False
    touched_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.trainable:  # a graph of trainable parameters serialises as before the field
            del data["trainable"]
        if not self.sparse_grad:  # likewise a graph without sparse embeddings
            del data["sparse_grad"]
        if not self.touched_rows:
            del data["touched_rows"]
        return data


@dataclass
class OpNode:
    """One operator of the traced forward pass.

    ``saved_bytes`` is what autograd keeps from this node for the backward pass: its output
    when a later op saves it, plus op-internal buffers (softmax statistics, dropout masks)
    that the op saves itself. The tracer measures it under FakeTensor with saved-tensor hooks.

    ``attrs`` (docs/trace.md has the full table): linear: in_features, out_features, bias,
    weight_layout ('out_in' | 'in_out'), module_type; embedding: num_embeddings, embedding_dim;
    conv: in_channels, out_channels, kernel_size, groups; attention: num_heads, num_kv_heads,
    num_kv_heads_at_call, head_dim, q_len, kv_len, causal, has_mask, dropout_p,
    bwd_recompute_flops. Dataflow facts on linears: attention = {roles ⊆ [q, k, v], num_heads,
    num_kv_heads, head_dim, node}; fused_chunks (parts of a split output); head_split (dims a view
    unflattens the whole feature dim into, e.g. [heads, head_dim]); num_experts, expert.
    """

    name: str
    op: str
    target: str
    module: str
    layer: str | None
    param_names: list[str] = field(default_factory=list)
    param_count: int = 0
    param_bytes: int = 0
    param_dtype: str | None = None
    output_shape: list[int] = field(default_factory=list)
    output_dtype: str = ""
    output_bytes: int = 0
    saved_bytes: int = 0
    fwd_flops: int = 0
    bwd_flops: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(
            self.op in OP_KINDS,
            GraphError,
            f"node '{self.name}' has op '{self.op}'; expected one of {', '.join(OP_KINDS)}.",
        )
        for name in ("param_count", "param_bytes", "output_bytes", "saved_bytes", "fwd_flops", "bwd_flops"):
            value = getattr(self, name)
            require(
                isinstance(value, int) and value >= 0,
                GraphError,
                f"node '{self.name}' has {name}={value!r}; expected an integer >= 0.",
            )


@dataclass
class LayerGroup:
    """Blocks that are structurally identical (same ops, shapes and parameter shapes).

    The cost model and the solver price one member and reuse the result for the rest.
    """

    signature: str
    layers: list[str]

    def __post_init__(self) -> None:
        require(len(self.layers) >= 1, GraphError, f"layer group '{self.signature}' has no layers.")


def parameters_signature(parameters: dict[str, ParamInfo]) -> str:
    """What a plan was made for (``Plan.graph_signature``): the first 16 hex digits of the SHA-256
    of every parameter's name, shape and dtype, in the model's order. A plan names the model's
    modules and blocks and is priced on its parameter shapes, so another model (a GPT plan given
    to a Llama) or other sizes (``AUTOPLAN_GPT_N_LAYER=2`` beside 4) give another signature, while
    an edited comment, a reordered import or another machine or torch version give the same one.
    The run side computes it from the model built on the meta device (trace/identity.py), without
    a trace, so this is the same function of the same table the tracer records."""
    table = [[name, list(info.shape), info.dtype] for name, info in parameters.items()]
    return hashlib.sha256(json.dumps(table, separators=(",", ":")).encode()).hexdigest()[:16]


def within(path: str, prefix: str) -> bool:
    """Module ``path`` is ``prefix`` or inside it (FQNs: ``h.0.attn`` is within ``h.0``, ``h.01`` is not)."""
    return path == prefix or path.startswith(prefix + ".")


def reachable(seeds: set[str], step: dict[str, list[str]], allowed: set[str] | None = None) -> set[str]:
    """Nodes reached from ``seeds`` by following ``step`` (successors or predecessors, as from
    :meth:`Graph.adjacency`), only through nodes in ``allowed`` when given; a seed is in the
    result only if it is reached again."""
    seen: set[str] = set()
    stack = list(seeds)
    while stack:
        for nxt in step[stack.pop()]:
            if nxt not in seen and (allowed is None or nxt in allowed):
                seen.add(nxt)
                stack.append(nxt)
    return seen


@dataclass
class Graph:
    """A traced model: ordered nodes, data edges, blocks and groups of identical blocks.

    ``layers`` lists the block FQNs in execution order (for a GPT, ``transformer.h.0`` ...).
    Nodes outside any block (embeddings, the final norm, the head, the loss) have
    ``layer=None``. ``seq_len`` is the tokens per sample for sequence models, else None.
    """

    model_name: str
    batch_size: int
    trace_method: str
    nodes: list[OpNode]
    edges: list[tuple[str, str]]
    layers: list[str]
    groups: list[LayerGroup]
    parameters: dict[str, ParamInfo]
    seq_len: int | None = None
    dtype: str = "float32"
    buffer_bytes: int = 0  # the model's buffers (DDP broadcasts them from rank 0 each step)
    buffer_dtypes: int = 0  # their distinct dtypes: DDP coalesces one broadcast per dtype (0: not recorded, one)
    moe_layers: list[MoELayer] = field(default_factory=list)  # types/moe.py; empty for a dense model
    model_sha256: str = ""  # the SHA-256 of the model file it was traced from ("" when traced from a module)
    inputs: list[InputSpec] = field(default_factory=list)  # the forward() arguments traced (types/inputs.py)
    batch_coupled: list[int] = field(default_factory=list)  # an output coupling samples (trace/batch_coupling.py)
    version: int = GRAPH_SCHEMA_VERSION

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, GraphError, f"graph batch_size={self.batch_size}; expected >= 1.")
        require(
            self.trace_method in ("fx", "export"),
            GraphError,
            f"graph trace_method='{self.trace_method}'; expected 'fx' or 'export'.",
        )
        names = {node.name for node in self.nodes}
        require(len(names) == len(self.nodes), GraphError, "graph has duplicate node names.")
        for src, dst in self.edges:
            require(
                src in names and dst in names,
                GraphError,
                f"graph edge ({src!r}, {dst!r}) names a node that does not exist.",
            )
        grouped = [layer for group in self.groups for layer in group.layers]
        require(sorted(grouped) == sorted(self.layers), GraphError, "graph groups must cover every layer exactly once.")

    # ---- views -------------------------------------------------------------------------
    def nx(self) -> nx.DiGraph:
        """The graph as a ``networkx.DiGraph`` whose node attribute ``op`` is the OpNode."""
        import networkx as nx  # here, not at import: the planner never needs it

        graph = nx.DiGraph()
        for node in self.nodes:
            graph.add_node(node.name, op=node)
        graph.add_edges_from(self.edges)
        return graph

    def node(self, name: str) -> OpNode:
        return self._by_name()[name]

    def _by_name(self) -> dict[str, OpNode]:
        cache = self.__dict__.get("_by_name_cache")
        if cache is None or len(cache) != len(self.nodes):
            cache = {node.name: node for node in self.nodes}
            self.__dict__["_by_name_cache"] = cache
        return cache

    def adjacency(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """(predecessors, successors) of every node by name, built once and cached: the cost
        model and the TP analysis walk the graph on every block they price."""
        cached = self.__dict__.get("_adjacency_cache")
        if cached is None:
            preds: dict[str, list[str]] = {n.name: [] for n in self.nodes}
            succs: dict[str, list[str]] = {n.name: [] for n in self.nodes}
            for src, dst in self.edges:
                preds[dst].append(src)
                succs[src].append(dst)
            cached = self.__dict__["_adjacency_cache"] = (preds, succs)
        return cached

    def grad_nodes(self) -> frozenset[str]:
        """Nodes whose output needs a gradient, so autograd runs a backward op for them: every
        node downstream of a node holding a trainable parameter (and the holders), floating
        outputs only. Built once and cached."""
        cached = self.__dict__.get("_grad_nodes_cache")
        if cached is None:
            _, succs = self.adjacency()
            holders = {n.name for n in self.nodes if n.param_count > 0 and self.trains(n)}
            floating = {n.name for n in self.nodes if "float" in n.output_dtype}
            cached = self.__dict__["_grad_nodes_cache"] = frozenset((holders | reachable(holders, succs)) & floating)
        return cached

    def input_grad_nodes(self) -> frozenset[str]:
        """Nodes whose output carries a gradient back towards the traced inputs: floating inputs (as a
        pipeline stage's input is) and the :meth:`grad_nodes` an input's value flows into; not those made
        from parameters alone (a weight's view or cast) nor from indices alone. Built once and cached."""
        cached = self.__dict__.get("_input_grad_nodes_cache")
        if cached is None:
            _, succs = self.adjacency()
            inputs = {n.name for n in self.nodes if n.op == "input"}
            floating = {name for name in inputs if "float" in self.node(name).output_dtype}
            reached = inputs | reachable(inputs, succs)
            cached = self.__dict__["_input_grad_nodes_cache"] = frozenset((self.grad_nodes() | floating) & reached)
        return cached

    def trains(self, node: OpNode) -> bool:
        """Whether ``node`` holds a trainable parameter (one the trace could not name counts as one)."""
        named = [self.parameters[p] for p in node.param_names if p in self.parameters]
        return len(named) < len(node.param_names) or not named or any(info.trainable for info in named)

    @cached_property
    def frozen_params(self) -> frozenset[str]:
        """Names of the parameters that take no gradient (``requires_grad=False``)."""
        return frozenset(name for name, info in self.parameters.items() if not info.trainable)

    @cached_property
    def trainable_param_count(self) -> int:
        """Unique trainable parameters: those that get gradients, optimizer state and sync."""
        return sum(info.numel for info in self.parameters.values() if info.trainable)

    def layer_nodes(self, layer: str | None) -> list[OpNode]:
        """The nodes of one block, or with ``None`` the nodes outside every block."""
        return [node for node in self.nodes if node.layer == layer]

    def group_of(self, layer: str) -> LayerGroup:
        for group in self.groups:
            if layer in group.layers:
                return group
        raise KeyError(layer)

    # ---- totals (cached: a Graph is built once and then only read; the planner asks for
    # these on every candidate it prices) ---------------------------------------------------
    @cached_property
    def param_count(self) -> int:
        """Unique parameters (a tied embedding counts once)."""
        return sum(info.numel for info in self.parameters.values())

    @cached_property
    def param_bytes(self) -> int:
        return sum(info.bytes for info in self.parameters.values())

    @cached_property
    def signature(self) -> str:
        """:func:`parameters_signature` of this graph's parameters."""
        return parameters_signature(self.parameters)

    @cached_property
    def fwd_flops(self) -> int:
        return sum(node.fwd_flops for node in self.nodes)

    @cached_property
    def bwd_flops(self) -> int:
        return sum(node.bwd_flops for node in self.nodes)

    @cached_property
    def step_flops(self) -> int:
        """Forward plus backward FLOPs of one global batch, without recomputation."""
        return self.fwd_flops + self.bwd_flops

    # ---- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The graph as JSON-ready data. Nodes are converted field by field, without
        ``dataclasses.asdict``'s deep copy (a third of writing GPT-1T's 5,400-node graph); the
        lists and attrs inside are the graph's own, so treat the result as read-only."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["nodes"] = [{f.name: getattr(node, f.name) for f in fields(node)} for node in self.nodes]
        data["edges"] = [list(edge) for edge in self.edges]
        data["groups"] = [asdict(group) for group in self.groups]
        data["parameters"] = {name: info.to_dict() for name, info in self.parameters.items()}
        data["moe_layers"] = [layer.to_dict() for layer in self.moe_layers]
        data["inputs"] = [spec.to_dict() for spec in self.inputs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Graph":
        require_fields(
            data,
            ("model_name", "batch_size", "trace_method", "nodes", "edges", "layers", "groups", "parameters"),
            GraphError,
            "graph",
        )
        version = data.get("version", GRAPH_SCHEMA_VERSION)
        require(
            version == GRAPH_SCHEMA_VERSION,
            GraphError,
            f"graph schema version {version} is not supported; expected {GRAPH_SCHEMA_VERSION}. "
            "Re-run 'autoplan trace'.",
        )
        fields = dict(data)
        fields["nodes"] = [OpNode(**node) for node in data["nodes"]]
        fields["edges"] = [tuple(edge) for edge in data["edges"]]
        fields["groups"] = [LayerGroup(**group) for group in data["groups"]]
        fields["parameters"] = {name: ParamInfo(**info) for name, info in data["parameters"].items()}
        fields["moe_layers"] = [MoELayer.from_dict(layer) for layer in data.get("moe_layers", [])]
        try:  # absent in graphs traced before they were recorded
            fields["inputs"] = [InputSpec.from_dict(spec) for spec in data.get("inputs", [])]
        except PlanError as exc:
            raise GraphError(f"graph {exc}") from None
        return cls(**fields)

    def json_text(self) -> str:
        """graph.json's text (``write_json_atomic``'s of :meth:`to_dict`), made once per Graph as its totals
        are (a Graph is only read once built): the trace cache and ``plan``'s outputs write the same text, and
        a graph read from it keeps it (:meth:`from_json_text`). DeepSeek-V3's 9,598 nodes: 0.23 s a time."""
        if "_json_text" not in self.__dict__:
            self.__dict__["_json_text"] = json_file_text(self.to_dict())
        return self.__dict__["_json_text"]

    @classmethod
    def from_json_text(cls, text: str) -> "Graph":
        """The graph :meth:`json_text` wrote as ``text``, keeping ``text`` as its own: reading JSON and building
        the graph from it gives back the same text (tests/unit/types/test_graph_json_text.py)."""
        graph = cls.from_dict(json.loads(text))
        graph.__dict__["_json_text"] = text
        return graph

    def save(self, path: str | Path) -> Path:
        return write_text_atomic(path, self.json_text())

    @classmethod
    def load(cls, path: str | Path) -> "Graph":
        return cls.from_dict(read_json(path, GraphError, "graph"))
