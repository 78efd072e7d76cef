"""V schedules priced by replaying their action order (docs/cost-model.md, "V schedules").

With p stages, two chunks per stage in the V placement (types/layout.py: stage s runs chunks s and
2p - 1 - s), m micro-batches and one chunk's times F, B (input gradients), W (weight gradients;
cost/pp/split_backward.py), each rank runs its actions in the order torch's schedule builds
(:mod:`autoplan.cost.pp.v_orders`). The replay starts an action when its rank is free and its input has
arrived: F(c, i) after F(c - 1, i), B(c, i) after B(c + 1, i) (the last chunk's after its own F), plus a
send where the two chunks sit on different ranks (the V's turn, chunks p - 1 and p, is local); W after
its B. DualPipeV's F&B pair (the forward of one micro-batch beside the whole backward of another) runs as
torch runs it without an overlap function, its forward then its backward, each on its own input; a pair that
overlaps (:func:`fb_pair_s` below F + B) waits for both inputs and hands both outputs on at its end. Then

    bubble = the last rank's finish - m (2F + 2B + 2W)   (a rank's own work: m micro-batches of two chunks)
    held   = per rank, chunks whose F ran and W (or whole backward) did not, and of them those past their B

deepseek-ai/DualPipe's README (F, B a chunk's forward and whole backward, W its weight part, F&B a pair)
states 1F1B (PP - 1)(F + B), ZB1P (PP - 1)(F + B - 2W) and DualPipe (PP/2 - 1)(F&B + B - 3W) with PP + 1
micro-batches of activations and 2x the parameters (both directions' chunks). DualPipeV is that V cut in
half: p ranks, 2p chunks, 1x a 1F1B stage's parameters, 2p + 1 chunks (p + 1/2 stages) of activations here.
At equal F, B, W its pairs taken whole tend to the README's (PP/2 - 1)(F&B + B - 3W), PP = 2p, as F&B -> F + B;
run apart (today) they replay to ZBV's bubble, (p - 1) chunk forwards: the last rank's wait for the V's first
leg; ZBV holds 2p chunks (p stages, 1F1B's). The replay differs from such tables where F, B, W are unequal (it
times every action, so the idle slots are the orders' own) and in F&B, which runs apart until an overlap
function is registered (:func:`fb_pair_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from autoplan.cost.pp.v_orders import Action, v_order
from autoplan.types.layout import stage_of_chunk


def fb_pair_s(*, forward_s: float, backward_s: float) -> float:
    """One F&B pair: a chunk's forward of one micro-batch beside a chunk's whole backward (B + W) of another.
    Run one after the other, as torch's ScheduleDualPipeV does without an overlap function: their sum."""
    return forward_s + backward_s


def _durations(f: float, b: float, w: float) -> dict[str, float]:
    return {"F": f, "B": b, "W": w, "BW": b + w, "FB": fb_pair_s(forward_s=f, backward_s=b + w)}


def _needs(action: Action, *, chunks: int) -> list[tuple[str, int, int]]:
    """The (kind, chunk, micro-batch) results ``action`` waits for (module docstring)."""
    kind, c, i = action[0], action[1], action[2]
    if kind == "FB":
        return _needs(("F", c, i), chunks=chunks) + _needs(("BW", action[3], action[4]), chunks=chunks)
    if kind == "F":
        return [("F", c - 1, i)] if c > 0 else []
    if kind == "W":
        return [("B", c, i)]
    return [("B", c + 1, i)] if c < chunks - 1 else [("F", c, i)]


def _unpaired(actions: Sequence[Action], seconds: dict[str, float]) -> Sequence[Action]:
    """``actions`` with each F&B pair run as its forward, then its backward, where the pair overlaps nothing
    (:func:`fb_pair_s` no shorter than the two apart: torch's sequential execution, each half starting on its
    own input); a pair that overlaps stays one action."""
    if seconds.get("FB", float("inf")) < seconds.get("F", 0.0) + seconds.get("BW", 0.0):
        return actions
    return [half for a in actions for half in ([("F", *a[1:3]), ("BW", *a[3:5])] if a[0] == "FB" else [a])]


