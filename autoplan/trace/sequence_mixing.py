"""Ops that combine values along one dim of a tensor, other than attention: the dims a context-parallel shard of the
sequence cannot run alone (types/context_parallel.py ``cp_refusal``; docs/trace.md, "Op kinds and attrs").

Context parallelism gives each rank a shard of the sequence from the first block to the loss, and only attention
exchanges keys and values between the shards. Any other op that reads other positions of the sequence computes, on
a shard, something else: a scan (``cumsum``, ``logcumsumexp``: minGRU, RetNet, Mamba's chunked forms), a token
shift (``F.pad`` or ``roll`` along the sequence: RWKV), a causal or depthwise convolution along it (Mamba, Hyena,
ConvNeXt-1D), an FFT over it, a reduction over it (a mean over the tokens inside a block), a sort or top-k over it,
a slice, a pick or a concatenation of it, a recurrence over it (an LSTM, a Python loop over its
positions). Each such op records ``attrs["mixes"]``: the sizes of the dims it combines along.

A dim is recorded unless the reading is ambiguous: the tensor's last dim, where another of its dims has the same
size (a norm over the hidden size of ``[B, S, D]`` with D = S, rotary's half of a head of S features), is left out.
An op over the whole tensor (a loss term, a scalar) is not recorded: it splits as a micro-batch's does.
"""

from __future__ import annotations

from typing import Any

import torch

_SCANS = ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
_REDUCTIONS = (
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "std_mean", "logsumexp",
    "softmax", "_softmax", "log_softmax", "_log_softmax", "argmax", "argmin", "any", "all", "sort", "argsort",
)  # fmt: skip
_PADS = ("pad", "constant_pad_nd", "reflection_pad1d", "replication_pad1d", "circular_pad1d")
_POOLS = ("avg_pool1d", "max_pool1d", "max_pool1d_with_indices", "lp_pool1d")
_FFTS = {"fft_fft": 2, "fft_rfft": 2, "fft_irfft": 2, "fft_ifft": 2, "fft_hfft": 2, "fft_ihfft": 2}  # dim's index
_ATEN_FFTS = ("_fft_r2c", "_fft_c2r", "_fft_c2c")
_RNNS = ("lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer")


