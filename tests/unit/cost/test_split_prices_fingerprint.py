"""BlockPrices.fingerprint keeps leaves without a call of their own (split_prices._frozen): it is the plain recursive
freeze of every price the ILP reads, so equal prices (and only those) share an ILP answer."""

from __future__ import annotations

import itertools

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel, price_block
from autoplan.cost.tp.split_prices import PureNode
from autoplan.types.plan import Plan


def _plain(value):
    """The freeze written out in full: every dict (in order), list and tuple a tuple, a PureNode its four fields."""
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, PureNode):
        return (value.origins, _plain(value.time_s), _plain(value.bytes), _plain(value.sharding))
    return value


def test_the_fingerprint_is_the_plain_freeze_and_tells_prices_apart():
    graph = synthetic_gpt(layers=2, hidden=256, heads=4, seq=128, batch=4)
    model = CostModel(graph, synthetic_profile())
    seen = {}
    for layer, tp, sp, mbs in itertools.product([None, graph.layers[0]], [2, 4], [False, True], [1, 2]):
        plan = Plan(devices=tp, dp=1, tp=tp, pp=1, micro_batch_size=mbs, num_microbatches=1, sequence_parallel=sp)
        prices = price_block(graph, layer, ctx=model.tp_context(plan), activation_factor=1.0, param_bytes_factor=2.0)
        t = prices.terms
        read = (prices.params, prices.legal, prices.unary_s, prices.unary_bytes, prices.pure, t.constant, t.pair)
        rest = (t.any_of, t.gated, prices.forward_repeats, prices.constant_s, prices.constant_bytes, prices.ties)
        plain = _plain((*read, *rest, prices.dim_ties, prices.sequence_parallel, prices.step_s))
        assert prices.fingerprint() == plain
        seen.setdefault(prices.fingerprint(), set()).add((layer, tp, sp, mbs))
    assert len(seen) == 2 * 2 * 2 * 2  # every block, tp, sp and micro-batch prices its own
