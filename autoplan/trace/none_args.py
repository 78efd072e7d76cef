"""The forward() arguments torch.fx traces as the constant None (trace/capture.py ``_try_fx``).

torch.fx makes every argument of ``forward`` a placeholder, so ``if mask is not None:`` took the branch for an
argument that is None (given as None, or left at its default of None) and recorded ``x + mask``; the trace then
fed that placeholder None and stopped ("unsupported operand type(s) for +: 'FakeTensor' and 'NoneType"). Such an
argument is passed to fx as a concrete None: fx prunes the branch and keeps a placeholder that checks it is None.
"""

from __future__ import annotations

import inspect

import torch

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def none_arguments(model: torch.nn.Module, inputs: tuple) -> dict[str, None]:
    """``{name: None}`` for each positional parameter of ``model.forward`` whose input is None, or that the inputs do
    not reach and whose default is None; {} where the signature cannot be read or takes ``*args``."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return {}
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    nones = {}
    for index, parameter in enumerate(positional):
        given = index < len(inputs)
        if (given and inputs[index] is None) or (not given and parameter.default is None):
            nones[parameter.name] = None
    return nones