class LossMixing(torch.overrides.TorchFunctionMode):
    """While entered (around the loss function's trace): the sizes of the dims its ops shift, slice, pick or scan
    along, in ``sizes``. A causal LM's loss written as ``logits[:, :-1]`` against ``target[:, 1:]`` pairs each
    position with the next, which under context parallelism pairs tokens across the shards' chunk boundaries
    (gradients 26-36% off, no error). Reductions are left out: a mean over the tokens splits as the loss's shards are
    weighed (execute/cp_loss.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "").strip("_")
        if name not in _REDUCTIONS:
            self.sizes.update(mixed_sizes(name, "", args, kwargs, None))
        return func(*args, **kwargs)


def mixed_sizes(name: str, kind: str, args: tuple, kwargs: dict, module: torch.nn.Module | None) -> list[int]:
    """The sizes of the dims the op ``name`` (its short name, trace/classify.py) combines values along (module
    docstring); [] for a token-wise op."""
    tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if kind == "conv":
        weight = module.weight if module is not None else _arg(args, kwargs, 1, "weight")
        return _sizes(tensor, _spatial_dims(tensor, weight)) if isinstance(weight, torch.Tensor) else []
    if name == "cat" and args and isinstance(args[0], (list, tuple)):
        parts = [t for t in args[0] if isinstance(t, torch.Tensor)]
        dim = _arg(args, kwargs, 1, "dim", 0)
        return sorted({s for t in parts for s in _sizes(t, [dim])}) if len(parts) > 1 else []
    if tensor is None:
        return []
    if isinstance(module, torch.nn.RNNBase) or name in _RNNS:  # a recurrence over the sequence (and the batch)
        return _sizes(tensor, list(range(tensor.dim() - 1)))
    return _sizes(tensor, _dims(name, tensor, args, kwargs))


def _dims(name: str, tensor: torch.Tensor, args: tuple, kwargs: dict) -> list[int]:
    """The dims of ``tensor`` the op combines along."""
    if name in _SCANS:
        return [_arg(args, kwargs, 1, "dim", 0)]
    if name in _REDUCTIONS:
        dim = _arg(args, kwargs, 1, "dim", None)
        if name in ("sort", "argsort") and dim is None:
            dim = -1
        return _as_dims(dim)
    if name in ("topk", "kthvalue"):
        return [_arg(args, kwargs, 2, "dim", -1)]
    if name in ("roll", "flip"):
        dims = _arg(args, kwargs, 2 if name == "roll" else 1, "dims", None)
        return list(range(tensor.dim())) if dims is None else _as_dims(dims)
    if name in _PADS:
        pads = list(_arg(args, kwargs, 1, "pad", ()))
        return [-1 - i for i in range(len(pads) // 2) if pads[2 * i] or pads[2 * i + 1]]
    if name in ("diff", "unfold"):
        return [_arg(args, kwargs, 2 if name == "diff" else 1, "dim" if name == "diff" else "dimension", -1)]
    if name in _POOLS:
        return [-1]
    if name in _FFTS:
        return [_arg(args, kwargs, _FFTS[name], "dim", -1)]
    if name in _ATEN_FFTS:
        return list(_arg(args, kwargs, 1, "dim", ()))
    if name == "select":  # one position of the dim: a Python loop over time steps, a token picked for all
        return [_arg(args, kwargs, 1, "dim", 0)]
    if name in ("slice", "narrow"):
        return _sliced(tensor, args, kwargs, name)
    if name == "getitem" and len(args) > 1:
        return _indexed(tensor, args[1])
    return []


def _as_dims(dim: Any) -> list[int]:
    """A ``dim`` argument (an int, a list of them, or None: every dim, a whole-tensor op) as a list."""
    if isinstance(dim, (list, tuple)):
        return [d for d in dim if isinstance(d, int)]
    return [dim] if isinstance(dim, int) else []


def _sliced(tensor: torch.Tensor, args: tuple, kwargs: dict, name: str) -> list[int]:
    """aten.slice(x, dim, start, end, step) or narrow(x, dim, start, length): the dim when not taken whole."""
    dim = _arg(args, kwargs, 1, "dim", 0)
    size = tensor.shape[dim]
    if name == "narrow":
        start, length = _arg(args, kwargs, 2, "start", 0), _arg(args, kwargs, 3, "length", size)
        return [] if (start, length) == (0, size) else [dim]
    start, end = _arg(args, kwargs, 2, "start", None), _arg(args, kwargs, 3, "end", None)
    step = _arg(args, kwargs, 4, "step", 1)
    return [] if _whole(slice(start, end, step), size) else [dim]


def _indexed(tensor: torch.Tensor, index: Any) -> list[int]:
    """``x[...]`` with slices, integers and one Ellipsis only (no None, no tensor): each dim an integer picks from
    or a slice does not take whole. The Ellipsis stands for the dims it spans (HF's causal-LM loss shifts with
    ``logits[..., :-1, :]``)."""
    index = index if isinstance(index, tuple) else (index,)
    if index.count(Ellipsis) == 1:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (tensor.dim() - len(index) + 1) + index[at + 1 :]
    if not all(isinstance(i, (slice, int)) for i in index) or len(index) > tensor.dim():
        return []
    return [d for d, i in enumerate(index) if isinstance(i, int) or not _whole(i, tensor.shape[d])]


def _whole(part: slice, size: int) -> bool:
    try:
        return range(size)[part] == range(size)
    except (TypeError, ValueError):  # a symbolic bound: not read
        return True


def _spatial_dims(tensor: torch.Tensor | None, weight: torch.Tensor) -> list[int]:
    """A convolution's spatial dims whose kernel is wider than one (a 1 x 1 convolution is token-wise)."""
    if tensor is None:
        return []
    offset = tensor.dim() - (weight.dim() - 2)
    return [offset + k for k, width in enumerate(weight.shape[2:]) if width > 1]


def _sizes(tensor: torch.Tensor | None, dims: list[Any]) -> list[int]:
    """The sizes of ``dims`` of ``tensor``, but the ambiguous last dim (module docstring)."""
    if tensor is None or not tensor.dim():
        return []
    shape, sizes = [int(s) for s in tensor.shape], []
    for dim in dims:
        if not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
            continue
        dim %= len(shape)
        ambiguous = dim == len(shape) - 1 and shape.count(shape[dim]) > 1
        if not ambiguous and shape[dim] > 1 and shape[dim] not in sizes:
            sizes.append(shape[dim])
    return sizes


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default