def _produces(action: Action) -> list[tuple[str, int, int]]:
    kind = action[0]
    if kind == "FB":
        return [("F", action[1], action[2]), ("B", action[3], action[4])]
    return [("B" if kind == "BW" else kind, action[1], action[2])]


@lru_cache(maxsize=4096)
def replay_span_s(*, schedule: str, pp: int, m: int, f: float, b: float, w: float, send_s: float = 0.0) -> float:
    """The time the last rank finishes one step of V ``schedule`` with one chunk's ``f``, ``b``, ``w`` seconds
    and ``send_s`` per send between ranks (module docstring), memoised."""
    place = [stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)]
    return max(replay_finish_s(v_order(schedule, pp=pp, m=m), place=place, seconds=_durations(f, b, w), send_s=send_s))


def replay_finish_s(
    order: Sequence[Sequence[Action]], *, place: Sequence[int], seconds: dict[str, float], send_s: float = 0.0
) -> list[float]:
    """Each rank's finish time for ``order`` (one action list per rank) with chunk c on rank ``place[c]`` and
    ``seconds`` per action kind (module docstring), O(actions): a rank runs its order until an input is
    missing, and resumes when the action that makes it ends."""
    chunks, ranks = len(place), len(order)
    order = [_unpaired(actions, seconds) for actions in order]
    done: dict[tuple[str, int, int], float] = {}
    waiting: dict[tuple[str, int, int], list[int]] = {}
    clock, at = [0.0] * ranks, [0] * ranks
    ready = list(range(ranks))
    while ready:
        rank = ready.pop()
        while at[rank] < len(order[rank]):
            action = order[rank][at[rank]]
            needs = _needs(action, chunks=chunks)
            missing = next((n for n in needs if n not in done), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(rank)
                break
            arrivals = (done[n] + (0.0 if place[n[1]] == rank else send_s) for n in needs)
            clock[rank] = max([clock[rank], *arrivals]) + seconds[action[0]]
            for result in _produces(action):
                done[result] = clock[rank]
                ready += waiting.pop(result, [])
            at[rank] += 1
    assert all(at[r] == len(order[r]) for r in range(ranks)), "the schedule's order deadlocked"
    return clock


def replay_bubble_s(*, schedule: str, pp: int, m: int, f: float, b: float, w: float) -> float:
    """The idle time of the step beyond a rank's own work, m (F + B + W) of the whole stage (``f``, ``b``, ``w``:
    a stage's two chunks together, split evenly between them)."""
    span = replay_span_s(schedule=schedule, pp=pp, m=m, f=f / 2, b=b / 2, w=w / 2)
    return max(0.0, span - m * (f + b + w))


@lru_cache(maxsize=1024)
def held_states(*, schedule: str, pp: int, m: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Every (chunks whose activations ``rank`` holds, of them those whose B ran and W did not) no other state of
    its order exceeds in both (module docstring): one of them is the peak, whatever a chunk's activations and
    kept output gradients weigh. An F&B counts its forward before its backward frees, as torch runs them."""
    held = pending = 0
    states = set()
    for action in v_order(schedule, pp=pp, m=m)[rank]:
        for kind in ("F", "BW") if action[0] == "FB" else (action[0],):
            held += {"F": 1, "W": -1, "BW": -1}.get(kind, 0)
            pending += {"B": 1, "W": -1}.get(kind, 0)
            states.add((held, pending))
    return tuple(sorted(s for s in states if not any(o != s and o[0] >= s[0] and o[1] >= s[1] for o in states)))


def held_at_peak(*, schedule: str, pp: int, m: int, rank: int) -> tuple[int, int]:
    """The state of :func:`held_states` with the most chunks held (and of those the most gradients kept)."""
    return max(held_states(schedule=schedule, pp=pp, m=m, rank=rank))
