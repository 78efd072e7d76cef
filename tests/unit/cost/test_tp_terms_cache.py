"""The tensor-parallel term cache never hands one profile's terms to another.

The cache lives on the graph; it used to be keyed by ``id(profile)``, which CPython hands on
to a new object once the old one is freed (calibration deep-copies profiles in a loop), so a
new profile at a reused id silently got the freed one's comm terms.
"""

import copy

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.splits import TPContext, block_terms

BATCH = 8


def _terms(graph, profile):
    group = mesh_groups(profile, dp=1, tp=2, pp=1)["tp"]
    ctx = TPContext(
        profile=profile, tp=2, group=group, sequence_parallel=False, precision="bf16", batch_fraction=1 / BATCH
    )
    return block_terms(graph, graph.layers[0], ctx=ctx)


def _rowwise_fwd_s(terms) -> float:
    return max(fwd for unary in terms.unary.values() for fwd, _ in unary.values())


def _fresh_graph():
    return synthetic_gpt(layers=1, hidden=256, seq=64, batch=BATCH)


def _uncached_s(profile) -> float:
    return _rowwise_fwd_s(_terms(_fresh_graph(), profile))


def test_same_object_with_other_link_numbers_gets_new_terms():
    """Same id, different contents (the strongest form of id reuse): terms must follow the contents."""
    graph = _fresh_graph()
    profile = synthetic_profile(intra_busbw_bytes_per_s=200e9)
    fast = _rowwise_fwd_s(_terms(graph, profile))
    for fit in profile.intra_node.collectives.values():
        fit.busbw_bytes_per_s /= 100.0
        fit.alpha_s *= 100.0
    slow = _rowwise_fwd_s(_terms(graph, profile))
    assert slow == _uncached_s(profile) and slow > 10 * fast


def test_two_live_profiles_with_different_links_never_share_terms():
    # The key is the profile's link numbers, so no object identity (which CPython reuses for a
    # freed object) can make a new profile read an old one's terms.
    graph = _fresh_graph()
    fast_profile = synthetic_profile(intra_busbw_bytes_per_s=200e9)
    slow_profile = synthetic_profile(intra_busbw_bytes_per_s=2e9)
    fast = _rowwise_fwd_s(_terms(graph, fast_profile))
    slow = _rowwise_fwd_s(_terms(graph, slow_profile))
    assert slow == _uncached_s(slow_profile) and fast == _uncached_s(fast_profile) and slow > fast


def test_equal_contents_share_one_cache_entry():
    graph = _fresh_graph()
    profile = synthetic_profile()
    first = _terms(graph, profile)
    assert _terms(graph, copy.deepcopy(profile)) is first
