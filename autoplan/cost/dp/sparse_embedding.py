"""Sparse embedding gradients' sync (issue 36 item 2): DDP all-reduces a table read with
``sparse=True`` as a sparse tensor, which gloo coalesces and all-gathers (indices, then values) before
summing locally (torch's ProcessGroupGloo AsyncSparseAllreduceWork). For one table of V rows and D
columns, value bytes b_v, read N times per rank per step (tokens of the rank's global-batch share, all
micro-batches: DDP syncs the accumulated gradient once):

    U          = V (1 - (1 - 1/V)^N)          expected distinct rows under uniform reads (occupancy)
    rank_bytes = U (D b_v + INDEX_BYTES)     one rank's coalesced rows: values and int64 indices
    sent_bytes = p rank_bytes                the all-gathered message on each of p ranks

``U`` is an upper bound for text: Zipf-distributed tokens repeat more, so fewer distinct rows
(``autoplan plan --touched-rows R`` gives R instead, ParamInfo.touched_rows). The table's gradient
leaves DDP's dense buckets; its dense gradient, optimizer state and AdamW step stay as priced
(the executor densifies the synced gradient). gloo's size exchange (a few bytes per rank) is left out.
docs/cost-model.md, "Sparse embedding gradients" has the derivation and its check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

INDEX_BYTES = 8  # a sparse COO gradient's int64 row index
KIND = "all_gather"  # gloo's sparse all-reduce gathers every rank's rows
CALLS_PER_TABLE = 2  # its indices, then its values
ROWS = "touched_rows"  # the audit's record of the rows themselves (count: tables; amount: rows)
_INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


@dataclass(frozen=True)
class SparseTable:
    """One table whose gradient is sparse: its size and how many rows a traced sample reads."""

    name: str
    rows: int  # V
    dim: int  # D
    value_bytes: int  # b_v
    reads_per_sample: float  # lookups per sample in the trace (all reads of the table summed)
    touched_rows: int = 0  # R from --touched-rows (per rank and step); 0: the uniform estimate

    def rows_per_rank(self, reads: float) -> float:
        """U for ``reads`` lookups on one rank (module docstring), or the given R capped at V."""
        if self.touched_rows:
            return float(min(self.touched_rows, self.rows))
        return expected_distinct_rows(self.rows, reads)

    def rank_bytes(self, reads: float) -> float:
        return self.rows_per_rank(reads) * (self.dim * self.value_bytes + INDEX_BYTES)


def expected_distinct_rows(rows: int, reads: float) -> float:
    """V (1 - (1 - 1/V)^N): the expected occupied cells after N uniform throws into V (Feller, vol. 1, II.5)."""
    if rows <= 0 or reads <= 0:
        return 0.0
    return rows * -math.expm1(reads * math.log1p(-1.0 / rows)) if rows > 1 else 1.0


def distinct_rows_sd(rows: int, reads: float) -> float:
    """The standard deviation of the distinct rows under N uniform reads: with q_k = (1 - k/V)^N,
    Var = V q_1 + V (V - 1) q_2 - V^2 q_1^2 (that of the empty cells; Feller, vol. 1, IV.2). The audit
    holds a measured count within 4 of them of U (uniform test tokens; real text touches fewer)."""
    if rows <= 1 or reads <= 0:
        return 0.0
    q1, q2 = (1 - 1 / rows) ** reads, (1 - 2 / rows) ** reads
    return math.sqrt(max(0.0, rows * q1 + rows * (rows - 1) * q2 - rows * rows * q1 * q1))


def sparse_tables(graph: Graph) -> tuple[SparseTable, ...]:
    """Every trainable ``sparse_grad`` parameter with the lookups its embedding nodes make per sample."""
    reads: dict[str, float] = {}
    producers = {n.name: n for n in graph.nodes}
    for node in graph.nodes:
        if node.op != "embedding" or not node.attrs.get("sparse"):
            continue
        indices = [producers[s] for s, d in graph.edges if d == node.name and s in producers]
        shape = next((p.output_shape for p in indices if p.output_dtype in _INTEGER_DTYPES), [])
        for name in node.param_names:
            reads[name] = reads.get(name, 0.0) + math.prod(shape) / max(graph.batch_size, 1)
    tables = []
    for name, info in graph.parameters.items():
        if info.sparse_grad and info.trainable and name in reads and len(info.shape) == 2:
            value_bytes = info.bytes // max(info.numel, 1)
            tables.append(SparseTable(name, info.shape[0], info.shape[1], value_bytes, reads[name], info.touched_rows))
    return tuple(tables)


def reads_per_rank(table: SparseTable, plan: Plan) -> float:
    """N: the table's lookups in one rank's share of a step (global batch / dp samples)."""
    return table.reads_per_sample * plan.global_batch_size / max(plan.dp, 1)


def sent_bytes(tables: tuple[SparseTable, ...], plan: Plan) -> float:
    """The all-gathered bytes of ``tables``' sparse gradients each step, p rank_bytes summed (0 at dp = 1)."""
    if plan.dp <= 1:
        return 0.0
    return sum(plan.dp * t.rank_bytes(reads_per_rank(t, plan)) for t in tables)


def step_volume(tables: tuple[SparseTable, ...], plan: Plan) -> tuple[int, float]:
    """(calls, bytes) of ``tables``' all-gathers in one step (the audit's predicted side); (0, 0) at dp = 1."""
    if plan.dp <= 1 or not tables:
        return 0, 0.0
    return CALLS_PER_TABLE * len(tables), sent_bytes(tables, plan)


def step_rows(tables: tuple[SparseTable, ...], plan: Plan) -> float:
    """U summed over ``tables``: the rows one rank's step sends (the audit's ``touched_rows``)."""
    return sum(t.rows_per_rank(reads_per_rank(t, plan)) for t in tables)


def sync_s(profile: Profile, tables: tuple[SparseTable, ...], plan: Plan, group: AxisGroup) -> float:
    """Each table's two all-gathers (indices, values) over the dp group: alpha-beta on its rows."""
    if group.size <= 1:
        return 0.0
    total = 0.0
    for table in tables:
        rows = table.rows_per_rank(reads_per_rank(table, plan))
        for row_bytes in (INDEX_BYTES, table.dim * table.value_bytes):  # CALLS_PER_TABLE
            total += collective_time_s(profile, KIND, group.size * rows * row_bytes, group=group)
    return total


def sparse_params(tables: tuple[SparseTable, ...], names: tuple[str, ...]) -> float:
    """Of ``names``, the parameters in sparse tables: they leave DDP's dense buckets."""
    if not tables:  # most models: no set of a block's names to build per block and plan
        return 0.0
    inside = set(names)
    return float(sum(t.rows * t.dim for t in tables if t.name in inside))


@dataclass(frozen=True)
class SparseSummary:
    """What a plan's sparse tables send in one step (``autoplan explain``, report/sparse_grads.py)."""

    tables: tuple[str, ...]
    rows: float  # U summed over the tables, one rank's step
    sent_bytes: float  # the all-gathered bytes (0 at dp = 1)
    table_bytes: float  # the tables' dense gradient bytes, which DDP's buckets would all-reduce


def summary(graph: Graph, plan: Plan) -> SparseSummary:
    """``graph``'s sparse tables under ``plan`` (module docstring's U and sent_bytes)."""
    tables = sparse_tables(graph)
    table_bytes = sum(t.rows * t.dim * t.value_bytes for t in tables)
    return SparseSummary(tuple(t.name for t in tables), step_rows(tables, plan), sent_bytes(tables, plan), table_bytes)
