"""The forward() arguments a model was traced with, as data: shapes and dtypes, no values.

A :class:`Graph` records them (``Graph.inputs``) and the planner copies them into the plan
(``Plan.inputs``), so that ``autoplan.parallelize(model, plan, loss_fn=...)`` can build the
micro-batch a pipeline split or a default tensor-parallel trace needs without the caller passing
it again (autoplan/execute/api.py): the plan came from ``autoplan.plan(model, inputs, ...)``,
which already saw the inputs.

One :class:`InputSpec` per positional argument: a tensor (``shape`` of the traced batch,
``dtype`` as torch names it without ``torch.``, ``batched`` when dim 0 is the batch, which the
executor replaces by the micro-batch size), or a JSON scalar passed as is (``value``). Arguments
of other kinds (nested tuples, dicts, objects) cannot be written down: :func:`input_specs` then
returns an empty list, and the caller passes ``microbatch_inputs`` as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.errors import PlanError
from autoplan.types._check import require, require_known_fields

#: torch dtypes by the name they have without ``torch.`` (a forward() argument's dtype).
TENSOR_DTYPES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex64",
    "complex128",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
KINDS = ("tensor", "value")


@dataclass
class InputSpec:
    """One positional forward() argument (module docstring)."""

    kind: str
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    batched: bool = False
    value: Any = None

    def __post_init__(self) -> None:
        require(self.kind in KINDS, PlanError, f"input kind={self.kind!r}; expected one of {', '.join(KINDS)}.")
        if self.kind == "tensor":
            require(
                self.dtype in TENSOR_DTYPES,
                PlanError,
                f"input dtype={self.dtype!r}; expected one of {', '.join(TENSOR_DTYPES)}.",
            )
            require(
                isinstance(self.shape, list) and all(isinstance(d, int) and d >= 0 for d in self.shape),
                PlanError,
                f"input shape={self.shape!r}; expected a list of sizes >= 0.",
            )
            require(
                not self.batched or len(self.shape) >= 1,
                PlanError,
                "input is batched but has no dimension to hold the batch.",
            )
        else:
            require(
                self.value is None or isinstance(self.value, (bool, int, float, str)),
                PlanError,
                f"input value={self.value!r}; expected a JSON scalar.",
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "InputSpec":
        require(isinstance(data, dict), PlanError, f"input {data!r}; expected a mapping.")
        require_known_fields(data, cls, PlanError, "input")
        return cls(**data)


def input_specs(inputs: Any, *, batch_size: int) -> list[InputSpec]:
    """The specs of ``inputs`` (a tuple of forward() arguments, or one tensor), dim 0 of a tensor
    marked batched when it is ``batch_size``; [] when an argument cannot be written down."""
    args = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    specs = []
    for arg in args:
        dtype = str(getattr(arg, "dtype", "")).removeprefix("torch.")
        if _is_tensor(arg) and dtype in TENSOR_DTYPES:
            shape = [int(d) for d in arg.shape]
            specs.append(
                InputSpec(kind="tensor", shape=shape, dtype=dtype, batched=bool(shape) and shape[0] == batch_size)
            )
        elif arg is None or isinstance(arg, (bool, int, float, str)):
            specs.append(InputSpec(kind="value", value=arg))
        else:
            return []
    return specs


def _is_tensor(value: Any) -> bool:
    """A torch.Tensor, told without importing torch (this package imports none)."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and type(value).__module__.startswith("torch")
