"""Each rank's action order under the V schedules, as torch 2.13 builds it (docs/cost-model.md, "V schedules").

Rank r of p runs chunks a = r and b = 2p - 1 - r (the V placement, types/layout.py). An action is
(kind, chunk, micro-batch) with kind F (forward), B (input gradients), W (weight gradients) or BW (the whole
backward), or ("FB", chunk, micro-batch, chunk', micro-batch'): DualPipeV's pair of a forward and another
chunk's whole backward.

- zbv (ScheduleZBVZeroBubble, Qi et al. ICLR'24 section 6): 2(p - r) - 1 forwards of a; r pairs (F b, F a);
  p - r steps (F b, B b, W b); then, until both chunks have run m forwards, steps (F a, B a, W a, F b, B b, W b)
  (the F a only while micro-batches remain); r steps (B a, B b); p - r steps (B a, W a); the Ws left of b,
  then of a. torch builds it for max(m, 2p - 1) micro-batches and drops the actions of those beyond m.
- dualpipev (ScheduleDualPipeV, deepseek-ai/DualPipe): 2(p - r - 1) forwards of a; r + 1 pairs (F a, F b);
  p - r - 1 steps (B b, the oldest pending W, F b); m - 2p + r + 1 steps (F&B(F a, BW b), F&B(F b, BW a)),
  the last rank's first one run apart as F a, BW b; p - r - 1 steps (BW b, F&B(F b, BW a)); r + 1 steps
  (b then a backward: whole, then B from the middle on); p - r - 1 steps (a pending W, a's backward);
  r + 1 pending Ws. The Ws run oldest first.

tests/unit/cost/test_v_schedules.py checks both against torch's own ``pipeline_order`` for p = 2..8.
"""

from __future__ import annotations

from functools import lru_cache

Action = tuple  # (kind, chunk, micro-batch) or ("FB", chunk, micro-batch, chunk, micro-batch)


@lru_cache(maxsize=256)
def v_order(schedule: str, *, pp: int, m: int) -> tuple[tuple[Action, ...], ...]:
    """Each rank's actions under ``schedule`` ("zbv" or "dualpipev"), memoised per (p, m)."""
    build = {"zbv": _zbv_rank, "dualpipev": _dualpipev_rank}[schedule]
    return tuple(tuple(build(rank, pp=pp, m=m)) for rank in range(pp))


def _zbv_rank(rank: int, *, pp: int, m: int) -> list[Action]:
    """ZBV's order of ``rank`` (module docstring)."""
    n, a, b = max(2 * pp - 1, m), rank, 2 * pp - 1 - rank
    count = {("F", a): 0, ("F", b): 0, ("B", a): 0, ("B", b): 0, ("W", a): 0, ("W", b): 0}
    out: list[Action] = []

    def run(*steps: tuple[str, int]) -> None:
        for kind, chunk in steps:
            out.append((kind, chunk, count[kind, chunk]))
            count[kind, chunk] += 1

    for _ in range(2 * (pp - rank) - 1):
        run(("F", a))
    for _ in range(rank):
        run(("F", b), ("F", a))
    for _ in range(pp - rank):
        run(("F", b), ("B", b), ("W", b))
    while count["F", b] < count["F", a] or count["F", a] < n:
        run(*([("F", a)] if count["F", a] < n else []), ("B", a), ("W", a), ("F", b), ("B", b), ("W", b))
    for _ in range(rank):
        run(("B", a), ("B", b))
    for _ in range(pp - rank):
        run(("B", a), ("W", a))
    while count["W", b] < count["B", b]:
        run(("W", b))
    while count["W", a] < count["B", a]:
        run(("W", a))
    return [action for action in out if action[2] < m]


def _dualpipev_rank(rank: int, *, pp: int, m: int) -> list[Action]:
    """DualPipeV's order of ``rank`` (module docstring)."""
    a, b = rank, 2 * pp - 1 - rank
    forwards, backwards = {a: 0, b: 0}, {a: 0, b: 0}
    pending: list[tuple[int, int]] = []  # (chunk, micro-batch) whose B ran and W did not, oldest first
    out: list[Action] = []

    def forward(chunk: int) -> tuple[int, int]:
        forwards[chunk] += 1
        return chunk, forwards[chunk] - 1

    def backward(chunk: int, kind: str = "BW") -> Action:
        backwards[chunk] += 1
        if kind == "B":
            pending.append((chunk, backwards[chunk] - 1))
        return (kind, chunk, backwards[chunk] - 1)

    def weight() -> None:
        if pending:
            out.append(("W", *pending.pop(0)))

    def pair(f_chunk: int, b_chunk: int) -> None:
        out.append(("FB", *forward(f_chunk), *backward(b_chunk)[1:]))

    out += [("F", *forward(a)) for _ in range(2 * (pp - rank - 1))]
    for _ in range(rank + 1):
        out += [("F", *forward(a)), ("F", *forward(b))]
    for _ in range(pp - rank - 1):
        out.append(backward(b, "B"))
        weight()
        out.append(("F", *forward(b)))
    for i in range(m - 2 * pp + rank + 1):
        if i == 0 and rank == pp - 1:  # DualPipe runs the last rank's first pair apart, to shorten the bubble
            out += [("F", *forward(a)), backward(b)]
        else:
            pair(a, b)
        pair(b, a)
    for _ in range(pp - rank - 1):
        out.append(backward(b))
        pair(b, a)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        out.append(backward(b, "B" if split else "BW"))
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        out.append(backward(a, "B" if split else "BW"))
    for _ in range(pp - rank - 1):
        weight()
        out.append(backward(a, "B" if split else "BW"))
    for _ in range(rank + 1):
        weight()
    return out
