"""Materialise a model that ``build_model()`` built on the meta device (the model-file contract
allows it: tracing and planning never need real weights).

``to_empty(device=...)`` allocates uninitialised storage for every parameter and buffer (tied
parameters are tied again afterwards: ``to_empty`` unties them); then the model is initialised
by its own code:

1. the root's ``init_weights()`` if it has one (torchtitan's convention: the model initialises
   all its parameters and buffers itself), else
2. ``reset_parameters()`` of every module that defines one, children before parents (so a
   parent's custom initialisation of its children, e.g. GPT-2's scaled residual projections,
   wins over the children's defaults); then the root's ``_init_weights(module)`` applied to
   every module if it has one (nanoGPT's and Hugging Face's per-module initialiser, which
   such models call from ``__init__``, where on meta it had no effect).

Every meta parameter or buffer must be covered: held by a module that has
``reset_parameters()`` or whose ancestor does, otherwise :class:`ModelFileError` names it
(its values would be whatever memory ``to_empty`` returned). Called with the same seed on every
rank, and before --verify copies the model, so all ranks and the reference get the same
weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from autoplan.errors import ModelFileError
from autoplan.execute.tied import tied_names


def is_meta(model: nn.Module) -> bool:
    """True when any parameter or buffer of ``model`` is on the meta device."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def uninitialisable(model: nn.Module) -> list[str]:
    """FQNs of meta parameters/buffers that no ``reset_parameters()`` on their module or an
    ancestor covers (empty when the root has ``init_weights()``)."""
    if callable(getattr(model, "init_weights", None)):
        return []
    missing = []
    for name, module in model.named_modules():
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        if any(t.is_meta for _, t in tensors) and not _covered(model, name):
            missing += [f"{name}.{t}" if name else t for t, value in tensors if value.is_meta]
    return missing


def _covered(model: nn.Module, fqn: str) -> bool:
    parts = fqn.split(".") if fqn else []
    for depth in range(len(parts), -1, -1):
        if callable(getattr(model.get_submodule(".".join(parts[:depth])), "reset_parameters", None)):
            return True
    return False


def retie(model: nn.Module, ties: list[list[str]]) -> None:
    """Point every alias of a tied parameter back at one tensor (``to_empty`` replaces each
    registration of a meta parameter with its own new Parameter, silently untying them)."""
    for names in ties:
        shared = model.get_parameter(names[0])
        for alias in names[1:]:
            owner, _, attr = alias.rpartition(".")
            setattr(model.get_submodule(owner), attr, shared)


@torch.no_grad()
def materialize(model: nn.Module, *, device: torch.device) -> nn.Module:
    """Allocate ``model``'s meta tensors on ``device`` and initialise them (module docstring);
    a model with nothing on meta is returned unchanged. Seed the RNG first for equal weights."""
    if not is_meta(model):
        return model
    missing = uninitialisable(model)
    if missing:
        raise ModelFileError(
            f"build_model() built the model on the meta device but nothing can initialise {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}; give its module a reset_parameters() "
            "(or the root model an init_weights()), or build the model on a real device."
        )
    ties = tied_names(model)
    model.to_empty(device=device)
    retie(model, ties)
    if callable(getattr(model, "init_weights", None)):
        model.init_weights()
        return model
    for _, module in reversed(list(model.named_modules())):  # children before parents
        if callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()
    if callable(getattr(model, "_init_weights", None)):
        model.apply(model._init_weights)
    return model
