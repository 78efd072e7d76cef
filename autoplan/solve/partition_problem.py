"""The pipeline partition's problem and answer (solve/pipeline.py's module docstring states them)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from autoplan.types.layout import chunks_of_stage, sent_from_prior, stage_of_chunk

INF = float("inf")


@dataclass
class PartitionProblem:
    layer_time_s: list[float]
    layer_static_bytes: list[float]
    layer_activation_bytes: list[float]
    pp: int
    extra_time_s: list[float]  # per stage
    extra_bytes: list[float]  # per stage
    in_flight: list[float]  # per stage, in units of the stage's layers
    p2p_s: float
    capacity_bytes: float
    virtual_stages: int = 1  # chunks per stage (autoplan/types/layout.py)
    cut_s: list[float] | None = None  # per boundary i (before layer i, 0..L), its p2p time; None: p2p_s each
    v_shape: bool = False  # chunks placed in a V (autoplan/types/layout.py), else looping

    def __post_init__(self) -> None:
        self._t = np.concatenate([[0.0], np.cumsum(self.layer_time_s)])
        self._m = np.concatenate([[0.0], np.cumsum(self.layer_static_bytes)])
        self._a = np.concatenate([[0.0], np.cumsum(self.layer_activation_bytes)])
        cuts = self.cut_s if self.cut_s is not None else [self.p2p_s] * (self.layers + 1)
        if len(cuts) != self.layers + 1:
            raise ValueError(f"cut_s has {len(cuts)} entries; {self.layers} layers need one per boundary.")
        self._cut = np.asarray(cuts, dtype=float)
        self._sent = list(chunk_sent(self.pp, self.virtual_stages, self.v_shape))
        self._stage_of = chunk_stages(self.pp, self.virtual_stages, self.v_shape)  # each chunk's stage
        self._lists = (self._t.tolist(), self._m.tolist(), self._a.tolist(), self._cut.tolist())  # for totals

    def content_key(self) -> tuple:
        """Everything :meth:`evaluate` reads, as bytes: two problems with equal keys have the same partitions at
        the same values (the memory fields only under a finite capacity; ``p2p_s`` only through the cuts)."""
        key = (self.pp, self.virtual_stages, self.v_shape, self.capacity_bytes, self._cut.tobytes())
        key += (_bytes(self.layer_time_s), _bytes(self.extra_time_s))
        if self.capacity_bytes == INF:
            return key
        memory = (self.layer_static_bytes, self.layer_activation_bytes, self.extra_bytes, self.in_flight)
        return key + tuple(_bytes(xs) for xs in memory)

    @property
    def layers(self) -> int:
        return len(self.layer_time_s)

    @property
    def chunks(self) -> int:
        return self.pp * self.virtual_stages

    def chunks_of(self, stage: int) -> list[int]:
        """The chunks stage ``stage`` runs (autoplan/types/layout.py)."""
        return chunks_of_stage(stage, pp=self.pp, virtual_stages=self.virtual_stages, v_shape=self.v_shape)

    def stage_of(self, chunk: int) -> int:
        return self._stage_of[chunk]

    def sent(self, chunk: int) -> bool:
        """Whether chunk ``chunk`` (0..C) receives from another stage: not the first, not past the last, not the
        V's turn."""
        return self._sent[chunk]

    def neighbours(self, chunk: int) -> int:
        return self.sent(chunk) + self.sent(chunk + 1)

    def uniform_cuts(self) -> bool:
        """Whether every boundary a partition can cut at (1..L-1) costs the same."""
        return len(set(self._cut[1:-1].tolist())) <= 1

    def mean_cut_s(self) -> float:
        return float(self._cut[1:-1].mean()) if self.layers > 1 else 0.0

    def chunk_cuts_s(self, chunk: int, i: int, j: int) -> float:
        """The p2p time of chunk ``chunk`` = layers[i:j]: its receive at i and its send at j."""
        return float(self._cut[i]) * self.sent(chunk) + float(self._cut[j]) * self.sent(chunk + 1)

    def totals(self, bounds: list[int]) -> tuple[list[float], list[float]]:
        """Per stage, T_k and M_k of the module docstring, chunk c being layers[bounds[c]:bounds[c+1]]: in Python
        floats, which round each step as numpy's float64 scalars do (:meth:`chunk_cuts_s`' terms, in its order)."""
        times, used = list(self.extra_time_s), list(self.extra_bytes)
        t, m, a, cut = self._lists
        sent, stage_of = self._sent, self._stage_of
        for c in range(self.chunks):
            k, i, j = stage_of[c], bounds[c], bounds[c + 1]
            times[k] += (t[j] - t[i]) + (cut[i] * sent[c] + cut[j] * sent[c + 1])
            used[k] += m[j] - m[i] + self.in_flight[k] * (a[j] - a[i])
        return times, used

    def evaluate(self, bounds: list[int]) -> float:
        """Slowest stage of the partition with chunk c = layers[bounds[c]:bounds[c+1]] (inf if infeasible)."""
        if len(bounds) != self.chunks + 1 or any(j <= i for i, j in zip(bounds, bounds[1:])):
            return INF
        times, used = self.totals(bounds)
        return INF if any(u > self.capacity_bytes for u in used) else max(times)


@lru_cache(maxsize=1024)
def chunk_stages(pp: int, virtual_stages: int, v_shape: bool) -> tuple[int, ...]:
    """Each chunk's stage (types/layout.py ``stage_of_chunk``), once per placement: a search builds thousands of
    problems of a few dozen placements, each read per chunk by every evaluation."""
    return tuple(stage_of_chunk(c, pp=pp, v_shape=v_shape) for c in range(pp * virtual_stages))


@lru_cache(maxsize=1024)
def stage_neighbours(pp: int, virtual_stages: int, v_shape: bool) -> tuple[int, ...]:
    """Per stage, the cuts its chunks pay (a receive and a send each, where another stage is on the other side:
    :meth:`PartitionProblem.neighbours` summed over :meth:`PartitionProblem.chunks_of`), once per placement."""
    sent = chunk_sent(pp, virtual_stages, v_shape)
    return tuple(
        sum(sent[c] + sent[c + 1] for c in chunks_of_stage(k, pp=pp, virtual_stages=virtual_stages, v_shape=v_shape))
        for k in range(pp)
    )


@lru_cache(maxsize=1024)
def chunk_sent(pp: int, virtual_stages: int, v_shape: bool) -> tuple[bool, ...]:
    """Whether each chunk 0..C receives from another stage (:meth:`PartitionProblem.sent`; chunk C, past the last,
    does not), once per placement: looping, every chunk but the first; in a V, not at its turn either."""
    chunks = range(pp * virtual_stages)
    sent = [sent_from_prior(c, pp=pp, v_shape=True) for c in chunks] if v_shape else [c > 0 for c in chunks]
    return (*sent, False)


@dataclass
class Partition:
    bounds: list[int]  # chunk c runs layers[bounds[c]:bounds[c+1]], on stage_of_chunk(c)
    max_stage_time_s: float


def _bytes(values: list[float]) -> bytes:
    return np.asarray(values, dtype=float).tobytes()
