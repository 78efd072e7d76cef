"""Block summaries as a plan runs them: each distinct block priced once per what its price reads
(docs/cost-model.md, "Blocks").

A block's summary (:func:`autoplan.cost.blocks.summarise`) is a function of its group's representative
block, the tp split of each of its parameterised modules, and the fields of the TP context it reads. Blocks
of one group (trace/layers.py) with the same splits share one summary. A block that runs no routed experts
(cost/moe/experts.py ``layers_in``: a dense block, the nodes outside every block) reads no expert placement,
so its summary is keyed on the context without it (``TPContext.dense_key``): a search over ep, expert_tp
and routing prices such a block once per the other fields, not once per placement. A block that runs them
reads the placement only in its routed experts' nodes (cost/node_terms.py): its other nodes' terms are kept
per context without the placement, and only those nodes are priced again per placement. What a block's terms read
that no batch fraction changes (its nodes' shards, reads and bytes, its loss bytes and held parameters:
cost/node_terms.py ``BlockFacts``) is kept per context without the batch fraction and the placement, so a block
at another micro-batch prices its nodes' times and sums alone.

The splits of each block under a tp_plan are read once per tp_plan (``TpPlanMemo``), and the summaries of
every block and of the outside nodes, as the plan runs them (tp_comm_overlap: cost/tp/overlap.py), once per
tp_plan and context.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost.blocks import LayerSummary, block_structure, per_distinct, summarise
from autoplan.cost.compute.op_costs import NodeTimes
from autoplan.cost.moe.experts import layers_in
from autoplan.cost.node_terms import BlockFacts, BlockTerms, block_terms
from autoplan.cost.tp.block import block_nodes
from autoplan.cost.tp.overlap import overlapped
from autoplan.cost.tp.plan_memo import TpPlanMemo
from autoplan.cost.tp.splits import TPContext
from autoplan.types.graph import PARAM_KINDS, Graph
from autoplan.types.profile import Profile


class BlockSummaries:
    """The summaries of one graph's blocks on one profile (module docstring). ``rep`` maps a block to its
    group's representative, ``structures`` a representative to its BlockStructure and ``outside`` the parts
    "pre" and "post" (the nodes before the first block and after it) to theirs."""

    def __init__(self, graph: Graph, profile: Profile, node_times: NodeTimes):
        self.graph, self.profile, self.node_times = graph, profile, node_times
        self.rep: dict[str, str] = {}
        self._param_modules: dict[str | None, tuple[str, ...]] = {}
        for group in graph.groups:
            self._index_group(group.layers)
        self.structures = {rep: block_structure(graph, rep) for rep in set(self.rep.values())}
        self.outside = self._split_outside()
        structures = [*self.structures.items(), *self.outside.items()]  # "pre" and "post" name no block
        self._routed = {name: bool(layers_in(graph, s.nodes)) for name, s in structures}
        self._cache: dict[tuple, LayerSummary] = {}
        self._terms_cache: dict[tuple, BlockTerms] = {}  # a routed block's, per context but its placement
        self._facts: dict[tuple, BlockFacts] = {}  # a block's node facts, per context but its batch fraction
        self._memo = TpPlanMemo()  # per-tp_plan values shared by candidate plans

    def _index_group(self, layers: list[str]) -> None:
        rep = layers[0]
        for layer in layers:
            self._param_modules[layer] = tuple(n.module for n in block_nodes(self.graph, layer) if n.op in PARAM_KINDS)
        for layer in layers:
            same = len(self._param_modules[layer]) == len(self._param_modules[rep])
            self.rep[layer] = rep if same else layer

    def _split_outside(self) -> dict[str, object]:
        nodes = self.graph.nodes
        first = next((i for i, n in enumerate(nodes) if n.layer is not None), len(nodes))
        pre = [n for n in nodes[:first] if n.layer is None]
        post = [n for n in nodes[first:] if n.layer is None]
        self._param_modules[None] = tuple(n.module for n in nodes if n.layer is None and n.op in PARAM_KINDS)
        return {
            "pre": block_structure(self.graph, None, nodes=pre),
            "post": block_structure(self.graph, None, nodes=post),
        }

    def summary(self, layer: str | None, tp_plan: dict[str, str], ctx: TPContext, part: str = "") -> LayerSummary:
        """One micro-batch of block ``layer`` (or of the outside nodes, ``layer=None`` with part "pre"/"post")
        under ``tp_plan`` and ``ctx``, priced once per representative, splits and the context it reads."""
        splits = tuple(tp_plan.get(m, "replicate") for m in self._param_modules[layer]) if ctx.tp > 1 else ()
        return self._priced(layer, part, splits, tp_plan, ctx)

    def _priced(
        self, layer: str | None, part: str, splits: tuple, tp_plan: dict[str, str], ctx: TPContext
    ) -> LayerSummary:
        rep = self.rep[layer] if layer is not None else None
        routed = self._routed[rep or part]
        key = (rep, part, splits, *(ctx.key if routed else ctx.dense_key))
        hit = self._cache.get(key)
        if hit is None:
            rep_plan = dict(zip(self._param_modules[rep], splits)) if rep is not None else tp_plan
            structure = self.structures[rep] if rep is not None else self.outside[part]
            run_ctx = part_context(ctx, part)
            terms = self._terms(rep, part, splits, rep_plan, structure, run_ctx, keep=routed)
            hit = summarise(
                self.graph, structure, layer=rep, tp_plan=rep_plan, ctx=run_ctx, node_times=self.node_times, terms=terms
            )
            if part == "pre":  # the outside nodes' TP collectives are charged once, to the last stage
                hit = LayerSummary(**{**hit.__dict__, "tp_fwd_s": 0.0, "tp_bwd_s": 0.0})
            self._cache[key] = hit
        return hit

    def _terms(
        self, rep: str | None, part: str, splits: tuple, tp_plan: dict[str, str], structure, ctx: TPContext, keep: bool
    ) -> BlockTerms:
        """The block's node terms but for its expert placement (cost/node_terms.py); a routed block's (``keep``)
        kept once per context without the placement, and whether there is one (its routed experts' nodes are
        priced apart then). Their node facts, which read no batch fraction, are kept per the rest of the context
        (``TPContext.unbatched_key``): a block at another micro-batch prices its nodes' times and sums alone."""
        key = (rep, part, splits, ctx.experts is None, *ctx.dense_key)
        hit = self._terms_cache.get(key) if keep else None
        if hit is None:
            facts_key = (rep, part, splits, *ctx.unbatched_key)
            hit = block_terms(
                self.graph,
                structure.nodes,
                layer=rep,
                tp_plan=tp_plan,
                ctx=ctx,
                node_times=self.node_times,
                facts=self._facts.get(facts_key),
            )
            self._facts.setdefault(facts_key, hit.facts)
            if keep:
                self._terms_cache[key] = hit
        return hit

    def blocks(self, tp_plan: dict[str, str], ctx: TPContext, tp_comm_overlap: bool) -> dict[str, LayerSummary]:
        """Every block's summary as the plan runs it, in the graph's order, memoised per tp_plan and context."""

        def make() -> dict[str, LayerSummary]:  # identical blocks share one summary, so one run of as_run too
            splits = self._block_splits(tp_plan) if ctx.tp > 1 else {}
            priced: dict[tuple, LayerSummary] = {}  # _priced reads a block's representative and splits only
            summaries = []
            for layer in self.graph.layers:
                key = (self.rep[layer], splits.get(layer, ()))
                if key not in priced:
                    priced[key] = self._priced(layer, "", key[1], tp_plan, ctx)
                summaries.append(priced[key])
            ran = per_distinct(summaries, lambda s: self.as_run(s, ctx, tp_comm_overlap))
            return dict(zip(self.graph.layers, ran))

        return self._memo.get(("blocks", *ctx.key, tp_comm_overlap), tp_plan, make)

    def _block_splits(self, tp_plan: dict[str, str]) -> dict[str, tuple[str, ...]]:
        """Each block's split per parameterised module under ``tp_plan`` (at tp > 1), read once per tp_plan."""

        def make() -> dict[str, tuple[str, ...]]:
            return {
                layer: tuple(tp_plan.get(m, "replicate") for m in self._param_modules[layer])
                for layer in self.graph.layers
            }

        return self._memo.get(("splits",), tp_plan, make)

    def outside_summaries(
        self, tp_plan: dict[str, str], ctx: TPContext, tp_comm_overlap: bool
    ) -> tuple[LayerSummary, LayerSummary]:
        """The nodes before the first block and after the last, as the plan runs them, memoised per tp_plan."""

        def make() -> tuple[LayerSummary, LayerSummary]:
            pre, post = (self.as_run(self.summary(None, tp_plan, ctx, part), ctx, tp_comm_overlap) for part in PARTS)
            return pre, post

        return self._memo.get(("outside", *ctx.key, tp_comm_overlap), tp_plan, make)

    def as_run(self, summary: LayerSummary, ctx: TPContext, tp_comm_overlap: bool) -> LayerSummary:
        """The summary as the plan runs it: with tp_comm_overlap, collectives partly hidden under
        the split matmuls and those matmuls decomposed (autoplan/cost/tp/overlap.py)."""
        if not tp_comm_overlap:
            return summary
        return overlapped(summary, tp=ctx.tp, efficiency=self.profile.comm_overlap.efficiency)


PARTS = ("pre", "post")  # the outside nodes: before the first block, and the rest


def part_context(ctx: TPContext, part: str) -> TPContext:
    """The context the nodes of ``part`` run in: the nodes before the first block ("pre") run on the
    whole sequence on every cp rank, since the executor splits it at the blocks' inputs
    (execute/context_parallel.py); everything else on a rank's 1/cp of it."""
    before = part.lstrip("@") == "pre"  # "pre" here, "@pre" among tp/block.py's OUTSIDE_PARTS
    return replace(ctx, batch_fraction=ctx.micro_batch_fraction) if before and ctx.cp > 1 else ctx
