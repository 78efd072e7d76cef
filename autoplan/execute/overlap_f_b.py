"""DualPipeV's overlapped F&B, run overlapped: ``Plan.moe_a2a_overlap`` under runtime 'autoplan' (docs/executor.md,
"EP all-to-all overlap"; the price: autoplan/cost/moe/a2a_overlap.py).

torch's ``ScheduleDualPipeV`` emits ``OVERLAP_F_B`` actions, each the forward of one chunk's micro-batch and the full
backward of the rank's other chunk's, and runs them one after the other unless a function is registered for them.
:class:`OverlappedFB` is that function. It waits for both halves' pipeline receives, then runs the backward half on a
second thread, on the ep group's second lane (autoplan/execute/ep_lanes.py: its all-to-alls, autograd's included, go
over a second group), while this thread runs the forward half on the first lane; both join before the action ends, and
what torch's runtime does after each half (the loss, a V turn's local hand-over) runs then, in torch's order. So each
half's all-to-all waits while the other half computes, and the pair computes what the two actions computed apart.
On CUDA the forward half runs on a side stream, joined to the current stream before and after.

Selective recomputation: the backward half re-runs its blocks' forwards on its thread, beside the forward half, and
sends nothing (the lanes' functional all-to-alls keep their outputs: ep_lanes.py). The re-run restores the forward's
random-number state for its span (``fork_rng``), a global state the forward half would draw from meanwhile, so a
re-run mask could differ from its forward's. A pair refuses, before it runs, a forward stage with a dropout module
of p > 0 in training (:func:`_active_dropout`); a draw that no module shows (functional dropout) is caught after the
pair only if it moved the generator's state (:func:`_same_rng`), which a draw made wholly inside the re-run's fork
does not. Full recomputation is refused beside the overlap (types/moe_overlap.py).

Thread-local state: the forward half runs on the schedule's thread, under its autocast and grad mode; the backward
needs neither. The execution audit's recorders are dispatch modes, which a thread does not inherit: under them both
halves dispatch through :class:`_Serialised`, which re-enters the recorders for one op at a time under one lock; a
collective's wait (``wait_tensor``) runs outside it, so neither half waits on its lane holding it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
from torch.distributed.pipelining.schedules import OVERLAP_F_B, ScheduleDualPipeV, _wait_batch_p2p
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode_stack,
    _pop_mode,
    _push_mode,
)

from autoplan.errors import RunError
from autoplan.execute.ep_lanes import Lanes

#: the functional collectives' wait, which :class:`_Serialised` runs outside its lock (module docstring)
WAIT = torch.ops._c10d_functional.wait_tensor.default


class OverlappedDualPipeV(ScheduleDualPipeV):
    """torch's DualPipeV with :class:`OverlappedFB` registered for its ``OVERLAP_F_B`` actions."""

    def __init__(self, *args: Any, lanes: Lanes, recomputes: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.overlapped = OverlappedFB(lanes=lanes, recomputes=recomputes)
        self.register_custom_function(OVERLAP_F_B, self.overlapped)

    def _step_microbatches(self, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
                           loss_kwargs=None):  # fmt: skip
        # what torch's runtime passes its own forward and loss, and a custom function's context lacks
        self.overlapped.return_outputs, self.overlapped.loss_kwargs = return_outputs, loss_kwargs
        return super()._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs)


