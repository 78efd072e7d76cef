"""Mixture-of-Experts layers as the graph records them, and the routing model they were traced under.

A router's choices depend on the data, which a trace on meta/fake tensors does not have. The
tracer therefore runs every MoE layer under a :class:`RoutingModel` (docs/moe.md):

- **balanced** (the default): each expert receives the mean load, ``tokens * top_k / experts``
  (token, choice) pairs, rounded up;
- **capacity factor** ``c`` (optional): every expert gets exactly ``ceil(c * tokens * top_k /
  experts)`` slots (GShard, Lepikhin et al. 2021 section 2.2; Switch Transformer, Fedus et al.
  2022 section 2.2): pairs over capacity are dropped, empty slots are padded and still computed;
- **imbalance** ``i >= 1``: the busiest expert's load over the mean. The trace's shapes stay
  balanced (the total work of a layer does not depend on the split); the cost model charges
  the busiest expert-parallel rank ``i`` times the mean, since it sets the pace. The default,
  1.25, is the capacity factor Switch Transformer trains with (Fedus et al. 2022, Table 1):
  the headroom its authors budget for the busiest expert.

Per layer, :class:`MoELayer` holds what the cost model and the executor need and must never
guess: the experts and their parameters, top-k, the router, shared experts and FFN sizes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.errors import AutoplanError
from autoplan.types._check import require, require_known_fields
from autoplan.types.hash_once import hash_once

INTERFACES = ("grouped", "module_list")
DEFAULT_IMBALANCE = 1.25
IMBALANCE_SOURCE = "Switch Transformer's training capacity factor (Fedus et al. 2022, Table 1)"


class MoEError(AutoplanError):
    """A routing model or MoE layer description that cannot be used."""


@hash_once
@dataclass(frozen=True)
class RoutingModel:
    imbalance: float = DEFAULT_IMBALANCE
    capacity_factor: float | None = None  # None: dropless, every expert its (balanced) share
    imbalance_source: str = IMBALANCE_SOURCE

    def __post_init__(self) -> None:
        ok = isinstance(self.imbalance, (int, float)) and math.isfinite(self.imbalance) and self.imbalance >= 1
        require(ok, MoEError, f"MoE imbalance {self.imbalance!r} must be a number >= 1 (1 = perfectly balanced).")
        cf = self.capacity_factor
        ok = cf is None or (isinstance(cf, (int, float)) and math.isfinite(cf) and cf > 0)
        require(ok, MoEError, f"MoE capacity factor {cf!r} must be a positive number, or unset for dropless routing.")

    def slots_per_expert(self, tokens: int, top_k: int, experts: int) -> int:
        """(token, choice) slots each expert computes: the balanced share, or the capacity."""
        mean = tokens * top_k / experts
        return max(1, math.ceil(mean if self.capacity_factor is None else self.capacity_factor * mean))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RoutingModel":
        require_known_fields(data, cls, MoEError, "routing model")
        return cls(**data)


@dataclass
class MoELayer:
    """One MoE layer of the traced model (every count for one global batch, like the Graph)."""

    module: str  # the MoE block, e.g. model.layers.0.mlp
    experts_module: str  # the module holding the routed experts
    layer: str | None  # the repeated block it sits in
    num_experts: int
    top_k: int
    hidden_size: int
    expert_ffn_size: int  # the intermediate width of one expert
    expert_param_names: list[str]  # parameters of the routed experts (sharded over ep)
    params_per_expert: int
    router_module: str | None = None
    shared_module: str | None = None  # shared experts every token also passes through
    shared_params: int = 0
    gated: bool = True  # a gated FFN (SwiGLU: gate and up projections), else up only
    tokens: int = 0  # tokens entering the layer per global batch
    slots_per_expert: int = 0  # what each expert computed in the trace (RoutingModel)
    routing: RoutingModel = field(default_factory=RoutingModel)
    #: "grouped": one module holds every expert's weights stacked ([E, ...]) and is called with the
    #: routing (the Hugging Face experts interface); expert parallelism runs on these.
    #: "module_list": one module per expert; priced, but run only at ep = 1.
    interface: str = "grouped"
    #: the layer selects each expert's rows by data-dependent shapes (a loop over a ModuleList
    #: with ``torch.where``/``nonzero``, as transformers 4.x wrote Mixtral), traced under the
    #: routing model (trace/moe_loop.py): it runs eagerly as written, so torch.export, which
    #: splits pipelines, cannot capture it.
    data_dependent: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.routing, dict):
            self.routing = RoutingModel.from_dict(self.routing)
        require(
            self.interface in INTERFACES,
            MoEError,
            f"MoE layer {self.module}: interface '{self.interface}'; expected one of {', '.join(INTERFACES)}.",
        )
        require(
            self.num_experts >= 1 and 1 <= self.top_k <= self.num_experts,
            MoEError,
            f"MoE layer {self.module}: top_k={self.top_k} must be between 1 and its {self.num_experts} experts.",
        )

    @property
    def expert_params(self) -> int:
        return self.params_per_expert * self.num_experts

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["routing"] = self.routing.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MoELayer":
        require_known_fields(data, cls, MoEError, "MoE layer")
        return cls(**data)
