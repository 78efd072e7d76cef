"""The partition's per-placement tables (solve/partition_problem.py ``chunk_stages``, ``chunk_sent``,
``stage_neighbours``), memoised on (pp, v, V or looping), all they read: each equals the per-chunk rule of
types/layout.py it replaces, for every placement, whichever placement was asked before it."""

from __future__ import annotations

import itertools

from autoplan.solve.partition_problem import PartitionProblem, chunk_sent, chunk_stages, stage_neighbours
from autoplan.types.layout import chunks_of_stage, sent_from_prior, stage_of_chunk

PLACEMENTS = [(pp, v, shape) for pp, v in itertools.product((1, 2, 3, 4, 8), (1, 2, 3)) for shape in (False, True)]


def _problem(pp: int, v: int, v_shape: bool) -> PartitionProblem:
    layers = pp * v + 3
    return PartitionProblem(
        layer_time_s=[1.0] * layers,
        layer_static_bytes=[1.0] * layers,
        layer_activation_bytes=[1.0] * layers,
        pp=pp,
        extra_time_s=[0.0] * pp,
        extra_bytes=[0.0] * pp,
        in_flight=[1.0] * pp,
        p2p_s=0.5,
        capacity_bytes=float("inf"),
        virtual_stages=v,
        v_shape=v_shape,
    )


def test_placement_tables_follow_the_layout_rules_in_any_order():
    for pp, v, shape in PLACEMENTS + PLACEMENTS[::-1]:  # each asked after every other placement, both ways
        chunks = range(pp * v)
        assert chunk_stages(pp, v, shape) == tuple(stage_of_chunk(c, pp=pp, v_shape=shape) for c in chunks)
        receives = [sent_from_prior(c, pp=pp, v_shape=True) if shape else c > 0 for c in chunks]
        assert chunk_sent(pp, v, shape) == (*receives, False)
        problem = _problem(pp, v, shape)
        assert [problem.stage_of(c) for c in chunks] == list(chunk_stages(pp, v, shape))
        for k in range(pp):
            mine = chunks_of_stage(k, pp=pp, virtual_stages=v, v_shape=shape)
            assert stage_neighbours(pp, v, shape)[k] == sum(problem.neighbours(c) for c in mine)
