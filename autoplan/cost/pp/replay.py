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
    held, kept, sent   per rank, as it runs its order (cost/pp/rank_memory.py): activations, output
                       gradients kept from B to W, and tensors handed on, held to the step's end

deepseek-ai/DualPipe's README: DualPipe's bubble (PP/2 - 1)(F&B + B - 3W), which the pairs taken whole tend
to (PP = 2p) as F&B -> F + B; run apart (today) they replay to ZBV's, (p - 1) chunk forwards. DualPipeV holds
2p + 1 chunks (the README's PP + 1 micro-batches, at 1x the parameters). More: docs/cost-model.md, "V schedules".
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from autoplan.cost.pp.rank_memory import frontier, rank_floors, rank_states
from autoplan.cost.pp.reruns import v_rerun_units
from autoplan.cost.pp.v_orders import Action, v_order
from autoplan.cost.stored import stored
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


def _key(action: Action) -> tuple[str, int]:
    """(kind, the chunk whose backward it runs, or its forward's chunk): what an action's seconds depend on."""
    return action[0], action[3] if action[0] == "FB" else action[1]


def _seconds_of(key: tuple[str, int], seconds: dict[str, float], rerun_s: Sequence[float]) -> float:
    """An action's seconds: its kind's, and where ``rerun_s`` gives each chunk one re-run of its recomputed blocks,
    one in each backward pass (cost/pp/reruns.py): a B, a W, a whole BW (an F&B pair's too), none in a forward; the
    first chunk's B runs none (its W runs its full backward: stage.py ``backward_one_chunk``)."""
    kind, chunk = key
    if not rerun_s or kind == "F" or (kind == "B" and chunk == 0):
        return seconds[kind]
    return seconds[kind] + rerun_s[chunk]


def _produces(action: Action) -> list[tuple[str, int, int]]:
    kind = action[0]
    if kind == "FB":
        return [("F", action[1], action[2]), ("B", action[3], action[4])]
    return [("B" if kind == "BW" else kind, action[1], action[2])]


@stored(maxsize=4096)
def replay_span_s(
    *,
    schedule: str,
    pp: int,
    m: int,
    f: float,
    b: float,
    w: float,
    send_s: float = 0.0,
    rerun_s: tuple[float, ...] = (),
) -> float:
    """The time the last rank finishes one step of V ``schedule`` with one chunk's ``f``, ``b``, ``w`` seconds,
    ``send_s`` per send between ranks and ``rerun_s[c]`` per re-run of chunk c's recomputed blocks in each
    backward pass (:func:`_seconds_of`; empty: none), memoised (module docstring)."""
    seconds = _durations(f, b, w)
    apart = _apart(seconds)
    flat = _v_flat(schedule, pp=pp, m=m, apart=apart)
    if flat is None:  # an F&B pair that overlaps, run whole
        steps = _v_steps(schedule, pp=pp, m=m, apart=apart)
        return max(_replay(steps, seconds=seconds, send_s=send_s, rerun_s=rerun_s))
    return max(_replay_flat(flat, seconds, send_s, rerun_s))


def replay_finish_s(
    order: Sequence[Sequence[Action]],
    *,
    place: Sequence[int],
    seconds: dict[str, float],
    send_s: float = 0.0,
    rerun_s: Sequence[float] = (),
) -> list[float]:
    """Each rank's finish time for ``order`` (one action list per rank) with chunk c on rank ``place[c]``,
    ``seconds`` per action kind and ``rerun_s`` per chunk's re-run in each backward pass (:func:`_seconds_of`),
    O(actions): each action starts when its rank's previous one and the actions that make its inputs have ended."""
    steps = _steps(order, place=place, apart=_apart(seconds))
    flat = _flat(steps)
    if flat is None:
        return _replay(steps, seconds=seconds, send_s=send_s, rerun_s=rerun_s)
    return _replay_flat(flat, seconds, send_s, rerun_s)


def _apart(seconds: dict[str, float]) -> bool:
    """Whether an F&B pair runs as its two halves (:func:`_unpaired`)."""
    return not seconds.get("FB", float("inf")) < seconds.get("F", 0.0) + seconds.get("BW", 0.0)


def _v_steps(schedule: str, *, pp: int, m: int, apart: bool) -> tuple:
    """:func:`_steps` of V ``schedule``'s order."""
    place = [stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)]
    return _steps(v_order(schedule, pp=pp, m=m), place=place, apart=apart)


