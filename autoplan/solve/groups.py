"""The search's groups (solve/search.py's docstring): each legal (degrees, precision, sequence parallelism,
micro-batch size, cp variant) with the schedules its micro-batches allow, and its bound (1), best first.

The rules that make each choice legal live with it: solve/space.py, solve/expert_layout.py,
solve/context_parallel.py, solve/sequence_parallel.py, solve/sparse_grads.py.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError
from autoplan.solve import expert_layout, schedule_steps, space
from autoplan.solve.built_in_precision import built_in_precision
from autoplan.solve.candidates import Group
from autoplan.solve.context_parallel import folds_into_dp, variant_options
from autoplan.solve.sequence_parallel import sequence_lengths, sp_options
from autoplan.solve.sparse_grads import keep_degrees
from autoplan.types.schedules import TORCH_PIPELINES


def search_degrees(search: Any) -> list:
    """The (devices, dp, cp, tp, pp, ep, expert_tp) the space offers, narrowed by the pins; a ZeRO pin no
    degree can take is one sentence."""
    opts, layers = search.options, search.moe_limits.pipeline_blocks
    counts = space.device_counts(devices=opts.devices, objective=opts.objective, profile=search.profile)
    per_node = search.profile.devices_per_node
    kw = dict(per_node=per_node, layers=layers, batch=opts.batch_size, fixes=search.fixes, eps=search.moe_limits.eps)
    kw.update(refused=search.refused, cp_seq_len=search.cp_seq_len, runtime=opts.runtime)
    kw.update(etp_ok=expert_layout.expert_tp_ok(search.moe_limits), cp_beside_pp=not search.cp_masked)
    kw.update(whole_batch=bool(search.graph.batch_coupled))
    degrees = [deg for n in counts for deg in space.degree_options(devices=n, max_tp=search.max_tp, **kw)]
    degrees = keep_degrees(degrees, search.sparse_tables)
    space.check_zero_pin(degrees, search.fixes, runtime=opts.runtime)
    check_schedule_steps_pin(search.fixes, runtime=opts.runtime)
    return degrees


def check_schedule_steps_pin(fixes: dict, *, runtime: str) -> None:
    """A pinned ``schedule_steps`` k > 1 needs a runtime that runs torch's schedules (types/schedule_steps.py);
    one sentence otherwise."""
    k = fixes.get("schedule_steps", 1)
    if k > 1 and runtime not in TORCH_PIPELINES:
        raise PlanError(
            f"--fix schedule_steps={k} with --runtime {runtime}: only runtimes that run torch's pipeline schedules "
            f"({', '.join(TORCH_PIPELINES)}) accumulate over several schedule steps; pin schedule_steps=1."
        )


def bounded_groups(search: Any) -> list[tuple[float, Any]]:
    """Every group of :func:`search_degrees` with its lower bound, sorted best first."""
    opts, layers, found = search.options, search.moe_limits.pipeline_blocks, []
    degrees = search_degrees(search)
    moe = any(layer.interface == "grouped" for layer in search.graph.moe_layers)
    seq_lens = sequence_lengths(search.graph)
    for deg in [d for d in degrees if space.zero_options(dp=d.dp_cp, fixes=search.fixes)]:  # ZeRO pins skip dp=1
        local_seq_lens = tuple(n // deg.cp for n in seq_lens)  # what sp shards: a cp rank's part
        for precision in space.precision_options(
            search.profile, fixes=search.fixes, allow_fp8=search.options.allow_fp8, runtime=search.options.runtime,
            built_in=built_in_precision(search.graph),
        ):  # fmt: skip
            for sp in sp_options(tp=deg.tp, seq_lens=local_seq_lens, fixes=search.fixes, pp=deg.pp, moe=moe):
                whole = bool(search.graph.batch_coupled)
                for mbs in space.micro_batch_options(batch=opts.batch_size, dp=deg.dp, fixes=search.fixes, whole=whole):
                    if folds_into_dp(cp=deg.cp, mbs=mbs, fixes=search.fixes) or (expert_layout.folds(deg) and not sp):
                        continue
                    m, k = opts.batch_size // (deg.dp * mbs), search.fixes.get("schedule_steps", 1)
                    if k > 1 and (deg.pp == 1 or m % k):  # pinned schedule steps: a pipeline of k steps of m / k
                        continue
                    schedules = [(s, v) for s, v, _ in schedule_steps.schedule_entries(  # m / k's, or a larger k's
                        pp=deg.pp, layers=layers, m=m, k=k, fixes=search.fixes, runtime=opts.runtime)]  # fmt: skip
                    if not schedules:
                        continue
                    share = search.bounds.zero_bubble_share(tp=deg.tp, precision=precision, mbs=mbs, cp=deg.cp)
                    b_min = Group.least_bubble(schedules, pp=deg.pp, share=share)
                    variants = variant_options(search.profile, cp=deg.cp, fixes=search.fixes, masked=search.cp_masked)
                    for variant in variants:
                        compiled = bool(search.fixes.get("compile", False))
                        group = Group(deg, precision, sp, mbs, m, b_min, routing=search.routing, cp_variant=variant,
                                      runtime=opts.runtime, compile=compiled, schedule_steps=k)  # fmt: skip
                        found.append((search.lower_bound(group), group))
    return sorted(found, key=lambda item: item[0])
