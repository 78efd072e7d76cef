"""Top-k gradient sparsification in the search space (types/grad_compression.py, cost/dp/topk.py): where
the executor runs DDP, the search tries top-k at each of ``TOPK_RATIOS`` (DGC's 0.1% and 1%, Lin et al.
2018) under --allow-lossy, or the pinned ratio (``--fix grad_compression=topk,topk_ratio=0.01``); a ratio
of 1 sends every entry, is exact and needs no --allow-lossy. docs/ilp.md, section 4.
"""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.grad_compression import TOPK_RATIOS


def topk_ratios(fixes: dict, *, allow_lossy: bool) -> tuple[float, ...]:
    """The ratios the search tries (module docstring): none where compression is pinned to another kind."""
    if fixes.get("grad_compression", "topk") != "topk" or fixes.get("powersgd"):
        return ()
    pinned = fixes.get("topk_ratio")
    if pinned is not None:
        return (pinned,) if allow_lossy or pinned >= 1 else ()
    return TOPK_RATIOS if allow_lossy else ()


def keep_pinned(options: list, fixes: dict) -> list:
    """The gradient-sync options (solve/space.py GradSync) of the pinned compression and ratio."""
    if "grad_compression" in fixes:
        options = [o for o in options if o.compression == fixes["grad_compression"]]
    if "topk_ratio" in fixes:
        options = [o for o in options if o.compression == "topk" and o.ratio == fixes["topk_ratio"]]
    return options


def lossy_topk_pins(fixes: dict) -> list[str]:
    """The pins that ask for a lossy top-k (--allow-lossy's gate, solve/space.py check_lossy_pins)."""
    ratio = fixes.get("topk_ratio")
    if ratio is not None and ratio < 1:
        return [f"topk_ratio={ratio:g}"]
    if ratio is None and fixes.get("grad_compression") == "topk":
        return ["grad_compression=topk"]
    return []


def check_compression_pins(fixes: dict) -> None:
    """Pins that contradict each other: one sentence."""
    kind = fixes.get("grad_compression")
    if "topk_ratio" in fixes and kind not in (None, "topk"):
        raise PlanError(
            f"--fix topk_ratio with grad_compression={kind}: the ratio is top-k's; pin grad_compression=topk."
        )
    if fixes.get("powersgd") and kind not in (None, "powersgd"):
        raise PlanError(f"--fix powersgd with grad_compression={kind}: pin one compression.")
