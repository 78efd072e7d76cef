"""The user's pins on the search space (``--fix dp=32,tp=8,sp=on,...``), parsed and typed.

Each key names one choice of the outer search (solve/space.py) and takes the values that choice
can have: a positive integer for the degrees (``cp`` the context-parallel one, ``dp_replicate`` HSDP's
replicas), the micro-batch size and the virtual stages; 0-3 for ``zero``; a rank or ``off`` for
``powersgd``; on/off (true/false) for
``sp``, ``tp_overlap``, ``param_gather`` (ZeRO-1's weight all-gather under the next forward) and
``compile`` (torch.compile per block, Plan.compile); one of the plan's names for ``recompute``,
``precision``, ``schedule`` (``interleaved`` is ``interleaved_1f1b``, ``zb`` ``interleaved_zb``; ``zbv``,
``dualpipev``), ``reduce`` and ``cp_variant``
(allgather, ring, ulysses); ``recompute_blocks`` a recompute budget, one count per pipeline chunk
joined by ``/`` (``recompute_blocks=2/1``: the first 2 blocks of chunk 0 and 1 of chunk 1 recompute,
Plan.recompute_blocks), ``offload`` (none, optimizer, full: Plan.offload), ``offload_activations`` (on/off:
Plan.offload_activations), ``expert_tp`` (the experts' tensor-parallel degree, solve/expert_layout.py),
``moe_a2a_overlap`` (on/off: the EP all-to-all beside the other micro-batch's compute, solve/moe_overlap.py),
``sync_every`` (local SGD's H, an integer >= 1) with ``outer_optimizer`` (average, nesterov: solve/local_sgd.py), and
``grad_compression`` (none, powersgd, topk) and ``topk_ratio`` (a fraction in (0, 1], solve/sparsify.py), and
``schedule_steps`` (k >= 1 pipeline schedule steps per optimizer step, types/schedule_steps.py: only pipelined
groups whose micro-batches it divides, with the schedules their m / k runs).
Anything else is refused in one sentence.
"""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.grad_compression import GRAD_COMPRESSIONS
from autoplan.types.local_sgd import OUTER_OPTIMIZERS
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
    "dp_replicate",
    "recompute_blocks",
    "offload",
    "expert_tp",
    "offload_activations",
    "moe_a2a_overlap",
    "sync_every",
    "outer_optimizer",
    "grad_compression",
    "topk_ratio",
    "schedule_steps",
)
_INT_KEYS = ("dp", "ep", "tp", "pp", "cp", "mbs", "zero", "v", "powersgd", "dp_replicate", "expert_tp", "sync_every",
              "schedule_steps")  # fmt: skip
_SCHEDULE_ALIASES = {
    "interleaved": "interleaved_1f1b",
    "interleaved_1f1b": "interleaved_1f1b",
    "1f1b": "1f1b",
    "gpipe": "gpipe",
    "interleaved_zb": "interleaved_zb",
    "zb": "interleaved_zb",
    "zbv": "zbv",
    "dualpipev": "dualpipev",
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
            typed = _typed(key, value)
            if key in fixes and fixes[key] != typed:
                raise PlanError(f"--fix pins {key} twice, to {fixes[key]} and to {typed}; pin it once.")
            fixes[key] = typed
    if "recompute_blocks" in fixes and fixes.get("recompute") == "none":
        raise PlanError(
            "--fix recompute_blocks with recompute=none: the counts say how many blocks recompute; "
            "pin recompute=full or selective, or drop recompute=none."
        )
    return fixes


def _typed(key: str, value: str) -> object:
    if key == "recompute_blocks":
        return _budget(value)
    if key == "topk_ratio":
        return _ratio(value)
    if key in _INT_KEYS:
        if key == "powersgd" and value in ("off", "none"):
            return 0
        floor = 0 if key in ("zero", "powersgd") else 1
        if not value.isdigit() or int(value) < floor or (key == "zero" and int(value) > 3):
            expected = {"zero": "0, 1, 2 or 3", "powersgd": "a rank >= 1, or off"}.get(key, "a positive integer")
            raise PlanError(f"--fix {key}={value} is not valid; expected {expected}.")
        return int(value)
    if key in ("sp", "tp_overlap", "param_gather", "compile", "offload_activations", "moe_a2a_overlap"):
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
        "outer_optimizer": OUTER_OPTIMIZERS,
        "grad_compression": GRAD_COMPRESSIONS,
    }[key]
    if value not in choices:
        raise PlanError(f"--fix {key}={value} is not valid; expected one of {', '.join(choices)}.")
    return _SCHEDULE_ALIASES[value] if key == "schedule" else value


def _budget(value: str) -> list[int]:
    """``"2/1"`` -> [2, 1]: blocks recomputed per pipeline chunk."""
    counts = value.split("/")
    if not all(count.isdigit() for count in counts):
        raise PlanError(
            f"--fix recompute_blocks={value} is not valid; expected one count >= 0 per pipeline chunk, "
            "joined by '/' (recompute_blocks=2/1)."
        )
    return [int(count) for count in counts]


def check_budget_pin(fixes: dict, *, layers: int) -> None:
    """A pinned budget that recomputes more blocks than the model has: one sentence."""
    budget = fixes.get("recompute_blocks", [])
    if sum(budget) > layers:
        raise PlanError(
            f"--fix recompute_blocks={'/'.join(map(str, budget))} recomputes {sum(budget)} blocks and this model has "
            f"{layers}; pin at most {layers} in all."
        )


def _ratio(value: str) -> float:
    """``"0.01"`` -> 0.01: top-k's fraction of each bucket, in (0, 1]."""
    try:
        ratio = float(value)
    except ValueError:
        ratio = -1.0
    if not (0 < ratio <= 1):
        raise PlanError(f"--fix topk_ratio={value} is not valid; expected a fraction in (0, 1], e.g. 0.01.")
    return ratio
