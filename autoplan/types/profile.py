"""A hardware profile: one kind of node, and how nodes connect (docs/profile-format.md: the fields,
the compute and collective models, host dispatch overhead, comm overlap).

Profiles are data (YAML or JSON). A profile plus a device count gives a cluster: ``devices_per_node``
devices share the intra-node link, groups that span nodes use the inter-node link, and groups that span
sites (types/sites.py) the wide-area link. Every number carries a ``source``: a datasheet, a published
measurement, or "measured on <host> at <date> with <tool version>".

    t_op   = max(F / (peak[dtype] * eff(F)),  B / (mem_bw * mem_eff))          roofline
    eff(F) = max_efficiency * F / (F + half_saturation_flops)
    t_op  += overhead (CPU backend)  or  t_op = max(t_op, overhead) (GPU)       device.op_overhead
    t(n, S) = alpha_s * latency_steps(n) + c(n) * S / busbw_bytes_per_s        nccl-tests busbw, Thakur et al. 2005
    t_both = t_comp + t_comm - eta * min(t_comp, t_comm)                       eta = comm_overlap.efficiency

S is the full message (for all_gather, the gathered output) and c(n) :func:`bus_factor`, the one
definition the fitter and the cost model share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.errors import ProfileError
from autoplan.types._check import require
from autoplan.types.host_spec import HostProfile
from autoplan.types.pricing import PricingSpec, pricing_from
from autoplan.types.reliability import ReliabilitySpec, StorageSpec, check_section
from autoplan.types.sites import SiteSpec

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: efficiency curves a device may have: GEMMs, the fused attention kernel PyTorch's SDPA runs (per executed
#: FLOP; its source names the kernel: FlashAttention-2 on A100 and H100), convolutions, MoE grouped GEMMs (one
#: expert GEMM's FLOPs), the attention's backward alone (it runs at a lower rate than its forward), and
#: Transformer Engine's attention (cuDNN on Hopper: Megatron-Core's); a class without a curve falls back
#: along FALLBACK_CLASS, then to matmul's
OP_CLASSES = (
    "matmul",
    "attention",
    "conv",
    "grouped_matmul",
    "attention_backward",
    "attention_te",
    "attention_te_backward",
)
#: the class a curve-less op class borrows from, before matmul's
FALLBACK_CLASS = {
    "attention_backward": "attention",
    "attention_te": "attention",
    "attention_te_backward": "attention_backward",
}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(kind: str, group_size: int) -> float:
    """c(kind, n) of nccl-tests' bus-bandwidth convention (nccl-tests PERFORMANCE.md): bytes on the
    busiest link per message byte, so that t = alpha_s + c * S / busbw_bytes_per_s. 2(n-1)/n for
    all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for send_recv (point to
    point, whatever the group). A group of one rank sends nothing: c = 0 at n = 1."""
    require(kind in COLLECTIVES, ProfileError, f"collective '{kind}' is unknown; expected one of {COLLECTIVES}.")
    require(group_size >= 1, ProfileError, f"a collective group of {group_size} ranks; expected at least 1.")
    share = (group_size - 1) / group_size
    if kind == "send_recv":
        return 1.0
    return 2.0 * share if kind == "all_reduce" else share


def _positive(owner: str, name: str, value: Any) -> None:
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
        ProfileError,
        f"profile field '{owner}.{name}' is {value!r}; expected a positive number.",
    )


def _sourced(owner: str, source: Any) -> None:
    require(
        isinstance(source, str) and source.strip() != "",
        ProfileError,
        f"profile field '{owner}.source' is {source!r}; "
        "expected a non-empty string naming where the numbers come from.",
    )


@dataclass
class Efficiency:
    """Achieved fraction of peak as a function of an op's FLOPs: a*F/(F+F_half)."""

    max_efficiency: float
    half_saturation_flops: float
    source: str

    def check(self, owner: str) -> None:
        _positive(owner, "max_efficiency", self.max_efficiency)
        require(
            self.max_efficiency <= 1.0,
            ProfileError,
            f"profile field '{owner}.max_efficiency' is {self.max_efficiency}; expected a fraction in (0, 1].",
        )
        require(
            self.half_saturation_flops >= 0,
            ProfileError,
            f"profile field '{owner}.half_saturation_flops' is {self.half_saturation_flops}; expected >= 0.",
        )
        _sourced(owner, self.source)

    def __call__(self, flops: float) -> float:
        return self.max_efficiency * flops / (flops + self.half_saturation_flops) if flops > 0 else self.max_efficiency


