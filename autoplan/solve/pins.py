"""The user's pins on the search space (``--fix dp=32,tp=8,sp=on,...``), parsed and typed.

Each key names one choice of the outer search (solve/space.py) and takes the values that choice
can have: a positive integer for the degrees (``cp`` the context-parallel one), the micro-batch size
and the virtual stages; 0-3 for ``zero``; a rank or ``off`` for ``powersgd``; on/off (true/false) for
``sp``, ``tp_overlap``, ``param_gather`` (ZeRO-1's weight all-gather under the next forward) and
``compile`` (torch.compile per block, Plan.compile); one of the plan's names for ``recompute``,
``precision``, ``schedule`` (``interleaved`` is ``interleaved_1f1b``), ``reduce`` and ``cp_variant``
(allgather, ring, ulysses), and ``offload`` (none, optimizer, full: Plan.offload). Anything else is
refused in one sentence.
"""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.plan import CP_VARIANTS, OFFLOADS, PRECISIONS, RECOMPUTE, REDUCE_DTYPES

FIX_KEYS = (
    "dp",
    "ep",
    "tp",
    "pp",
    "cp",
    "mbs",
    "zero",
    "recompute",
    "schedule",
    "sp",
    "precision",
    "v",
    "tp_overlap",
    "reduce",
    "powersgd",
    "cp_variant",
    "param_gather",
    "compile",
    "offload",
)
_INT_KEYS = ("dp", "ep", "tp", "pp", "cp", "mbs", "zero", "v", "powersgd")
_SCHEDULE_ALIASES = {
    "interleaved": "interleaved_1f1b",
    "interleaved_1f1b": "interleaved_1f1b",
    "1f1b": "1f1b",
    "gpipe": "gpipe",
}
_BOOL = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


def parse_fixes(text: str | list[str] | None) -> dict[str, object]:
    """``"dp=32,tp=8,sp=on"`` (or a list of such strings) -> typed pins; one sentence on error."""
    items = [text] if isinstance(text, str) else list(text or [])
    fixes: dict[str, object] = {}
    for chunk in items:
        for pair in filter(None, (p.strip() for p in chunk.split(","))):
            key, sep, value = pair.partition("=")
            key, value = key.strip().lower(), value.strip().lower()
            if not sep or key not in FIX_KEYS:
                raise PlanError(f"--fix '{pair}' is not KEY=VALUE with KEY one of {', '.join(FIX_KEYS)}.")
            fixes[key] = _typed(key, value)
    return fixes


def _typed(key: str, value: str) -> object:
    if key in _INT_KEYS:
        if key == "powersgd" and value in ("off", "none"):
            return 0
        floor = 0 if key in ("zero", "powersgd") else 1
        if not value.isdigit() or int(value) < floor or (key == "zero" and int(value) > 3):
            expected = {"zero": "0, 1, 2 or 3", "powersgd": "a rank >= 1, or off"}.get(key, "a positive integer")
            raise PlanError(f"--fix {key}={value} is not valid; expected {expected}.")
        return int(value)
    if key in ("sp", "tp_overlap", "param_gather", "compile"):
        if value not in _BOOL:
            raise PlanError(f"--fix {key}={value} is not valid; expected on or off.")
        return _BOOL[value]
    choices = {
        "recompute": RECOMPUTE,
        "precision": PRECISIONS,
        "schedule": tuple(_SCHEDULE_ALIASES),
        "reduce": REDUCE_DTYPES,
        "cp_variant": CP_VARIANTS,
        "offload": OFFLOADS,
    }[key]
    if value not in choices:
        raise PlanError(f"--fix {key}={value} is not valid; expected one of {', '.join(choices)}.")
    return _SCHEDULE_ALIASES[value] if key == "schedule" else value
