"""Which expert layouts the search offers (docs/ilp.md, section 4; autoplan/types/expert_layout.py).

For one (dp, tp, cp) and the ep degrees the model's MoE layers allow (cost/moe/experts.py ``ep_options``):

- ``ep`` divides dp, ``expert_tp = 1``, tp = cp = 1: expert parallelism folded over the dp ranks, which
  every runtime that runs experts runs (autoplan's executor too);
- the experts' own layout beside tp > 1 (ep, or ``expert_tp`` dividing tp, with ``ep * expert_tp``
  dividing dp x tp, cp = 1): MoE Parallel Folding, only for a runtime that runs it
  (:data:`FOLDING_RUNTIMES`); the search then pairs it with sequence parallelism only (the Plan's rule);
  expert_tp > 1 not for experts with biases, which Megatron-Core refuses at expert_tp > 1 (and autoplan's
  executor splits only the bias-free projections, autoplan/execute/expert_tp.py);
- autoplan's executor runs that layout at ZeRO 0 and 1 only (autoplan/execute/expert_parallel.py), so there it
  is offered without ZeRO-2/3 (:func:`zero_runs`).

``--fix expert_tp=N`` pins the experts' tensor-parallel degree; a pin no runtime layout can take is one sentence.
"""

from __future__ import annotations

from typing import Any

from autoplan.cost import moe_limits
from autoplan.errors import PlanError

#: Runtimes that run MoE Parallel Folding: Megatron-Core (``--expert-tensor-parallel-size``,
#: ``--expert-model-parallel-size`` beside ``--tensor-model-parallel-size``; Liu et al. 2025) and autoplan's
#: executor (at ZeRO 0 and 1: :data:`ZERO_1_FOLDING`); torchtitan 0.3's config has no expert tensor parallelism.
FOLDING_RUNTIMES = ("megatron", "autoplan")
#: Runtimes that fold the experts' layout over tp ranks at ZeRO 0 and 1 only (its sharded optimizer steps the
#: experts over edp; FSDP2 does not shard them yet): autoplan's executor.
ZERO_1_FOLDING = ("autoplan",)
FOLDED_ZERO_MAX = 1


def runs_folding(runtime: str) -> bool:
    """Whether ``runtime`` runs the experts' own layout beside tp > 1, or expert_tp > 1."""
    return runtime in FOLDING_RUNTIMES


def layout_options(
    *, dp: int, tp: int, cp: int, eps: tuple[int, ...], fixes: dict, runtime: str, etp_ok: Any = True
) -> list[tuple[int, int]]:
    """(ep, expert_tp) pairs for one (dp, tp, cp) (module docstring), narrowed by the ep and expert_tp pins;
    ``etp_ok(e)`` says whether the experts take expert_tp ``e`` (:func:`expert_tp_ok`; True: any)."""
    pairs = [(ep, 1) for ep in eps if dp % ep == 0 and (ep == 1 or tp == cp == 1)]
    zero_refused = runtime in ZERO_1_FOLDING and tp > 1 and fixes.get("zero", 0) > FOLDED_ZERO_MAX
    if runs_folding(runtime) and cp == 1 and eps != (1,) and not zero_refused:
        etps = [e for e in range(1, tp + 1) if tp % e == 0 and (e == 1 or etp_ok is True or etp_ok(e))]
        folded = [(ep, e) for ep in eps for e in etps if ep * e > 1 and (dp * tp) % (ep * e) == 0]
        pairs += [pair for pair in folded if pair not in pairs]
    if "ep" in fixes:
        pairs = [p for p in pairs if p[0] == fixes["ep"]]
    if "expert_tp" in fixes:
        pairs = [p for p in pairs if p[1] == fixes["expert_tp"]]
    return pairs


def needs_sequence_parallel(*, tp: int, ep: int, expert_tp: int) -> bool:
    """Whether the layout folds over tp ranks, which then must hold different tokens (types/expert_layout.py)."""
    return tp > 1 and ep * expert_tp > 1


def zero_runs(deg: Any, zero: int, *, runtime: str) -> bool:
    """Whether ``runtime`` runs ZeRO stage ``zero`` with the search's ``Degrees`` ``deg``: autoplan's executor
    folds the experts' layout over tp ranks at ZeRO 0 and 1 only (module docstring)."""
    return zero <= FOLDED_ZERO_MAX or runtime not in ZERO_1_FOLDING or not folds(deg)