@dataclass
class OpTiming:
    """A measured op time: op kind, shape key (e.g. "m=4096,n=4096,k=4096"), dtype, median seconds."""

    op: str
    shape: str
    dtype: str
    time_s: float
    flops: float = 0.0  # FLOPs of one call (0 when unknown), so achieved FLOP/s = flops / time_s


@dataclass
class OpOverhead:
    """Host time to dispatch one traced op's forward, and its backward, in seconds (module docstring)."""

    forward_s: float
    backward_s: float
    source: str

    def check(self) -> None:
        for name in ("forward_s", "backward_s"):
            value = getattr(self, name)
            require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                ProfileError,
                f"profile field 'device.op_overhead.{name}' is {value!r}; expected a number >= 0 (seconds).",
            )
        _sourced("device.op_overhead", self.source)


@dataclass
class DeviceSpec:
    name: str
    memory_bytes: int
    peak_flops: dict[str, float]
    memory_bandwidth_bytes_per_s: float
    efficiency: dict[str, Efficiency]
    source: str
    memory_efficiency: float = 0.8
    op_table: list[OpTiming] = field(default_factory=list)
    #: Optional per-dtype curves that override ``efficiency`` (a measured CPU's bf16 and fp32
    #: kernels saturate differently); ``efficiency_for`` picks the right one.
    efficiency_by_dtype: dict[str, dict[str, Efficiency]] = field(default_factory=dict)
    #: Host dispatch time per op (module docstring); None = not measured, charged as 0.
    op_overhead: OpOverhead | None = None

    def efficiency_for(self, op_class: str, dtype: str) -> Efficiency:
        """The efficiency curve of ``op_class`` in ``dtype``: the per-dtype one when given, else the default
        (falling back to FALLBACK_CLASS's, then to matmul's, when the op class has none)."""
        curves = {**self.efficiency, **self.efficiency_by_dtype.get(dtype, {})}
        while op_class not in curves and op_class in FALLBACK_CLASS:
            op_class = FALLBACK_CLASS[op_class]
        return curves.get(op_class) or curves["matmul"]

    def check(self) -> None:
        _positive("device", "memory_bytes", self.memory_bytes)
        _positive("device", "memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s)
        _positive("device", "memory_efficiency", self.memory_efficiency)
        _sourced("device", self.source)
        if self.op_overhead is not None:
            require(
                isinstance(self.op_overhead, OpOverhead),
                ProfileError,
                f"profile field 'device.op_overhead' is {self.op_overhead!r}; "
                "expected a mapping with forward_s, backward_s and source.",
            )
            self.op_overhead.check()
        require(
            isinstance(self.peak_flops, dict) and self.peak_flops,
            ProfileError,
            "profile field 'device.peak_flops' is empty; expected FLOP/s for at least one of "
            + ", ".join(DTYPES)
            + ".",
        )
        for dtype, value in self.peak_flops.items():
            require(
                dtype in DTYPES,
                ProfileError,
                f"profile field 'device.peak_flops' has dtype '{dtype}'; expected one of {', '.join(DTYPES)}.",
            )
            _positive("device.peak_flops", dtype, value)
        require(
            "matmul" in self.efficiency,
            ProfileError,
            "profile field 'device.efficiency' has no 'matmul' entry; expected one per op class.",
        )
        for op_class, eff in self.efficiency.items():
            require(
                op_class in OP_CLASSES,
                ProfileError,
                f"profile field 'device.efficiency' has op class '{op_class}'; "
                f"expected one of {', '.join(OP_CLASSES)}.",
            )
            eff.check(f"device.efficiency.{op_class}")
        for dtype, curves in self.efficiency_by_dtype.items():
            require(
                dtype in DTYPES,
                ProfileError,
                f"profile field 'device.efficiency_by_dtype' has dtype '{dtype}'; expected one of {', '.join(DTYPES)}.",
            )
            for op_class, eff in curves.items():
                require(
                    op_class in OP_CLASSES,
                    ProfileError,
                    f"profile field 'device.efficiency_by_dtype.{dtype}' has op class '{op_class}'; "
                    f"expected one of {', '.join(OP_CLASSES)}.",
                )
                eff.check(f"device.efficiency_by_dtype.{dtype}.{op_class}")


@dataclass
class CollectiveFit:
    """alpha-beta fit of one collective on one link; ``points`` keeps the raw measurements
    as [group_size, message_bytes, time_s] rows."""

    alpha_s: float
    busbw_bytes_per_s: float
    source: str
    points: list[list[float]] = field(default_factory=list)

    def check(self, owner: str) -> None:
        require(
            isinstance(self.alpha_s, (int, float)) and self.alpha_s >= 0,
            ProfileError,
            f"profile field '{owner}.alpha_s' is {self.alpha_s!r}; expected a number >= 0 (seconds).",
        )
        _positive(owner, "busbw_bytes_per_s", self.busbw_bytes_per_s)
        _sourced(owner, self.source)


@dataclass
class LinkSpec:
    name: str
    collectives: dict[str, CollectiveFit]

    def check(self, owner: str) -> None:
        for kind in COLLECTIVES:
            require(
                kind in self.collectives,
                ProfileError,
                f"profile field '{owner}.collectives' has no '{kind}'; expected all of {', '.join(COLLECTIVES)}.",
            )
        for kind, fit in self.collectives.items():
            require(
                kind in COLLECTIVES,
                ProfileError,
                f"profile field '{owner}.collectives' has '{kind}'; expected one of {', '.join(COLLECTIVES)}.",
            )
            fit.check(f"{owner}.collectives.{kind}")


DEFAULT_OVERLAP_SOURCE = "NCCL runs collectives on separate CUDA streams, concurrently with compute kernels"


@dataclass
class CommOverlap:
    """Fraction ``efficiency`` of a collective's time that hides under concurrent compute (module
    docstring); a measured one keeps its three timings (seconds, median over repeats)."""

    efficiency: float = 1.0
    source: str = DEFAULT_OVERLAP_SOURCE
    compute_s: float = 0.0  # the compute kernel alone
    comm_s: float = 0.0  # the collective alone
    both_s: float = 0.0  # both at once (async collective, compute, then wait)

    def check(self) -> None:
        e = self.efficiency
        require(
            isinstance(e, (int, float)) and not isinstance(e, bool) and 0.0 <= e <= 1.0,
            ProfileError,
            f"profile field 'comm_overlap.efficiency' is {e!r}; expected a fraction in [0, 1].",
        )
        for name in ("compute_s", "comm_s", "both_s"):
            value = getattr(self, name)
            require(
                isinstance(value, (int, float)) and value >= 0,
                ProfileError,
                f"profile field 'comm_overlap.{name}' is {value!r}; expected a number >= 0 (seconds).",
            )
        _sourced("comm_overlap", self.source)

    def hidden_s(self, *, compute_s: float, comm_s: float) -> float:
        """Seconds of ``comm_s`` that hide under ``compute_s`` of concurrent compute."""
        return self.efficiency * max(0.0, min(compute_s, comm_s))


@dataclass
class Profile:
    name: str
    device: DeviceSpec
    devices_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec | None = None
    backend: str = "nccl"
    threads: int | None = None
    #: Rental price, dated and sourced (types/pricing.py); None = no price known.
    pricing: PricingSpec | None = None
    description: str = ""
    calibration: dict[str, Any] = field(default_factory=dict)
    comm_overlap: CommOverlap = field(default_factory=CommOverlap)
    #: Checkpoint storage and failure rate (types/reliability.py); None = not known, not priced.
    storage: StorageSpec | None = None
    reliability: ReliabilitySpec | None = None
    host: HostProfile | None = None  # where offloaded states go (types/host_spec.py); None = no offload priced
    sites: SiteSpec | None = None  # sites of nodes joined by a wide-area link (types/sites.py); None = one site

    def __post_init__(self) -> None:
        require(
            isinstance(self.devices_per_node, int) and self.devices_per_node >= 1,
            ProfileError,
            f"profile field 'devices_per_node' is {self.devices_per_node!r}; expected an integer >= 1.",
        )
        require(
            self.backend in ("nccl", "gloo"),
            ProfileError,
            f"profile field 'backend' is {self.backend!r}; expected 'nccl' or 'gloo'.",
        )
        if self.pricing is not None:
            require(
                isinstance(self.pricing, PricingSpec),
                ProfileError,
                f"profile field 'pricing' is {self.pricing!r}; expected a mapping (docs/profile-format.md).",
            )
            self.pricing.check()
        require(
            isinstance(self.comm_overlap, CommOverlap),
            ProfileError,
            f"profile field 'comm_overlap' is {self.comm_overlap!r}; "
            "expected a mapping with 'efficiency' and 'source'.",
        )
        self.comm_overlap.check()
        check_section(self.storage, StorageSpec, "storage")
        check_section(self.reliability, ReliabilitySpec, "reliability")
        check_section(self.host, HostProfile, "host")
        check_section(self.sites, SiteSpec, "sites")
        self.device.check()
        self.intra_node.check("intra_node")
        if self.inter_node is not None:
            self.inter_node.check("inter_node")

    @property
    def price_per_device_hour(self) -> float | None:
        """The on-demand price per device-hour, or None (``pricing``)."""
        return self.pricing.on_demand_per_device_hour if self.pricing else None

    def link(self, spans_nodes: bool) -> LinkSpec:
        """The link a collective uses: inter-node when its group spans nodes."""
        if spans_nodes:
            if self.inter_node is None:
                raise ProfileError(
                    f"profile '{self.name}' has no inter_node link, "
                    f"so it cannot describe more than {self.devices_per_node} devices."
                )
            return self.inter_node
        return self.intra_node

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: v for k, v in data.items() if not (k in ("host", "sites") and v is None)}  # written as before

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Profile":
        """Build from a loaded mapping; the profile io module turns KeyError/TypeError into
        ProfileError naming the field."""
        device = dict(data["device"])
        device["efficiency"] = {k: Efficiency(**v) for k, v in device["efficiency"].items()}
        device["op_table"] = [OpTiming(**row) for row in device.get("op_table", [])]
        device["efficiency_by_dtype"] = {
            dtype: {k: Efficiency(**v) for k, v in curves.items()}
            for dtype, curves in (device.get("efficiency_by_dtype") or {}).items()
        }
        if isinstance(device.get("op_overhead"), dict):
            device["op_overhead"] = OpOverhead(**device["op_overhead"])
        fields = {k: v for k, v in data.items() if k not in ("price_per_device_hour", "price_source")}
        fields["pricing"] = pricing_from(data)  # the older flat price fields load too
        fields["device"] = DeviceSpec(**device)
        fields["intra_node"] = _link(data["intra_node"])
        fields["inter_node"] = _link(data["inter_node"]) if data.get("inter_node") else None
        if isinstance(data.get("comm_overlap"), dict):
            fields["comm_overlap"] = CommOverlap(**data["comm_overlap"])
        for name, kind in (("storage", StorageSpec), ("reliability", ReliabilitySpec), ("host", HostProfile)):
            if isinstance(data.get(name), dict):
                fields[name] = kind(**data[name])
        if isinstance(data.get("sites"), dict):
            fields["sites"] = SiteSpec(**{**data["sites"], "link": _link(data["sites"]["link"])})
        return cls(**fields)


def _link(data: dict[str, Any]) -> LinkSpec:
    return LinkSpec(name=data["name"], collectives={k: CollectiveFit(**v) for k, v in data["collectives"].items()})