@stored(maxsize=256)
def _v_flat(schedule: str, *, pp: int, m: int, apart: bool) -> tuple | None:
    """:func:`_flat` of :func:`_v_steps`, built once per (p, m) (None where F&B pairs run whole)."""
    if not apart:
        return None
    place = [stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)]
    return _flat_of([_unpaired(actions, {}) for actions in v_order(schedule, pp=pp, m=m)], place=place)


def _flat_of(order: Sequence[Sequence[Action]], *, place: Sequence[int]) -> tuple:
    """:func:`_flat` of an ``order`` whose actions wait for one input at most, built in one pass: each rank runs
    its actions until one waits for a result not yet made, and resumes when it is (any order in which every
    input comes first replays to the same floats)."""
    kinds = tuple(sorted({_key(action) for actions in order for action in actions}))
    index = {kind: k for k, kind in enumerate(kinds)}
    made: dict[tuple, int] = {}
    waiting: dict[tuple, list[int]] = {}  # a result not yet made -> the ranks stopped for it
    pos, last, out, ready = [0] * len(order), [0] * len(order), [], list(range(len(order)))
    while ready:
        rank = ready.pop()
        actions = order[rank]
        while pos[rank] < len(actions):
            action = actions[pos[rank]]
            needs = _needs(action, chunks=len(place))
            j = made.get(needs[0]) if needs else 0
            if j is None:
                waiting.setdefault(needs[0], []).append(rank)
                break
            out.append((index[_key(action)], last[rank], j, bool(needs) and place[needs[0][1]] != rank))
            last[rank], pos[rank] = len(out), pos[rank] + 1
            for result in _produces(action):
                made[result] = len(out)
                ready += waiting.pop(result, [])
    assert all(p == len(actions) for p, actions in zip(pos, order)), "the schedule's order deadlocked"
    return kinds, tuple(out), tuple(last)


def _flat(steps: tuple) -> tuple | None:
    """``steps`` renumbered for :func:`_replay_flat` (None where an action waits for two inputs: an F&B pair
    run whole, which :func:`_replay` replays): action t becomes t + 1 and 0 stands for "nothing", whose end is
    0.0; each action is (its kind's index in ``kinds``, its rank's previous action, its input, sent between
    ranks)."""
    order, last = steps
    if any(len(inputs) > 1 for _, _, _, inputs in order):
        return None
    new = {i: t + 1 for t, (i, _, _, _) in enumerate(order)}
    kinds = tuple(sorted({kind for _, kind, _, _ in order}))
    index = {kind: k for k, kind in enumerate(kinds)}
    actions = tuple(
        (index[kind], new.get(before, 0), *((new[inputs[0][0]], inputs[0][1]) if inputs else (0, False)))
        for _, kind, before, inputs in order
    )
    return kinds, actions, tuple(new.get(i, 0) for i in last)


def _replay_flat(flat: tuple, seconds: dict[str, float], send_s: float, rerun_s: Sequence[float] = ()) -> list[float]:
    """:func:`_replay` of :func:`_flat`'s form, the same floats: each action starts at the later of its rank's
    previous end and its input's arrival (0.0 for none, as the sentinel's end), then adds its seconds."""
    kinds, actions, last = flat
    durations = [_seconds_of(key, seconds, rerun_s) for key in kinds]
    end = [0.0]
    append = end.append
    if send_s == 0.0:  # an arrival is its input's end: no end is -0.0, so end + 0.0 is that float
        for k, before, j, _ in actions:
            start, arrive = end[before], end[j]
            append((arrive if arrive > start else start) + durations[k])
    else:
        for k, before, j, sent in actions:
            start, arrive = end[before], end[j] + send_s if sent else end[j]
            append((arrive if arrive > start else start) + durations[k])
    return [end[t] for t in last]


def _steps(order: Sequence[Sequence[Action]], *, place: Sequence[int], apart: bool) -> tuple:
    """(the actions in an order every input is made before it is read: (id, kind, the rank's previous id,
    ((input id, sent between ranks), ...)), each rank's last id), for a replay with any durations."""
    order = [_unpaired(actions, {} if apart else {"FB": 0.0, "F": 1.0}) for actions in order]
    ids = [(rank, action) for rank, actions in enumerate(order) for action in actions]
    made = {result: i for i, (_, action) in enumerate(ids) for result in _produces(action)}
    last, prev, inputs = [-1] * len(order), [], []
    for i, (rank, action) in enumerate(ids):
        prev.append(last[rank])
        last[rank] = i
        needs = _needs(action, chunks=len(place))
        assert all(n in made for n in needs), "the schedule's order deadlocked"
        inputs.append(tuple((made[n], place[n[1]] != rank) for n in needs))
    waits = [[j for j, _ in inputs[i]] + ([prev[i]] if prev[i] >= 0 else []) for i in range(len(ids))]
    return tuple(_topological(ids, prev, inputs, waits)), tuple(last)


