"""Host dispatch overhead per op: the slope of a chain of tiny ops against its length
(docs/profile-format.md, "Host dispatch overhead").

An op on 8 fp32 elements does next to no arithmetic, so a chain of N of them measures what every
op pays however small: Python, the dispatcher, autograd, and on a GPU the kernel launch. With a
fixed cost c and o per op, timed at the ``LENGTHS`` 8 and 72:

    t(N) = c + N * o,    o = slope of t against N
    forward_s  = slope(forward with autograd recording)
    backward_s = slope(forward + torch.autograd.grad of the input and every weight) - forward_s

Each op kind in ``KINDS`` (mul, add, linear, layer_norm, gelu, transpose) gets its own chain; each
number is the median over the kinds, negative slopes clipped to 0. With ``concurrent=True`` all
ranks time each chain at once, like the compute sweep.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from autoplan.errors import ProfileError
from autoplan.profile.measure.timing import median_time_s

#: Chain lengths timed (ops per chain).
LENGTHS = (8, 72)
#: Elements of the tiny activation (1 x WIDTH).
WIDTH = 8
KINDS = ("mul", "add", "linear", "layer_norm", "gelu", "transpose")


def per_op_slope_s(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares slope of time against chain length over (N, t) points (>= 2 lengths)."""
    lengths = [float(n) for n, _ in points]
    if len(set(lengths)) < 2:
        raise ProfileError(
            f"chain lengths {sorted(set(lengths))} cannot give a per-op slope; expected points at two or more lengths."
        )
    return statistics.linear_regression(lengths, [t for _, t in points]).slope


def _weights(kind: str, length: int, device: torch.device) -> list[torch.Tensor]:
    """Each op's own parameters (a model's layers each have theirs), requiring grad."""

    def param(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * scale).requires_grad_()

    if kind == "linear":  # weights scaled by 1/WIDTH so a long chain stays O(1): no inf, no denormals
        return [t for _ in range(length) for t in (param(WIDTH, WIDTH, scale=1.0 / WIDTH), param(WIDTH))]
    if kind == "layer_norm":
        return [t for _ in range(length) for t in (param(WIDTH), param(WIDTH))]
    return []


def _op(kind: str, device: torch.device) -> Callable[[torch.Tensor, list[torch.Tensor], int], torch.Tensor]:
    """One op of ``kind``: (activation, chain weights, position) -> activation."""
    other = torch.randn(1, WIDTH, device=device)
    ops: dict[str, Callable[[torch.Tensor, list[torch.Tensor], int], torch.Tensor]] = {
        "mul": lambda x, w, i: x * 1.0001,
        "add": lambda x, w, i: x + other,
        "linear": lambda x, w, i: F.linear(x, w[2 * i], w[2 * i + 1]),
        "layer_norm": lambda x, w, i: F.layer_norm(x, (WIDTH,), w[2 * i], w[2 * i + 1]),
        "gelu": lambda x, w, i: F.gelu(x),
        "transpose": lambda x, w, i: x.transpose(0, 1),
    }
    return ops[kind]


def chain_calls(kind: str, length: int, device: torch.device) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(forward, forward + backward) of a chain of ``length`` ops of ``kind``."""
    x = torch.randn(1, WIDTH, device=device, requires_grad=True)
    weights, op = _weights(kind, length, device), _op(kind, device)
    inputs = [x, *weights]

    def forward() -> torch.Tensor:
        y = x
        for i in range(length):
            y = op(y, weights, i)
        return y

    def step() -> Any:
        y = forward()
        return torch.autograd.grad(y, inputs, torch.ones_like(y))

    return forward, step


def kind_slopes_s(
    kind: str, *, device: torch.device, budget_s: float, concurrent: bool = False, lengths: Sequence[int] = LENGTHS
) -> tuple[float, float]:
    """(forward slope, forward + backward slope) in seconds per op for one op kind."""
    forward_points, step_points = [], []
    with torch.enable_grad():
        for length in lengths:
            forward, step = chain_calls(kind, length, device)
            forward_points.append(
                (length, median_time_s(forward, device=device, budget_s=budget_s, concurrent=concurrent))
            )
            step_points.append((length, median_time_s(step, device=device, budget_s=budget_s, concurrent=concurrent)))
    return per_op_slope_s(forward_points), per_op_slope_s(step_points)


def time_op_overhead(
    *,
    device: torch.device | None = None,
    budget_s: float = 0.05,
    concurrent: bool = False,
    kinds: Sequence[str] = KINDS,
    lengths: Sequence[int] = LENGTHS,
) -> tuple[float, float]:
    """(forward_s, backward_s) host overhead per op on ``device`` (default CPU), median over
    ``kinds`` (module docstring). ``concurrent``: timed by all ranks of the group at once."""
    device = device or torch.device("cpu")
    slopes = [
        kind_slopes_s(kind, device=device, budget_s=budget_s, concurrent=concurrent, lengths=lengths) for kind in kinds
    ]
    forward_s = max(0.0, statistics.median(fwd for fwd, _ in slopes))
    backward_s = max(0.0, statistics.median(step - fwd for fwd, step in slopes))
    return forward_s, backward_s


def describe(*, kinds: Sequence[str] = KINDS, lengths: Sequence[int] = LENGTHS) -> str:
    """How the overhead was measured, for the profile's ``source``."""
    return (
        f"slope of time vs chain length ({' and '.join(map(str, lengths))} ops) of 1x{WIDTH} fp32 ops with autograd, "
        f"forward and forward + autograd.grad, median over {', '.join(kinds)}"
    )
