"""``autoplan trace MODEL.py --batch B --out DIR``: trace a model file, write graph.json and
ops.csv, print a summary (a rich table, or JSON with --json)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autoplan.types._check import write_text_atomic
from autoplan.types.graph import Graph
from autoplan.types.moe import DEFAULT_IMBALANCE, IMBALANCE_SOURCE, RoutingModel
from autoplan.types.tables import TracedOp, table_text


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "trace",
        parents=[common],
        help="trace a model file into a cost-annotated graph",
        description="Trace MODEL.py on fake tensors; write DIR/graph.json and DIR/ops.csv.",
    )
    parser.add_argument("model", help="a model file defining build_model() and example_inputs(batch_size)")
    parser.add_argument("--batch", type=int, required=True, help="global batch size in samples")
    parser.add_argument("--out", required=True, help="output folder")
    add_trace_arguments(parser)
    parser.set_defaults(func=run, out_kind="folder", exits_fast=True)  # cli/startup.py, exit_now


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """What every command that traces a model file takes: the routing model and the trace cache."""
    add_routing_arguments(parser)
    parser.add_argument(
        "--no-trace-cache",
        action="store_true",
        help="trace the model even if the trace cache holds it, and store nothing (also AUTOPLAN_TRACE_CACHE=off; "
        "docs/trace.md, The trace cache)",
    )


#: What every trace imports from torch beyond ``import torch``, imported with torch and the GC paused: the
#: symbolic shapes (and sympy) that fake tensors and the meta device's Python kernels load on their first op.
TRACE_IMPORTS = ("torch.fx.experimental.symbolic_shapes",)


def model_graph(args: argparse.Namespace) -> Graph:
    """The traced graph of ``args.model`` at ``args.batch``: from the trace cache while its entry is
    valid (without importing torch), else traced, importing torch and the model file and tracing with the GC
    paused, the heap frozen after the trace (cli/startup.py), and torch._dynamo only if the trace needs it
    (cli/dynamo_stand_in.py)."""
    from autoplan.cli.startup import paused, paused_collector, paused_imports
    from autoplan.trace.cache import cache_dir, cached_trace

    routing = routing_of(args)

    def prepare() -> None:
        paused_imports("torch", "autoplan.trace.api")
        from autoplan.trace.dtensor_reach import registry_modules

        paused_imports(*TRACE_IMPORTS, *registry_modules())

    def trace() -> Graph:
        from autoplan.cli.dynamo_stand_in import dynamo_deferred
        from autoplan.modelfile import load_model_file
        from autoplan.trace import trace_model_file

        # torch._dynamo only if the trace needs more than its disable(); the collector paused, and the heap
        # frozen after, as what the trace leaves lives to the end of the command (cli/startup.py)
        with dynamo_deferred(), paused_collector():
            return trace_model_file(args.model, args.batch, routing=routing, load=paused(load_model_file))

    folder = cache_dir(enabled=not args.no_trace_cache)
    traced = cached_trace(args.model, args.batch, routing=routing, trace=trace, folder=folder, prepare=prepare)
    for note in [*traced.warnings, *unmeasured_notes(traced.graph)]:  # on stderr even with --quiet, as plan's own
        print(f"autoplan: warning: {note}", file=sys.stderr)
    return traced.graph


def unmeasured_notes(graph: Graph) -> list[str]:
    """One sentence per node whose op the trace could not run on fake tensors (trace/api.py ``_loss_record``: CTC)."""
    return [
        f"the loss calls {node.attrs['unmeasured']}, which cannot run on the trace's fake tensors (its output shape "
        "depends on its values): its time is priced at zero, small beside the model's; `autoplan run` runs it for real."
        for node in graph.nodes
        if node.attrs.get("unmeasured")
    ]


def add_routing_arguments(parser: argparse.ArgumentParser) -> None:
    """The routing model of Mixture-of-Experts layers (types/moe.py, docs/moe.md)."""
    parser.add_argument(
        "--moe-imbalance",
        type=float,
        default=None,
        metavar="I",
        help=f"busiest expert's load over the mean, >= 1 (default {DEFAULT_IMBALANCE}: {IMBALANCE_SOURCE})",
    )
    parser.add_argument(
        "--moe-capacity-factor",
        type=float,
        default=None,
        metavar="C",
        help="give every expert ceil(C * tokens * top_k / experts) slots, dropping or padding (default: dropless)",
    )


def routing_of(args: argparse.Namespace) -> RoutingModel:
    """The routing model the command line asks for (one sentence if a value is out of range)."""
    imbalance = DEFAULT_IMBALANCE if args.moe_imbalance is None else args.moe_imbalance
    source = IMBALANCE_SOURCE if args.moe_imbalance is None else "set with --moe-imbalance"
    return RoutingModel(imbalance=imbalance, capacity_factor=args.moe_capacity_factor, imbalance_source=source)


def run(args: argparse.Namespace) -> int:
    from autoplan.cli.startup import frozen_imports

    with frozen_imports():  # torch only if the model is traced (model_graph)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    graph = model_graph(args)
    out = Path(args.out)
    graph.save(out / "graph.json")
    write_text_atomic(out / "ops.csv", table_text(traced_ops(graph), TracedOp))
    summary = summarize(graph, out)
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        _print(summary)
    return 0


def traced_ops(graph: Graph) -> list[TracedOp]:
    """ops.csv of a trace: one row per graph node (types/tables.py)."""
    return [
        TracedOp(
            name=n.name,
            op=n.op,
            module=n.module,
            layer=n.layer or "",
            params=n.param_count,
            param_bytes=n.param_bytes,
            output_bytes=n.output_bytes,
            saved_bytes=n.saved_bytes,
            fwd_flops=n.fwd_flops,
            bwd_flops=n.bwd_flops,
        )
        for n in graph.nodes
    ]


def summarize(graph: Graph, out: Path) -> dict[str, Any]:
    return {
        "model": graph.model_name,
        "trace_method": graph.trace_method,
        "batch_size": graph.batch_size,
        "seq_len": graph.seq_len,
        "parameters": graph.param_count,
        "parameter_bytes": graph.param_bytes,
        "trainable_parameters": graph.trainable_param_count,  # requires_grad (docs/cost-model.md, "Frozen parameters")
        "fwd_flops": graph.fwd_flops,
        "bwd_flops": graph.bwd_flops,
        "step_flops": graph.step_flops,
        "saved_activation_bytes": sum(n.saved_bytes for n in graph.nodes),
        "nodes": len(graph.nodes),
        "layers": len(graph.layers),
        "groups": [{"signature": g.signature, "layers": len(g.layers), "first": g.layers[0]} for g in graph.groups],
        "moe_layers": [_moe_summary(layer) for layer in graph.moe_layers],
        "graph": str(out / "graph.json"),
        "ops": str(out / "ops.csv"),
    }


def _moe_summary(layer) -> dict[str, Any]:
    shared = f" + shared {layer.shared_module}" if layer.shared_module else ""
    shape = (
        f"{layer.num_experts} experts top-{layer.top_k}, FFN {layer.hidden_size}x{layer.expert_ffn_size}{shared}, "
        f"{layer.slots_per_expert} slots per expert"
    )
    return {"module": layer.module, "shape": shape, **layer.to_dict()}


def _print(summary: dict[str, Any]) -> None:
    from rich.console import Console

    from autoplan.display import FitTable, number_text, si_text

    title = f"autoplan trace: {summary['model']} (batch {summary['batch_size']})"
    table = FitTable(headers=["what", "value"], numbers=set(), title=title)
    rows = [
        ("trace method", summary["trace_method"]),
        ("parameters", f"{summary['parameters']:,} ({number_text(summary['parameter_bytes'] / 2**30)} GiB)"),
        *_trainable_row(summary),
        (
            "FLOPs per step",
            f"{si_text(summary['step_flops'], 'FLOP')} (fwd {si_text(summary['fwd_flops'], 'FLOP')}, "
            f"bwd {si_text(summary['bwd_flops'], 'FLOP')})",
        ),
        ("saved activations", f"{number_text(summary['saved_activation_bytes'] / 2**30)} GiB"),
        ("nodes", str(summary["nodes"])),
        ("layers", str(summary["layers"])),
        ("seq len", str(summary["seq_len"])),
    ]
    for group in summary["groups"]:
        rows.append((f"group {group['signature']}", f"{group['layers']} layers, first {group['first']}"))
    if summary["moe_layers"]:
        first = summary["moe_layers"][0]
        rows.append(("MoE layers", f"{len(summary['moe_layers'])}, first {first['module']}: {first['shape']}"))
    rows += [("wrote", f"{summary['graph']}, {summary['ops']}")]
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def _trainable_row(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """A row for the trainable parameters when some are frozen (none when every parameter trains)."""
    trainable, total = summary["trainable_parameters"], summary["parameters"]
    if trainable == total:
        return []
    return [("trainable", f"{trainable:,} ({trainable / total:.2%}; the rest frozen: requires_grad=False)")]
