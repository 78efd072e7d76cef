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

With n = max(m, 2p - 1), the ZBV loop runs n - (2p - r - 1) steps with F a (until a has run n forwards), then
p - r - 1 without (until b has); each chunk's Bs and Ws number n, so r Ws of each are left. ``v_halves`` builds a
rank's (kind, chunk) halves from these phases as repeated patterns (what the pipeline memory reads), ``v_order``
its actions.

tests/unit/cost/test_v_schedules.py checks both against torch's own ``pipeline_order`` for p = 2..8.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost.stored import stored

Action = tuple  # (kind, chunk, micro-batch) or ("FB", chunk, micro-batch, chunk, micro-batch)


@stored(maxsize=256)
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


def v_halves(schedule: str, *, pp: int, m: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The kinds (codes of looped_orders.py ``KINDS``: F 0, B 1, W 2, BW 3) and chunks of the halves ``rank`` runs
    in :func:`v_order`'s order (an F&B pair is its F, then its BW), from the module docstring's phases as repeated
    patterns rather than one action at a time; tests/unit/cost/test_v_halves.py holds them to :func:`v_order`."""
    a, b = rank, 2 * pp - 1 - rank
    if schedule == "zbv":
        n = max(2 * pp - 1, m)  # ZBV's steady steps: with F a while it has micro-batches left, then without
        phases = [[((0, a),), 2 * (pp - rank) - 1], [((0, b), (0, a)), rank], [((0, b), (1, b), (2, b)), pp - rank]]
        phases += [[((0, a), (1, a), (2, a), (0, b), (1, b), (2, b)), n - (2 * pp - rank - 1)]]
        phases += [[((1, a), (2, a), (0, b), (1, b), (2, b)), pp - rank - 1], [((1, a), (1, b)), rank]]
        phases += [[((1, a), (2, a)), pp - rank], [((2, b),), rank], [((2, a),), rank]]
        return _first_micro_batches(*_tiled(phases), m=m) if n > m else _tiled(phases)
    phases = [[((0, a),), 2 * (pp - rank - 1)], [((0, a), (0, b)), rank + 1], [((1, b), (2, b), (0, b)), pp - rank - 1]]
    phases += [[((0, a), (3, b), (0, b), (3, a)), max(0, m - 2 * pp + rank + 1)]]  # the last rank's first apart: same
    phases += [[((3, b), (0, b), (3, a)), pp - rank - 1], [_dualpipev_tail(rank, pp=pp), 1]]
    return _tiled(phases)


def _tiled(phases: list) -> tuple[np.ndarray, np.ndarray]:
    """(kinds, chunks) of each (pattern of (kind, chunk) halves, times) repeated ``times``, in order."""
    halves = np.concatenate(
        [np.tile(np.asarray(pattern, dtype=np.int64).reshape(-1, 2), (max(0, times), 1)) for pattern, times in phases]
    )
    return halves[:, 0], halves[:, 1]


def _first_micro_batches(kinds: np.ndarray, chunks: np.ndarray, *, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The halves of micro-batches below ``m``: each (kind, chunk)'s k-th half runs micro-batch k (torch builds
    ZBV for max(2p - 1, m) micro-batches and drops the others)."""
    code = kinds * (chunks.max(initial=0) + 1) + chunks
    order = np.argsort(code, kind="stable")
    starts = np.searchsorted(code[order], code[order])  # each half's first of its (kind, chunk) in sorted order
    micro_batch = np.empty_like(code)
    micro_batch[order] = np.arange(len(code)) - starts
    keep = micro_batch < m
    return kinds[keep], chunks[keep]


def _dualpipev_tail(rank: int, *, pp: int) -> tuple[tuple[int, int], ...]:
    """DualPipeV's halves after its last F (module docstring): b then a backward, whole, then B from the middle on,
    each B's W pending; the pending Ws, oldest first, one before each of a's backwards left and then the rest."""
    a, b = rank, 2 * pp - 1 - rank
    out: list[tuple[int, int]] = []
    pending: list[int] = []  # the chunks whose B ran and W did not, oldest first

    def backward(chunk: int, split: bool) -> None:
        out.append((1 if split else 3, chunk))
        pending.extend([chunk] if split else [])

    def weight() -> None:
        out.extend([(2, pending.pop(0))] if pending else [])

    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        backward(b, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        backward(a, split)
    for _ in range(pp - rank - 1):
        weight()
        backward(a, split)
    for _ in range(rank + 1):
        weight()
    return tuple(out)
