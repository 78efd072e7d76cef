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


#: what each pinned pipeline schedule asks of one step's micro-batch count m (solve/schedules.py)
MICROBATCH_RULES = {
    "1f1b": "at least pp = {pp} micro-batches a step (torch's Schedule1F1B refuses fewer)",
    "interleaved_1f1b": "a number of micro-batches a step that pp = {pp} divides",
    "interleaved_zb": "at least pp = {pp} micro-batches a step, in torch's rounds of max(1, m // pp) that divide them",
    "zbv": "at least 2 pp = {two_pp} micro-batches a step (one per chunk)",
    "dualpipev": "at least 2 pp = {two_pp} micro-batches a step (one per chunk)",
}


def _microbatches_refused(options: Any, layers: int, pins: str) -> str | None:
    """The sentence when the pinned schedule runs none of the micro-batch counts the batch gives (at any dp that
    divides both the devices left by pp and the batch, every mbs); None when some count runs, or nothing pins it."""
    from autoplan.solve.schedules import schedule_options

    schedule, pp = options.fixes.get("schedule"), options.fixes.get("pp", 1)
    if schedule not in MICROBATCH_RULES or pp < 2 or options.devices % pp:
        return None
    batch = options.batch_size
    counts = {m for dp in _divisors(options.devices // pp) if batch % dp == 0 for m in _divisors(batch // dp)}
    runtime = getattr(options, "runtime", "autoplan")
    if not counts or any(
        schedule_options(pp=pp, layers=layers, num_microbatches=m, fixes=options.fixes, runtime=runtime) for m in counts
    ):
        return None
    *fewer, most = sorted(counts)
    gives = f"{', '.join(map(str, fewer))} or {most}" if fewer else str(most)
    return (
        f"--fix {pins} needs {MICROBATCH_RULES[schedule].format(pp=pp, two_pp=2 * pp)}, and batch {batch} "
        f"on {options.devices} devices gives {gives}; use a batch that gives such a count, or pin schedule=gpipe."
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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
    if refused := _microbatches_refused(options, layers, pins):
        return refused
    if options.fixes.get("pp") == 1 and options.fixes.get("schedule", "1f1b") not in ("1f1b", "gpipe"):
        return (
            f"--fix {pins}: schedule={options.fixes['schedule']} orders the micro-batches of a pipeline, and pp=1 is "
            "no pipeline; pin pp >= 2 with it, or drop the schedule."
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
