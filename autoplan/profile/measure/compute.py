"""Compute sweeps: matmul, attention (SDPA), grouped GEMMs and convolution per dtype, and memory
bandwidth (docs/profile-format.md, "Compute model": why each is timed the way it is).

FLOPs of one timed call (multiply-add = 2 FLOPs, as autoplan/trace/flops.py counts):

    matmul     y = x W^T, x (m x k), W (n x k): forward + both backward GEMMs     3 * 2*m*n*k
    attention  SDPA over (b, h, s, d), full or causal: forward + backward (the backward's four
               gradient matmuls and the scores it recomputes, 2.5x the forward),
               causal at the share a GPU kernel executes                          3.5 * 4*b*h*s*s*d * f
    grouped    E experts of m rows each, y_e = x_e W_e (k -> n): forward + both
               backward grouped GEMMs (torch._grouped_mm, else torch.bmm)        3 * E * 2*m*k*n
    conv       3x3, stride 1, pad 1, c -> c channels, forward                    2*b*c*c*9*hw*hw
    memory     a copy moves 2 * bytes; add 3 * bytes, gelu 2 * bytes

f = 1 (full, or any call on a CPU) or, causal on a GPU, the share of the scores FlashAttention's
128 x 128 tiles visit (types/attention.py ``executed_fraction``, (1/2)(1 + 128/s)): the
cost model prices attention on the same count, so a measured curve is per FLOP as priced.
Matmul's three GEMMs run on plain tensors in the
layouts autograd hands ``aten::mm`` (``mm(x, W.t())``, ``mm(dY, W)``, ``mm(dY.t(), x)``); fp8 runs
them with ``torch._scaled_mm`` (row-major x column-major, as torchao does). ``kernel_calls``: the
cost-model ops one timed call stands for (matmul and attention 2, grouped 3E: each expert GEMM of the
forward and twice in the backward, as cost/moe/experts.py prices them). Cases are picklable
``CaseSpec`` values, so the N measuring processes time the same kernels (measure/ranks.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from autoplan.profile.measure.timing import DTYPE_NAMES, FP8_DTYPES, median_time_s, tf32_mode
from autoplan.types.attention import executed_fraction
from autoplan.types.profile import OpTiming

Builder = Callable[[torch.dtype, torch.device], Callable[[], Any]]

#: Cost-model ops in one timed call of each op class: matmul and attention are timed forward +
#: backward, which the cost model prices as two ops (forward F/3, backward 2F/3); a grouped GEMM
#: point stands for 3 * E (``kernel_calls``).
KERNEL_CALLS = {"matmul": 2, "attention": 2, "conv": 1, "linear": 2}


@dataclass(frozen=True)
class OpCase:
    op_class: str
    shape: str
    flops: float
    build: Builder
    training: bool = False  # needs autograd (forward + backward)


@dataclass(frozen=True)
class CaseSpec:
    """A picklable case: ``kind`` (matmul, attention, conv), its integer sizes, and the op
    name its rows carry (default: ``kind``; a model's linears are timed as 'linear')."""

    kind: str
    sizes: tuple[tuple[str, int], ...]
    label: str | None = None


def make_case(spec: CaseSpec) -> OpCase:
    makers = {"matmul": matmul_case, "attention": attention_case, "conv": conv_case, "grouped_matmul": grouped_case}
    case = makers[spec.kind](**dict(spec.sizes))
    return OpCase(spec.label, case.shape, case.flops, case.build, case.training) if spec.label else case


def shape_sizes(shape: str) -> dict[str, int]:
    """The integer sizes of a row's shape key ('E=8,m=256,...,bmm,fwd+bwd' -> {'E': 8, 'm': 256, ...})."""
    pairs = (part.split("=", 1) for part in shape.split(",") if "=" in part)
    return {key: int(value) for key, value in pairs if value.isdigit()}


def kernel_calls(op: str, shape: str) -> int:
    """Cost-model ops one timed call of ``op`` stands for (module docstring): 3 * E for a grouped GEMM."""
    if op == "grouped_matmul":
        return 3 * shape_sizes(shape)["E"]
    return KERNEL_CALLS.get(op, 1)


def matmul_case(*, m: int, n: int, k: int) -> OpCase:
    """A training linear's three GEMMs (module docstring): y = x W^T, dX = dY W, dW = dY^T x."""

    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        if dtype in FP8_DTYPES:
            return _scaled_gemms(m=m, n=n, k=k, device=device)
        x, weight, grad = (torch.randn(*size, dtype=dtype, device=device) for size in ((m, k), (n, k), (m, n)))
        return lambda: (torch.mm(x, weight.t()), torch.mm(grad, weight), torch.mm(grad.t(), x))

    return OpCase("matmul", f"m={m},n={n},k={k},fwd+bwd", 3.0 * 2.0 * m * n * k, build)


def _scaled_gemms(*, m: int, n: int, k: int, device: torch.device) -> Callable[[], Any]:
    """The same three GEMMs in FP8 (e4m3 operands, per-tensor scales, bf16 out): ``torch._scaled_mm``
    takes a row-major first and a column-major second operand, so each is built in that layout
    (the casts and transposes a recipe adds are element-wise passes, priced apart)."""

    def operands(rows: int, inner: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.randn(rows, inner, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(cols, inner, device=device).to(torch.float8_e4m3fn).t()
        return a, b

    gemms = [operands(m, k, n), operands(m, n, k), operands(n, m, k)]  # y = x W^T, dX = dY W, dW = dY^T x
    one = torch.ones((), device=device)

    def step() -> Any:
        return [torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16) for a, b in gemms]

    return step


def grouped_case(*, experts: int, m: int, k: int, n: int, native: int = 1) -> OpCase:
    """An MoE layer's expert GEMMs as training runs them: E experts of ``m`` rows each, y_e = x_e W_e
    (W_e: k x n), then dX_e = dY_e W_e^T and dW_e = x_e^T dY_e. ``native``: one ``torch._grouped_mm``
    per GEMM (row offsets per expert, as torchtitan's MoE calls it), else ``torch.bmm`` over the
    experts (the same FLOPs; the rows are equal, so no loop is needed)."""
    kernel = "grouped_mm" if native else "bmm"

    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        x, weight, grad = (
            torch.randn(*size, dtype=dtype, device=device)
            for size in ((experts, m, k), (experts, k, n), (experts, m, n))
        )
        if not native:
            return lambda: (
                torch.bmm(x, weight),
                torch.bmm(grad, weight.transpose(1, 2)),
                torch.bmm(x.transpose(1, 2), grad),
            )
        flat_x, flat_grad = x.reshape(experts * m, k), grad.reshape(experts * m, n)
        offs = torch.arange(m, experts * m + 1, m, dtype=torch.int32, device=device)
        flat_x_t = flat_x.t()
        weight_t = weight.transpose(1, 2)
        return lambda: (
            torch._grouped_mm(flat_x, weight, offs=offs),
            torch._grouped_mm(flat_grad, weight_t, offs=offs),
            torch._grouped_mm(flat_x_t, flat_grad, offs=offs),
        )

    flops = 3.0 * experts * 2.0 * m * k * n
    return OpCase("grouped_matmul", f"E={experts},m={m},k={k},n={n},{kernel},fwd+bwd", flops, build)


def grouped_mm_works(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether this torch runs ``torch._grouped_mm`` (forward and both backward layouts) in ``dtype``
    on ``device``: a tiny case, run once."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        grouped_case(experts=2, m=16, k=16, n=16).build(dtype, device)()
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def attention_case(*, batch: int, heads: int, seq: int, head_dim: int, causal: int = 1, gpu: int = 0) -> OpCase:
    """SDPA forward + backward (gradients of q, k and v, as in training); ``gpu``: counted at the share of
    the scores a GPU kernel executes (module docstring)."""

    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        q, k, v = (
            torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True) for _ in range(3)
        )
        grad = torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device)

        def step() -> Any:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            return torch.autograd.grad(out, (q, k, v), grad)

        return step

    share = executed_fraction({"q_len": seq, "kv_len": seq, "causal": bool(causal)}) if gpu else 1.0
    forward = 4.0 * batch * heads * seq * seq * head_dim * share
    mask = "causal" if causal else "full"
    # the FLOPs the kernels run: the backward's four gradient matmuls and the scores it recomputes,
    # 2.5x the forward (autoplan/cost/compute/roofline.py executed_bwd_flops), at the executed share
    return OpCase(
        "attention", f"b={batch},h={heads},s={seq},d={head_dim},{mask},fwd+bwd", 3.5 * forward, build, training=True
    )


def conv_case(*, batch: int, channels: int, size: int) -> OpCase:
    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        x = torch.randn(batch, channels, size, size, dtype=dtype, device=device)
        w = torch.randn(channels, channels, 3, 3, dtype=dtype, device=device)
        return lambda: F.conv2d(x, w, padding=1)

    return OpCase(
        "conv", f"b={batch},c={channels},hw={size},k=3", 2.0 * batch * channels * channels * 9 * size * size, build
    )


def spec(kind: str, label: str | None = None, **sizes: int) -> CaseSpec:
    return CaseSpec(kind, tuple(sizes.items()), label)


@dataclass(frozen=True)
class ComputeSweep:
    """The shapes to time. Sizes grow geometrically so the fit sees both the overhead-bound
    and the saturated regime. ``attention``: (batch, heads, seq, head_dim, causal) at several
    sequence lengths, causal and full; ``grouped``: (experts, rows per expert, k, n)."""

    matmul: tuple[tuple[int, int, int], ...]
    attention: tuple[tuple[int, int, int, int, int], ...]
    conv: tuple[tuple[int, int, int], ...]
    grouped: tuple[tuple[int, int, int, int], ...] = ()
    budget_s: float = 0.25
    memory_bytes: int = 128 * 2**20
    overhead_budget_s: float = 0.1  # per chain timing of the op-overhead test (overhead.py); 0 skips it

    def specs(self) -> list[CaseSpec]:
        return (
            [spec("matmul", m=m, n=n, k=k) for m, n, k in self.matmul]
            + [spec("attention", batch=b, heads=h, seq=s, head_dim=d, causal=c) for b, h, s, d, c in self.attention]
            + [spec("grouped_matmul", experts=e, m=m, k=k, n=n) for e, m, k, n in self.grouped]
            + [spec("conv", batch=b, channels=c, size=hw) for b, c, hw in self.conv]
        )

    def cases(self) -> list[OpCase]:
        return [make_case(s) for s in self.specs()]


def both_masks(shapes: tuple[tuple[int, int, int, int], ...]) -> tuple[tuple[int, int, int, int, int], ...]:
    """Each (b, h, s, d) attention shape causal and full."""
    return tuple((*shape, causal) for shape in shapes for causal in (1, 0))


DEFAULT_SWEEP = ComputeSweep(
    matmul=(
        (32, 32, 32),
        (64, 64, 64),
        (128, 128, 128),
        (256, 256, 256),
        (512, 512, 512),
        (1024, 1024, 1024),
        (2048, 256, 256),
        (256, 1024, 2048),
        (4096, 512, 128),
        (1024, 4096, 256),
        (64, 2048, 2048),
    ),
    attention=both_masks(((1, 4, 64, 64), (1, 4, 128, 64), (1, 8, 256, 64), (1, 8, 512, 64), (2, 8, 1024, 64))),
    conv=((1, 16, 16), (1, 32, 28), (2, 64, 28), (4, 64, 56)),
    grouped=((4, 32, 128, 128), (8, 64, 256, 256), (8, 128, 512, 256), (16, 128, 512, 512)),
)

#: Accelerators compute a 1024^3 GEMM in microseconds, all launch overhead: their sweep goes on to
#: shapes that take milliseconds (8192^3 is 3.3 TFLOP forward + backward) and attention at 8K
#: tokens, and copies 2 GiB, well past a GPU's L2 (60 MB on an H200), so that each curve sees its
#: saturated regime (fit.saturated_rate). Grouped GEMMs: rows per expert a multiple of the 128-row
#: tile (cost/moe/experts.py GPU_M_TILE), experts and widths of Mixtral (8 x 4096 -> 14336), Qwen3-30B-A3B
#: (128 x 2048 -> 768) and DeepSeek-V3-like (256 x 7168 -> 2048) layers at a few tokens per expert.
ACCELERATOR_SWEEP = ComputeSweep(
    matmul=(
        (256, 256, 256),
        (512, 512, 512),
        (1024, 1024, 1024),
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (16384, 1024, 4096),
        (4096, 14336, 4096),
        (8192, 4096, 14336),
    ),
    attention=both_masks(((1, 8, 512, 64), (2, 16, 1024, 128), (4, 16, 2048, 128), (2, 32, 4096, 128)))
    + ((1, 32, 8192, 128, 1),),
    conv=((8, 64, 56), (16, 128, 56), (32, 256, 56), (64, 256, 56)),
    grouped=(
        (8, 128, 4096, 14336),
        (8, 1024, 4096, 14336),
        (128, 128, 2048, 768),
        (128, 512, 2048, 768),
        (32, 256, 7168, 2048),
    ),
    memory_bytes=2 * 2**30,
)


def default_sweep(device: torch.device) -> ComputeSweep:
    """The CPU sweep on a CPU, the accelerator sweep on anything else."""
    return DEFAULT_SWEEP if device.type == "cpu" else ACCELERATOR_SWEEP


QUICK_SWEEP = ComputeSweep(
    matmul=((32, 32, 32), (128, 128, 128), (512, 512, 512)),
    attention=((1, 4, 64, 64, 1), (1, 4, 256, 64, 1), (1, 4, 256, 64, 0)),
    conv=((1, 16, 16), (1, 32, 32)),
    grouped=((2, 32, 64, 64), (4, 64, 128, 128), (8, 64, 256, 128)),
    budget_s=0.03,
    memory_bytes=16 * 2**20,
    overhead_budget_s=0.01,
)


def dtype_specs(sweep: ComputeSweep, *, dtype_name: str, device: torch.device) -> list[CaseSpec]:
    """The sweep's cases in one dtype: fp8 only its matmuls (scaled GEMMs); grouped GEMMs with
    ``native`` set where ``torch._grouped_mm`` runs in that dtype on ``device`` (else torch.bmm); attention
    with ``gpu`` set off a CPU (its FLOPs counted as a GPU kernel executes them)."""
    dtype = DTYPE_NAMES[dtype_name]
    if dtype in FP8_DTYPES:
        return [s for s in sweep.specs() if s.kind == "matmul"]
    native = int(bool(sweep.grouped) and grouped_mm_works(dtype, device))
    extra = {"grouped_matmul": ("native", native), "attention": ("gpu", int(device.type != "cpu"))}
    return [CaseSpec(s.kind, (*s.sizes, extra[s.kind]), s.label) if s.kind in extra else s for s in sweep.specs()]


def time_case(
    case: OpCase, *, dtype_name: str, device: torch.device, budget_s: float, concurrent: bool = False
) -> OpTiming:
    """Median time of one case in one dtype (``concurrent``: timed by all ranks at once)."""
    grad_mode = contextlib.nullcontext() if case.training else torch.no_grad()
    with tf32_mode(dtype_name), grad_mode:
        fn = case.build(DTYPE_NAMES[dtype_name], device)
        time_s = median_time_s(fn, device=device, budget_s=budget_s, concurrent=concurrent)
    return OpTiming(op=case.op_class, shape=case.shape, dtype=dtype_name, time_s=time_s, flops=case.flops)


def memory_bandwidth(
    *, device: torch.device, nbytes: int, budget_s: float, concurrent: bool = False
) -> tuple[float, float]:
    """(copy bandwidth bytes/s, achieved fraction of it for memory-bound kernels)."""
    numel = nbytes // 4
    src, other, dst = (torch.randn(numel, device=device) for _ in range(3))

    def timed(fn: Callable[[], Any]) -> float:
        return median_time_s(fn, device=device, budget_s=budget_s, concurrent=concurrent)

    with torch.no_grad():
        copy_bw = 2 * nbytes / timed(lambda: dst.copy_(src))
        add_bw = 3 * nbytes / timed(lambda: torch.add(src, other, out=dst))
        gelu_bw = 2 * nbytes / timed(lambda: torch.nn.functional.gelu(src))
    return copy_bw, min(1.0, (add_bw + gelu_bw) / (2 * copy_bw))
