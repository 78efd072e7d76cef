"""--verify over several steps: a single-process reference that follows the run step by step
(docs/executor.md, "CLI", ``--verify``).

It compares the :func:`verify_steps` steps that change the weights (autoplan/execute/job/contract.py).
Before step k the reference takes the weights the run holds and steps its own optimizer, so rounding
does not compound.

PowerSGD is judged against the same compression. torch's hook (Vogels et al. 2019), with ``M_i``
rank i's gradient plus its error feedback ``e_i``:

    P = orth(sum_i M_i Q),   Q = sum_i M_i^T P / dp,   M' = P Q^T = P P^T Mbar,   e_i = M_i - M'

is linear in the ``M_i``, so the reference replays it on its own mean gradient ``g``:

    Mbar = g + ebar,   expected = U U^T Mbar,   ebar <- Mbar - M'

``U`` an orthonormal basis of ``M'``'s columns (singular values below ``RANK_CUTOFF`` of the
largest are rounding); everything but the subspace is checked at the fp32 tolerance. Top-k with error
feedback is judged by its conservation (autoplan/execute/job/topk_reference.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from autoplan.execute.data_parallel import dp_mode
from autoplan.execute.job import verify
from autoplan.execute.job.contract import verify_steps, why_steps
from autoplan.execute.job.reference_buffers import RankBuffers
from autoplan.execute.job.topk_reference import approximation, topk_expected
from autoplan.execute.job.verify_buffers import expected_buffers
from autoplan.types.plan import Plan

#: singular values of a compressed gradient below this fraction of its largest are rounding
RANK_CUTOFF = 1e-5


@dataclass
class StepCheck:
    step: int
    diffs: list[verify.Difference]
    compressed: bool = False
    approximate: str = ""  # why the step is approximate by design (top-k below 1: topk_reference.py)


@dataclass
class Reference:
    """The reference model (a copy of the run's, same initial weights), prepared as the run is;
    :meth:`check` compares one step of the run with it (module docstring)."""

    model: nn.Module
    plan: Plan
    loss_fn: Callable
    policy: Any
    optimizer_fn: Callable | None = None
    masters: dict[str, nn.Parameter] = field(default_factory=dict)
    optimizer: Any = None
    feedback: dict[str, torch.Tensor] = field(default_factory=dict)  # PowerSGD's or top-k's mean error feedback
    checks: list[StepCheck] = field(default_factory=list)
    buffers: RankBuffers | None = None  # each dp rank's buffers (reference_buffers.py)

    def __post_init__(self):
        self.buffers = RankBuffers(self.model, dp=self.plan.dp, synced_each_step=dp_mode(plan=self.plan) == "ddp")
        fp32 = dp_mode(plan=self.plan) == "zero1"  # ZeRO-1 steps fp32 master slices (execute/zero.py)
        weights = verify.initial_weights(self.model, fp32_masters=fp32)
        self.masters = {name: nn.Parameter(w) for name, w in weights.items()}
        verify.prepare_reference(self.model, plan=self.plan, policy=self.policy)

    @property
    def done(self) -> bool:
        return len(self.checks) >= verify_steps(self.plan)

    def check(self, *, trainer, inputs: tuple, target: Any, loss: float, step: int) -> StepCheck:
        """Compare the step the run just took (from the weights it held before) with the reference's
        (a collective: every rank calls it)."""
        self._load_masters()
        ref_loss, grads = verify.reference_step(
            model=self.model,
            plan=self.plan,
            inputs=inputs,
            target=target,
            loss_fn=self.loss_fn,
            policy=self.policy,
            loss_scale=trainer.last_loss_scale,
            prepared=True,
            buffers=self.buffers,
        )
        state = getattr(trainer.model, "powersgd_state", None)
        compressed = state is not None and state.iter - 1 >= state.start_powerSGD_iter  # iter counts steps done
        if state is not None:
            run = verify.gathered_grads(trainer)
            grads = self._powersgd_expected(grads, run=run, state=state, compressed=compressed)
        topk = getattr(trainer.model, "topk_state", None)
        if topk is not None:
            grads = topk_expected(grads, trainer=trainer, state=topk, feedback=self.feedback)
        approximate = approximation(self.plan)
        compressed = compressed or bool(approximate)
        before = {name: self.masters[name].detach().clone() for name in grads}
        updated = self._step(grads)
        weights = verify.gathered_weights(trainer)
        frozen = {name: self.masters[name].detach() for name in self._frozen() if name in self.masters}
        diffs = verify.compare(
            trainer=trainer,
            loss=loss,
            ref_loss=ref_loss,
            ref_grads=grads,
            initial=before,
            ref_updated=updated,
            weights=weights,
            ref_buffers=expected_buffers(self.model, self.buffers, trainer.mesh.get_local_rank("dp")),
            frozen=frozen,
        )
        self._follow(trainer, weights)
        self.checks.append(StepCheck(step=step, diffs=diffs, compressed=compressed, approximate=approximate))
        return self.checks[-1]

    def _frozen(self) -> list[str]:
        """The parameters the model leaves frozen (``requires_grad=False``): no step may change them."""
        return [name for name, param in self.model.named_parameters() if not param.requires_grad]

    def _load_masters(self) -> None:
        """The reference model's parameters := the fp32 masters (cast to its own dtype)."""
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(self.masters[name].to(param.device))

    def _step(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step of the run's optimizer on the masters with ``grads``; the updated weights."""
        from autoplan.execute.api import default_optimizer

        # over every parameter, as the run's optimizer is: one that gets its first gradient in a later
        # step (an expert no token reached before) takes its first step then, in both
        if self.optimizer is None:
            self.optimizer = (self.optimizer_fn or default_optimizer)(list(self.masters.values()))
        for name, master in self.masters.items():
            master.grad = grads[name].to(master.device, master.dtype) if name in grads else None
        self.optimizer.step()
        return {name: self.masters[name].detach().clone() for name in grads}

    def _follow(self, trainer, weights: dict[str, torch.Tensor]) -> None:
        """The masters := the weights the run holds after this step, from one rank per stage
        (dp, cp and tp rank 0: the others hold the same gathered values)."""
        coordinate = {axis: trainer.mesh.get_local_rank(axis) for axis in ("dp", "cp", "tp")}
        mine = weights if not any(coordinate.values()) else {}
        everyone: list[tuple] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(everyone, packed(mine))
        with torch.no_grad():
            for found in everyone:
                for name, weight in unpacked(found).items():
                    if name in self.masters:
                        self.masters[name].copy_(weight)

    def _powersgd_expected(
        self, grads: dict[str, torch.Tensor], *, run: dict[str, torch.Tensor], state, compressed: bool
    ) -> dict[str, torch.Tensor]:
        """The gradients the run's PowerSGD step must produce (:func:`powersgd_expected`)."""
        if not compressed:
            return grads
        return powersgd_expected(
            grads,
            run=run,
            feedback=self.feedback,
            rank=state.matrix_approximation_rank,
            min_compression_rate=state.min_compression_rate,
        )


def packed(weights: dict[str, torch.Tensor]) -> tuple[list[tuple[str, tuple[int, ...], bool]], torch.Tensor]:
    """``weights`` (fp32, by name) as their names, shapes and whether complex, and one flat fp32 CPU tensor (a
    complex weight as its real and imaginary parts: a cat with one complex tensor made every weight complex), for
    ``all_gather_object``: pickling one storage instead of one per tensor (each a ``torch.save`` of its own) took a
    TinyLlama's 39 weights from 5-8 ms to 0.4-0.6 ms a pickle and unpickle. :func:`unpacked` gives them back, the
    same values."""
    names = [(name, tuple(w.shape), w.is_complex()) for name, w in weights.items()]
    flat = [(torch.view_as_real(w) if w.is_complex() else w).detach().cpu().reshape(-1) for w in weights.values()]
    return names, torch.cat(flat) if flat else torch.empty(0)


def unpacked(found: tuple[list[tuple[str, tuple[int, ...], bool]], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights :func:`packed` packed, by name: views of its flat tensor."""
    names, flat = found
    sizes = [math.prod(shape) * (2 if complex_ else 1) for _, shape, complex_ in names]
    return {
        name: torch.view_as_complex(part.view(*shape, 2)) if complex_ else part.view(shape)
        for (name, shape, complex_), part in zip(names, flat.split(sizes))
    }


def powersgd_expected(
    grads: dict[str, torch.Tensor],
    *,
    run: dict[str, torch.Tensor],
    feedback: dict[str, torch.Tensor],
    rank: int,
    min_compression_rate: float,
) -> dict[str, torch.Tensor]:
    """The gradients a compressed PowerSGD step must produce from the mean gradients ``grads``,
    given the run's result ``run`` (module docstring): ``U U^T (g + ebar)`` for a matrix torch
    compresses (asked of torch's own ``_should_compress``, on the hook's ``view(shape[0], -1)``),
    ``g + ebar`` for the rest. Updates the mean error feedback ``feedback`` (by name) in place."""
    expected = {}
    for name, grad in grads.items():
        fed = grad.double() + feedback.get(name, torch.zeros_like(grad, dtype=torch.float64))
        got = run[name].double()
        n, m = grad.reshape(grad.shape[0], -1).shape if grad.dim() > 1 else (1, grad.numel())  # the hook's view
        r = min(n, m, rank)
        if grad.dim() > 1 and _should_compress(n, m, r, min_compression_rate)[0]:
            expected[name] = _projected(fed.reshape(n, m), onto=got.reshape(n, m), rank=r).reshape(grad.shape)
        else:
            expected[name] = fed
        feedback[name] = fed - got
    return {name: verify.full_precision(g) for name, g in expected.items()}


def _projected(matrix: torch.Tensor, *, onto: torch.Tensor, rank: int) -> torch.Tensor:
    """``U U^T matrix``, ``U`` an orthonormal basis of ``onto``'s column space (at most ``rank``
    directions, singular values above ``RANK_CUTOFF`` of the largest)."""
    u, s, _ = torch.linalg.svd(onto, full_matrices=False)
    keep = int((s[:rank] > RANK_CUTOFF * float(s[0])).sum()) if s.numel() and float(s[0]) > 0 else 0
    basis = u[:, :keep]
    return basis @ (basis.T @ matrix)


def verdict(*, checks: list[StepCheck], plan: Plan, randomness: str, rows: int = 5) -> tuple[bool, str]:
    """(passed, the report): one table per compared step, how randomness was controlled, and
    ``verify: PASSED`` when every step passed and as many were compared as :func:`verify_steps` asks."""
    passed, lines = True, []
    for found in checks:
        ok, table = verify.step_table(diffs=found.diffs, plan=plan, step=found.step, rows=rows)
        passed &= ok
        lines += table
        lines.append(f"  step {found.step}{_how(found)}: {'within tolerance' if ok else 'BEYOND TOLERANCE'}")
    wanted = verify_steps(plan)
    if len(checks) < wanted:
        passed = False
        lines.append(
            f"verify: only {len(checks)} of the {wanted} steps it compares changed the weights ({why_steps(plan)}; "
            "fp16 skips the steps whose gradients overflow); run more steps"
        )
    lines.append(f"verify: randomness: {randomness}")
    lines.append("verify: PASSED" if passed else "verify: FAILED")
    return passed, "\n".join(lines)


def _how(found: StepCheck) -> str:
    """How a step was judged, when not against the exact run: ' (compressed by PowerSGD)' or top-k's words."""
    if found.approximate:
        return f" ({found.approximate})"
    return " (compressed by PowerSGD)" if found.compressed else ""


def reference_copy(model: nn.Module, model_file: Any) -> nn.Module:
    """A copy of ``model`` for the reference: ``copy.deepcopy``, else where a tensor attribute of the model is no
    graph leaf (the legacy ``torch.nn.utils.weight_norm`` keeps ``weight`` as a computed tensor: deepcopy refused
    it and --verify stopped on every plan) ``model_file``'s model built again, holding ``model``'s state, its
    stochastic depth off as ``model``'s (runner.py)."""
    import copy

    from autoplan.execute import rng
    from autoplan.execute.materialize import materialize
    from autoplan.execute.mesh import local_device

    try:
        return copy.deepcopy(model)
    except RuntimeError as exc:
        if "deepcopy protocol" not in str(exc):
            raise
    fresh = materialize(model_file.build(), device=local_device())
    fresh.load_state_dict(model.state_dict())
    rng.dropout_off(fresh)
    return fresh
