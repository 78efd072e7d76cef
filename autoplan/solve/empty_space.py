"""Why the space holds no configuration, in one sentence: a pipeline pin on too few blocks, a looped schedule's
chunks on too few blocks, pins that exclude every shape, or a batch no data-parallel degree divides."""

from __future__ import annotations

from typing import Any


def _chunks_pinned(fixes: dict) -> int:
    """The fewest chunks a pinned looped schedule (interleaved 1F1B, a V, or v >= 2) splits the blocks into: pp x v,
    from the pinned pp (else 2) and v (else 2); 0 when no such schedule is pinned."""
    looped = fixes.get("schedule") in ("interleaved_1f1b", "zbv", "dualpipev") or fixes.get("v", 1) >= 2
    return fixes.get("pp", 2) * max(2, fixes.get("v", 2)) if looped else 0


def _interleaved_divides(fixes: dict, layers: int) -> bool:
    """Whether interleaved 1F1B, where pinned (by name or by v >= 2 without a V), has a v >= 2 with pp x v dividing
    the blocks (solve/schedules.py: equal chunks of whole blocks); True where it is not pinned."""
    if fixes.get("schedule") in ("zbv", "dualpipev") or not _chunks_pinned(fixes):
        return True
    pp = fixes.get("pp", 2)
    vs = [fixes["v"]] if "v" in fixes else range(2, layers // pp + 1)
    return any(layers % (pp * v) == 0 for v in vs)


def no_configuration(options: Any, layers: int) -> str:
    """The sentence the search raises when ``options`` leave it no (dp, tp, pp, cp) on a model of ``layers`` blocks."""
    pins = ", ".join(f"{k}={v}" for k, v in options.fixes.items())
    if options.fixes.get("pp", 1) > max(1, layers):
        return (
            f"--fix pp={options.fixes['pp']} needs at least {options.fixes['pp']} blocks to place on stages (repeated "
            f"blocks, or top-level modules that forward() calls once each) and this model has {layers}; "
            f"use pp=1{f' or at most pp={layers}' if layers > 1 else ''}."
        )
    if (chunks := _chunks_pinned(options.fixes)) and chunks > layers:
        return (
            f"--fix {pins} runs {chunks} chunks of whole blocks (pp x v, v >= 2 chunks on each pipeline rank), and "
            f"this model has {layers} blocks; pin schedule=1f1b or gpipe, or a smaller pp."
        )
    if not _interleaved_divides(options.fixes, layers):
        return (
            f"--fix {pins} runs pp x v chunks of equal whole blocks (v >= 2 on each pipeline rank), and no v makes "
            f"pp x v divide this model's {layers} blocks; pin schedule=1f1b, gpipe or zbv, or another pp."
        )
    if pins:
        return (
            f"no configuration of {options.devices} devices and batch {options.batch_size} satisfies --fix {pins}; "
            "relax a pin (dp*tp*pp must equal the devices and dp must divide the batch)."
        )
    return (
        f"no configuration of {options.devices} devices divides the batch of {options.batch_size}; "
        "use a batch divisible by a data-parallel degree."
    )