class OverlappedFB:
    """The ``OVERLAP_F_B`` function (module docstring); ``pairs`` counts the pairs it ran; ``recomputes``: whether
    a backward half may re-run forwards (the plan's recompute is not 'none')."""

    def __init__(self, *, lanes: Lanes, recomputes: bool):
        self.lanes, self.recomputes = lanes, recomputes
        self.pairs = 0
        self.return_outputs, self.loss_kwargs = True, None

    def __call__(self, action: Any, ctx: Any) -> None:
        schedule = ctx.schedule_ref
        forward, backward = action.sub_actions
        stages = {stage.stage_index: stage for stage in schedule._stages}
        f_stage, b_stage = stages[forward.stage_index], stages[backward.stage_index]
        assert f_stage is not b_stage, f"{action}: one stage's forward beside its own backward"
        self._await_inputs(schedule, stages, forward, backward)
        loss = schedule._maybe_get_loss(b_stage, backward.microbatch_index)
        schedule.backward_counter[backward.stage_index] += 1
        last = schedule.backward_counter[backward.stage_index] == schedule._n_microbatches
        modes, lock, failed = _get_current_dispatch_mode_stack(), threading.Lock(), []

        def backward_half() -> None:
            try:
                with self.lanes.second(), _serialised(modes, lock):
                    b_stage.backward_one_chunk(backward.microbatch_index, loss=loss, full_backward=True,
                                               last_backward=last)  # fmt: skip
            except BaseException as exc:  # re-raised on the schedule's thread
                failed.append(exc)

        helper = threading.Thread(target=backward_half, name="autoplan-overlap-backward")
        if self.recomputes and _active_dropout(f_stage.submod):
            raise RunError(
                f"{action}: stage {f_stage.stage_index} has dropout ({_active_dropout(f_stage.submod)}), whose masks "
                "its forward half would draw while the backward half re-runs blocks under recomputation from the same "
                "generator; set the model's dropout to 0, recompute to 'none', or moe_a2a_overlap to false."
            )
        rng = _rng_states(f_stage.device) if self.recomputes else None
        with _side_stream(f_stage.device) as side, _disable_current_modes() if modes else contextlib.nullcontext():
            helper.start()
            try:
                with _serialised(modes, lock), side:
                    output = f_stage.forward_one_chunk(
                        forward.microbatch_index,
                        ctx.arg_mbs[forward.microbatch_index],
                        ctx.kwarg_mbs[forward.microbatch_index],
                        save_forward_output=self.return_outputs,
                    )
            finally:
                helper.join()
        if failed:
            raise failed[0]
        if rng is not None and not _same_rng(rng, _rng_states(f_stage.device)):
            raise RunError(
                f"{action}: the forward half drew random numbers (dropout) while the backward half could re-run its "
                "blocks under recomputation, whose masks would then differ from their forward's; set the model's "
                "dropout to 0, recompute to 'none', or moe_a2a_overlap to false."
            )
        self.pairs += 1
        self._after(schedule, stages, forward, backward, output, ctx)

    @staticmethod
    def _await_inputs(schedule: Any, stages: dict, forward: Any, backward: Any) -> None:
        """Both halves' pipeline receives, as torch's runtime waits for them before each action."""
        for half in (forward, backward):
            schedule._assert_unsharded(stages[half.stage_index])
        stage, key = stages[forward.stage_index], (forward.stage_index, forward.microbatch_index)
        if not stage.is_first and forward.stage_index - 1 not in stages:
            _wait_batch_p2p(schedule.fwd_recv_ops.pop(key))
        stage, key = stages[backward.stage_index], (backward.stage_index, backward.microbatch_index)
        if not stage.is_last and backward.stage_index + 1 not in stages:
            _wait_batch_p2p(schedule.bwd_recv_ops.pop(key))

    def _after(self, schedule: Any, stages: dict, forward: Any, backward: Any, output: Any, ctx: Any) -> None:
        """What torch's runtime does after each half: the loss on the last stage, and at the V's turn (two
        neighbouring chunks on this rank) the output or input gradient handed over locally."""
        f_index, b_index = forward.stage_index, backward.stage_index
        schedule._maybe_compute_loss(stages[f_index], output, ctx.target_mbs, forward.microbatch_index,
                                     self.loss_kwargs)  # fmt: skip
        if f_index + 1 in stages:
            stages[f_index + 1].set_local_fwd_input(output, forward.microbatch_index)
        if b_index - 1 in stages:
            gradient = stages[b_index].get_local_bwd_output(backward.microbatch_index)
            stages[b_index - 1].set_local_bwd_input(gradient, backward.microbatch_index)


def _active_dropout(module: torch.nn.Module) -> str:
    """The first dropout module of ``module`` that draws (p > 0, in training), by name; '' when none does."""
    for name, child in module.named_modules():
        if isinstance(child, torch.nn.modules.dropout._DropoutNd) and child.p > 0 and child.training:
            return name or type(child).__name__
    return ""


def _rng_states(device: torch.device) -> list[torch.Tensor]:
    """The random-number states a forward draws from: the CPU's and, on an accelerator, its device's."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def _same_rng(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    """Whether no random number was drawn between the two states: the backward half's re-run restores the state it
    used (module docstring), so only the forward half's draws change it."""
    return all(torch.equal(a, b) for a, b in zip(before, after))


@contextlib.contextmanager
def _side_stream(device: torch.device):
    """On CUDA, a stream for the forward half, ordered after the current stream's work and before its next (module
    docstring); elsewhere nothing."""
    if device.type != "cuda":
        yield contextlib.nullcontext()
        return
    current, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    side.wait_stream(current)
    yield torch.cuda.stream(side)
    current.wait_stream(side)


class _Serialised(TorchDispatchMode):
    """Each op through the schedule thread's dispatch modes (bottom first), one thread at a time (module docstring)."""

    def __init__(self, modes: list, lock: threading.Lock):
        super().__init__()
        self.modes, self.lock = modes, lock

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is WAIT:  # blocks until the lane's peers send: never under the lock (module docstring)
            return func(*args, **(kwargs or {}))
        with self.lock:
            for mode in self.modes:
                _push_mode(mode)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                for _ in self.modes:
                    _pop_mode()


def _serialised(modes: list, lock: threading.Lock):
    """:class:`_Serialised` over ``modes``, or nothing where there are none."""
    return _Serialised(modes, lock) if modes else contextlib.nullcontext()
