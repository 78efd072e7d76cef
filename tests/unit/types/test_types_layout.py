"""The one statement of where ranks and pipeline chunks sit (autoplan/types/layout.py): the mesh is
laid out as torch's DeviceMesh lays out its named dims, and every chunk has exactly one stage."""

from __future__ import annotations

import itertools

import pytest
import torch

from autoplan.types.graph import within
from autoplan.types.layout import (
    chunk_index,
    chunks_of_stage,
    expert_groups,
    local_chunk,
    plan_groups,
    stage_of_block,
    stage_of_chunk,
)


def _torch_groups(shape: tuple[int, ...], axis: int) -> list[list[int]]:
    """Groups along ``axis`` of ``torch.arange(world).reshape(shape)``, which is how
    ``init_device_mesh`` (and ``DeviceMesh._unflatten``) places ranks on named dims."""
    mesh = torch.arange(int(torch.tensor(shape).prod())).reshape(shape).movedim(axis, -1)
    return sorted(mesh.reshape(-1, shape[axis]).tolist())


@pytest.mark.parametrize("pp, dp, cp, tp", [(1, 1, 1, 1), (2, 2, 1, 2), (3, 4, 1, 2), (2, 3, 2, 4), (2, 2, 4, 1)])
def test_plan_groups_are_the_device_meshs(pp, dp, cp, tp):
    groups = plan_groups(pp=pp, dp=dp, cp=cp, tp=tp)
    for axis, name in enumerate(("pp", "dp", "cp", "tp")):
        assert sorted(groups[name]) == _torch_groups((pp, dp, cp, tp), axis), name
    # the ranks holding the same weights: DeviceMesh's flattened ("dp", "cp")
    assert sorted(groups["dp_cp"]) == _torch_groups((pp, dp * cp, tp), 1)
    if cp == 1:
        assert sorted(groups["dp_cp"]) == sorted(groups["dp"])


@pytest.mark.parametrize("pp, dp, ep", [(1, 4, 2), (2, 8, 4), (2, 6, 3), (1, 4, 4)])
def test_expert_groups_unflatten_dp_with_ep_innermost(pp, dp, ep):
    groups = expert_groups(pp=pp, dp=dp, ep=ep)
    assert sorted(groups["edp"]) == _torch_groups((pp, dp // ep, ep), 1)
    assert sorted(groups["ep"]) == _torch_groups((pp, dp // ep, ep), 2)
    assert all(g == list(range(g[0], g[0] + ep)) for g in groups["ep"])  # consecutive dp ranks


@pytest.mark.parametrize("pp, v", [(1, 1), (4, 1), (2, 3), (4, 2)])
def test_every_chunk_has_one_stage_and_one_place_in_it(pp, v):
    owned = [chunks_of_stage(k, pp=pp, virtual_stages=v) for k in range(pp)]
    assert sorted(itertools.chain(*owned)) == list(range(pp * v))
    for k, chunks in enumerate(owned):
        assert [stage_of_chunk(c, pp=pp) for c in chunks] == [k] * v
        assert [local_chunk(c, pp=pp) for c in chunks] == list(range(v))
        assert [chunk_index(stage=k, local=q, pp=pp) for q in range(v)] == chunks


def test_interleaved_chunks_loop_over_the_stages():
    """The looping placement of Narayanan et al. SC'21 fig. 4, here with 2 stages of 2 chunks: stage
    0 runs blocks 0-1 and 4-5 of 8, stage 1 blocks 2-3 and 6-7."""
    stages = [["h.0", "h.1"], ["h.2", "h.3"], ["h.4", "h.5"], ["h.6", "h.7"]]
    assert stage_of_block(stages, pp=2) == {f"h.{i}": (i // 2) % 2 for i in range(8)}
    assert chunks_of_stage(1, pp=2, virtual_stages=2) == [1, 3]


def test_within_is_a_module_path_prefix_not_a_string_prefix():
    assert within("h.1", "h.1") and within("h.1.attn.q", "h.1")
    assert not within("h.10", "h.1") and not within("h", "h.1")


def test_a_plans_chunk_stages_read_only_pp_and_the_v_shape():
    """types/schedules.py ``plan_chunk_stages`` is memoised on pp, whether the schedule is V-shaped and the chunk
    count (``chunk_stages``): every schedule's plans at any other fields get each chunk's own stage_of_chunk."""
    from autoplan.types.plan import Plan
    from autoplan.types.schedules import SCHEDULES, chunk_stages, plan_chunk_stages, v_shaped

    chunk_stages.cache_clear()
    for schedule, pp, v, dp in itertools.product(SCHEDULES, (1, 2, 3, 8), (1, 2, 3), (1, 4)):
        plan = Plan.unchecked(devices=pp * dp, dp=dp, tp=1, pp=pp, micro_batch_size=1, num_microbatches=8,
                              schedule=schedule, virtual_stages=v)  # fmt: skip
        plain = [stage_of_chunk(c, pp=pp, v_shape=v_shaped(schedule)) for c in range(pp * v)]
        assert list(plan_chunk_stages(plan, pp * v)) == plain, (schedule, pp, v, dp)
    assert chunk_stages.cache_info().currsize <= 2 * 4 * 3  # (pp, v_shape, chunks): not one entry per schedule or dp