def check_layout_pin(fixes: dict, *, runtime: str, moe: bool) -> None:
    """An expert_tp pin, or an ep pin beside a tp pin, that the runtime or the model cannot take: one sentence."""
    etp = fixes.get("expert_tp", 1)
    folded = etp > 1 or (fixes.get("ep", 1) > 1 and fixes.get("tp", 1) > 1)
    pin = f"expert_tp={etp}" if etp > 1 else "ep with tp > 1"
    if folded and not moe:
        raise PlanError(f"--fix expert_tp={etp} needs a Mixture-of-Experts model with grouped experts; drop the pin.")
    if folded and runtime in ZERO_1_FOLDING and fixes.get("zero", 0) > FOLDED_ZERO_MAX:
        raise PlanError(
            f"--fix {pin} and zero={fixes['zero']}: runtime '{runtime}' runs the experts' own layout beside tp > 1 "
            "at zero=0 and zero=1 only; plan with --runtime megatron to export it with ZeRO-2/3 (Megatron-Core's "
            "MoE Parallel Folding), or drop one pin."
        )
    if folded and not runs_folding(runtime):
        raise PlanError(
            f"--fix {pin}: runtime '{runtime}' runs expert parallelism at tp = 1 only; plan with --runtime megatron "
            "or autoplan to run the experts' own layout (MoE Parallel Folding), or drop the pin."
        )
    if folded and fixes.get("sp") is False:
        raise PlanError(
            "--fix sp=off with the experts' own layout beside tp > 1: each rank routes the tokens it holds, "
            "which differ across tp ranks only under sequence parallelism; drop one pin."
        )


def held_floor(*, params: float, experts: float, deg: Any, zdp: int) -> float:
    """A floor of the parameters one rank steps (the search's bound): ``1 / (ep expert_tp)`` of the routed
    experts, and then everything over tp x pp x ZeRO's dp (``zdp``); ZeRO shards the experts over edp = dp tp / (ep
    expert_tp) (types/expert_layout.py), so a rank steps at least ``1 / (dp tp)`` of them."""
    return (params - experts + experts / (deg.ep * deg.expert_tp)) / (deg.tp * zdp * deg.pp)


def folds(deg: Any) -> bool:
    """:func:`needs_sequence_parallel` of a search's ``Degrees``."""
    return needs_sequence_parallel(tp=deg.tp, ep=deg.ep, expert_tp=deg.expert_tp)


def placement_degrees(deg: Any) -> dict:
    """The degrees of a search's ``Degrees`` that CostModel.placement reads."""
    return dict(tp=deg.tp, dp=deg.dp, ep=deg.ep, pp=deg.pp, expert_tp=deg.expert_tp)


def limits(graph: Any, fixes: dict, *, runtime: str) -> Any:
    """What the model's MoE layers allow the search (cost ``moe_limits``: raises for an ep or pp pin they
    refuse), after refusing an expert layout pin the runtime cannot take (:func:`check_layout_pin`)."""
    found = moe_limits(graph, fixes)
    check_layout_pin(fixes, runtime=runtime, moe=found.eps != (1,))
    etp = fixes.get("expert_tp", 1)
    if etp > 1 and found.expert_ffn and found.expert_ffn % etp:
        raise PlanError(
            f"--fix expert_tp={etp} does not divide this model's expert FFN width {found.expert_ffn}; pin a divisor."
        )
    if etp > 1 and found.expert_biases:
        raise PlanError(
            f"--fix expert_tp={fixes['expert_tp']}: this model's routed experts hold biases, and Megatron-Core runs "
            "expert tensor parallelism only without them ('Bias in Moe is only supported when ETP==1'); drop the pin."
        )
    return found


def expert_tp_ok(limits: Any) -> Any:
    """Whether the model's experts take an expert_tp ``e``: no biases (Megatron-Core refuses them at e > 1) and
    ``e`` dividing every expert's FFN width (``limits``: cost ``moe_limits``)."""
    return lambda e: not limits.expert_biases and limits.expert_ffn % e == 0