def _topological(ids: list, prev: list, inputs: list, waits: list) -> list:
    """Kahn's order of the actions over ``waits`` (each action's rank predecessor and inputs)."""
    after: list[list[int]] = [[] for _ in ids]
    left = [len(w) for w in waits]
    for i, w in enumerate(waits):
        for j in w:
            after[j].append(i)
    ready, out = [i for i, n in enumerate(left) if n == 0], []
    while ready:
        i = ready.pop()
        out.append((i, _key(ids[i][1]), prev[i], inputs[i]))
        for k in after[i]:
            left[k] -= 1
            if not left[k]:
                ready.append(k)
    assert len(out) == len(ids), "the schedule's order deadlocked"
    return out


def _replay(steps: tuple, *, seconds: dict[str, float], send_s: float, rerun_s: Sequence[float] = ()) -> list[float]:
    order, last = steps
    end = [0.0] * len(order)
    for i, kind, before, inputs in order:
        start = end[before] if before >= 0 else 0.0
        for j, sent in inputs:
            arrive = end[j] + send_s if sent else end[j]
            if arrive > start:
                start = arrive
        end[i] = start + _seconds_of(kind, seconds, rerun_s)
    return [end[i] if i >= 0 else 0.0 for i in last]


def replay_bubble_s(
    *, schedule: str, pp: int, m: int, f: float, b: float, w: float, rerun_s: tuple[float, float] = (0.0, 0.0),
    rank: int = 0,
) -> float:  # fmt: skip
    """The idle time of the step beyond a rank's own work, m (F + B + W) of the whole stage and its re-runs
    (``f``, ``b``, ``w``: stage ``rank``'s two chunks together without re-runs, split evenly between them;
    ``rerun_s``: one re-run of its chunks ``rank`` and 2p - 1 - rank), each backward with its own re-runs
    (cost/pp/reruns.py v_rerun_units: two where B and W split it, one where it runs whole)."""
    units, reruns_s = v_rerun_units(schedule, pp=pp, m=m, rank=rank, rerun_s=rerun_s)
    span = replay_span_s(schedule=schedule, pp=pp, m=m, f=f / 2, b=b / 2, w=w / 2, rerun_s=units)
    return max(0.0, span - m * (f + b + w) - reruns_s)


def v_forward_share(parts: list[tuple[float, float, float]]) -> float:
    """A floor on forward_s / micro_batch_s (cost/stages.py) of any stage built from ``parts`` ((forward, backward,
    the most its recomputation re-runs) seconds of each block and of the outside nodes).

    With a stage's sums F, B, R and its collectives c >= 0: forward_s = F (F + B + c) / (F + B) and micro_batch_s
    = F + B + R + c, so their ratio is F / (F + B) times (F + B + c) / (F + B + R + c) >= (F + B) / (F + B + R):
    at least F / (F + B + R), a ratio of sums, at least the least of the parts' own ratios."""
    return min((f / (f + b + r) for f, b, r in parts if f + b + r > 0), default=0.0)


@lru_cache(maxsize=None)  # one per (schedule, pp, m, rank) a search meets: a bound of 1,024 thrashed
def held_states(*, schedule: str, pp: int, m: int, rank: int) -> tuple[tuple[int, int, int], ...]:
    """Every (chunks whose activations ``rank`` holds, of them those whose B ran and W did not, tensors its
    finished sends still hold, gradients too) no other state of its order exceeds in all three: one of them is the peak
    whatever a chunk's activations, kept output gradients and boundary tensor weigh, when the rank's two
    chunks weigh the same (:func:`autoplan.cost.pp.rank_memory.rank_states`, which counts them apart)."""
    states = rank_states(schedule=schedule, pp=pp, virtual_stages=2, m=m, rank=rank)
    return frontier([(a + b, ka + kb, sent + grads) for a, b, ka, kb, sent, grads, _loss in states])


def held_at_peak(*, schedule: str, pp: int, m: int, rank: int) -> tuple[int, int]:
    """The (held, kept) of the :func:`held_states` state with the most chunks held (and of those the most
    gradients kept, then sent), memoised. The greatest of a set's (held, kept, sent) in that order is at most no
    other, so it is the greatest of the frontier's: it is taken from the walk's rows (rank_memory.py
    ``rank_rows``) without the frontier, with the rank's other floors (rank_memory.py ``rank_floors``)."""
    return rank_floors(schedule=schedule, pp=pp, virtual_stages=2, m=m, rank=rank).held_at_peak
