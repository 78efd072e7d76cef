"""interleaved_zb priced by replaying torch's order (docs/cost-model.md, "Zero-bubble schedules").

Rank r of p runs chunks r + j p (j < v), its actions in the order torch 2.13's ScheduleInterleavedZeroBubble builds
(cost/pp/looped_orders.py); as for the V schedules (cost/pp/replay.py) an action starts when its rank is free and its
input has arrived: F(c, i) after F(c - 1, i), B(c, i) after B(c + 1, i) (the last chunk's after its F), W after its
B. Every rank runs the slowest stage's F, B, W, a v-th per chunk, and each backward pass its re-runs
(cost/pp/reruns.py ``looped_rerun_units``: B and W one each, chunk 0 one, in its W). bubble = span - m T, and

    without re-runs:  bubble = (p - 1) max(F, B, F + B - W) / v     (every (p, v, m) torch runs: tests/unit/cost/
                                                                      test_looped_replay.py)

Qi et al.'s (p - 1)(F + B - W) where W <= min(F, B) (ZB-H1, ICLR'24 section 2.1). With re-runs the ranks differ
(chunk 0's backward runs once), so the order is replayed, memoised on its times.

Floors (solve/stage_costs.py, cost/bounds.py), with B and W without their re-runs; the span is at least any chain
of actions each waiting for the one before it. (a) F(0, 0) .. F(p - 2, 0), then all of rank p - 1's actions (m T:
every rank's re-runs sum to the stage's): bubble >= (p - 1) F / v. (b) F(0, 0) .. F(p - 2, 0); rank p - 1's actions
up to its last B, B(p - 1, m - 1) (the p Ws after it, of chunk p - 1, each w + u_(p-1): m >= p puts the last p
backwards on leg 0); B(p - 2, m - 1) .. B(0, m - 1); rank 0's last W, W(0, m - 1). Its length is m T + (p - 1)
(F + B - W) / v + u_1 + .. + u_(p-2) + u_0 - p u_(p-1), whose re-runs cancel: u_0 = 2 R, u_c = R (stage k > 0) or
u_0 = R, u_c = R / 2 (k = 0). So bubble >= (p - 1)(F + B - W) / v = (p - 1)(T - 2W - R) / v, R the re-runs.
"""

from __future__ import annotations

from autoplan.cost.pp.looped_orders import looped_order
from autoplan.cost.pp.replay import _durations, _flat_of, _replay_flat
from autoplan.cost.pp.reruns import looped_rerun_units
from autoplan.cost.stored import stored
from autoplan.types.layout import stage_of_chunk


def looped_zb_bubble_s(
    *, pp: int, virtual_stages: int, m: int, f: float, b: float, w: float, rerun_s: dict[int, float] | None = None
) -> float:
    """The bubble of interleaved_zb (module docstring) with the slowest stage's ``f``, ``b``, ``w`` seconds (all its
    chunks, without re-runs) and ``rerun_s``, one re-run of each of its recomputed chunks (StageTotals.chunk_rerun_s;
    None or empty: none): the closed form without re-runs, the replay with them."""
    p, v = pp, virtual_stages
    if p == 1:
        return 0.0
    units, reruns_s = looped_rerun_units(pp=p, virtual_stages=v, m=m, rerun_s=rerun_s or {})
    if not reruns_s:
        return (p - 1) / v * max(f, b, f + b - w)
    span = looped_span_s(pp=p, virtual_stages=v, m=m, f=f / v, b=b / v, w=w / v, rerun_s=units)
    return max(0.0, span - m * (f + b + w) - reruns_s)


@stored(maxsize=4096)
def looped_span_s(
    *, pp: int, virtual_stages: int, m: int, f: float, b: float, w: float, rerun_s: tuple[float, ...] = ()
) -> float:
    """The last rank's finish of interleaved_zb's order with one chunk's ``f``, ``b``, ``w`` seconds and ``rerun_s[c]``
    per backward pass of chunk c (replay.py ``_seconds_of``; empty: none), memoised."""
    flat = _looped_flat(pp=pp, virtual_stages=virtual_stages, m=m)
    return max(_replay_flat(flat, _durations(f, b, w), 0.0, rerun_s))


@stored(maxsize=256)
def _looped_flat(*, pp: int, virtual_stages: int, m: int) -> tuple:
    """replay.py's flat form of interleaved_zb's order, built once per (p, v, m)."""
    order = looped_order("interleaved_zb", pp=pp, virtual_stages=virtual_stages, m=m)
    return _flat_of(order, place=[stage_of_chunk(c, pp=pp) for c in range(pp * virtual_stages)])
