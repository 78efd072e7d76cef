"""Load a model file by path and check it keeps the contract.

A model file is a plain Python file that defines::

    def build_model() -> torch.nn.Module          # required; may build on the meta device
    def example_inputs(batch_size: int) -> tuple  # required; positional forward() args for one global batch
    def example_target(batch_size: int)           # optional; the target handed to loss_fn
    def loss_fn(output, target) -> torch.Tensor   # optional; if absent, a mean over the output

Every way a file can break the contract raises :class:`ModelFileError` with one sentence
that names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from autoplan.errors import ModelFileError

#: transformers' names of a model's own checkpointing flag and switch: 5.x's, then 4.x's
_HF_CHECKPOINTING = (
    ("is_activation_checkpointing", "activation_checkpointing_disable"),
    ("is_gradient_checkpointing", "gradient_checkpointing_disable"),
)


def _own_checkpointing_off(model: torch.nn.Module) -> None:
    """Turn off a Hugging Face model's own gradient checkpointing (:meth:`ModelFile.build`)."""
    for flag, switch in _HF_CHECKPOINTING:
        if hasattr(type(model), flag) and callable(getattr(model, switch, None)):
            if getattr(model, flag):
                getattr(model, switch)()
            return


@dataclass
class ModelFile:
    """A loaded model file: its path, its module, and the contract's functions."""

    path: Path
    module: ModuleType
    build_model: Callable[[], torch.nn.Module]
    example_inputs: Callable[[int], tuple]
    example_target: Callable[[int], Any] | None
    loss_fn: Callable[[Any, Any], torch.Tensor] | None

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def sha256(self) -> str:
        """The SHA-256 of the file's bytes (recorded in a plan beside its graph signature: types/plan.py)."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def build(self) -> torch.nn.Module:
        """Call ``build_model()`` and check it returns a module. A Hugging Face model built with its own gradient
        checkpointing on (``gradient_checkpointing_enable()``) gets it turned off: the plan's recomputation is the one
        autoplan prices and runs, and the model's own re-ran its blocks under context parallelism's attention routing
        with other saved tensors ("A different number of tensors was saved", docs/executor.md)."""
        model = self._call("build_model", self.build_model)
        if not isinstance(model, torch.nn.Module):
            raise ModelFileError(
                f"{self.path}: build_model() returned {type(model).__name__}; expected a torch.nn.Module."
            )
        _own_checkpointing_off(model)
        return model

    def inputs(self, batch_size: int) -> tuple:
        """Call ``example_inputs(batch_size)`` and return a tuple of forward() arguments."""
        inputs = self._call("example_inputs", self.example_inputs, batch_size)
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, (tuple, list)):
            raise ModelFileError(
                f"{self.path}: example_inputs({batch_size}) returned {type(inputs).__name__}; "
                "expected a tuple of forward() arguments."
            )
        return tuple(inputs)

    def target(self, batch_size: int) -> Any:
        """The target for ``loss_fn``, or None when the file defines no ``example_target``."""
        if self.example_target is None:
            return None
        return self._call("example_target", self.example_target, batch_size)

    def loss(self, output: Any, target: Any) -> torch.Tensor:
        """``loss_fn(output, target)`` if defined, else the mean of the output (or its first tensor)."""
        if self.loss_fn is not None:
            loss = self.loss_fn(output, target)
        else:
            loss = default_loss(output)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ModelFileError(f"{self.path}: loss_fn returned {type(loss).__name__}; expected a scalar tensor.")
        return loss

    def _call(self, what: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except ModelFileError:
            raise
        except Exception as exc:  # the user's code failed: name it and where
            where = _user_frame(exc, self.path)
            raise ModelFileError(
                f"{self.path}: {what}({', '.join(map(repr, args))}) raised {type(exc).__name__}: {exc}{where}."
            ) from exc


def default_loss(output: Any) -> torch.Tensor:
    """The mean over the output; for a tuple, dict or HF ModelOutput, over its first tensor."""
    if isinstance(output, torch.Tensor):
        return output.float().mean()
    if isinstance(output, dict):
        if "loss" in output and isinstance(output["loss"], torch.Tensor):
            return output["loss"]
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item.float().mean()
    raise ModelFileError(
        f"cannot take a default loss of a {type(output).__name__}; define loss_fn(output, target) in the model file."
    )


def load_model_file(path: str | Path) -> ModelFile:
    """Import a model file by path and check the contract's functions exist and are callable."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(
            f"model file '{path}' does not exist; pass the path to a .py file that defines build_model() "
            "and example_inputs(batch_size)."
        )
    if path.suffix != ".py":
        raise ModelFileError(
            f"model file '{path}' is not a .py file; pass a Python file that defines build_model() "
            "and example_inputs(batch_size)."
        )
    module = _import(path)
    required = {name: getattr(module, name, None) for name in ("build_model", "example_inputs")}
    for name, fn in required.items():
        if not callable(fn):
            raise ModelFileError(
                f"{path}: defines no function {name}(); "
                "a model file must define build_model() and example_inputs(batch_size)."
            )
    optional = {name: getattr(module, name, None) for name in ("example_target", "loss_fn")}
    for name, fn in optional.items():
        if fn is not None and not callable(fn):
            raise ModelFileError(f"{path}: {name} is a {type(fn).__name__}; expected a function.")
    return ModelFile(path=path.resolve(), module=module, **required, **optional)


def _import(path: Path) -> ModuleType:
    name = f"autoplan_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"model file '{path}' cannot be imported.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise ModelFileError(f"{path}: does not import: SyntaxError at line {exc.lineno}: {exc.msg}.") from exc
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ModelFileError(f"{path}: does not import: {type(exc).__name__}: {exc}{_user_frame(exc, path)}.") from exc
    return module


def _user_frame(exc: BaseException, path: Path) -> str:
    """' (at FILE:LINE)' for the innermost frame of the user's file in the traceback, if any."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {path.name}:{frame.lineno})"
