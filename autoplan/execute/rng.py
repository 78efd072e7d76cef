"""Random numbers in a parallel run: dropout masks under tensor and pipeline parallelism, and
dropout turned off for ``--verify`` (docs/executor.md, "Randomness: dropout masks and --verify").

Which ranks draw the same masks (Megatron-LM's model-parallel RNG tracker,
``megatron/core/tensor_parallel/random.py``; torchtitan's ``set_determinism``):

- a tp group draws *the same* mask on a replicated activation and *independent* masks on the
  shards of a sharded one (:class:`ShardSeededTracker` on the CPU: seed + 2718 + the shard's index,
  Megatron's ``tp_rank`` rule; torch's ``OffsetBasedRNGTracker`` on CUDA; :func:`install_tracker`);
- pipeline stages draw from streams of their own (:func:`seed_step`, per step);
- dp ranks share the seed.

:func:`dropout_off` (a torch function mode) makes every dropout, ``F.dropout`` and attention
``dropout_p`` return its input under ``--verify``, and counts other random draws so they can be named. Given the
model, it also sets each stochastic-depth module's rate to 0 (:data:`STOCHASTIC_DEPTH`), before the model is copied
for the reference and split into stages: those draw with ``torch.rand`` / ``bernoulli_``, which no function mode can
tell from a draw the model needs, and return their input at rate 0.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import _random as dtensor_random
from torch.overrides import TorchFunctionMode

#: dropout streams start here, away from the seeds the runner draws batches with (seed + 1 + step)
STREAM_OFFSET = 2**40
#: one stream per (step, pipeline stage): stages below this never share a seed
MAX_STAGES = 2**16
#: sub-seeds of sharded random ops are drawn below this (fits torch.manual_seed's 64 bits with the shard index)
SUBSEED_LIMIT = 2**62


class ShardSeededTracker(dtensor_random._RNGStateTracker):
    """DTensor's RNG tracker for meshes without Philox offsets (the CPU): module docstring."""

    def __init__(self, mesh: DeviceMesh):
        super().__init__(torch.device(mesh.device_type))

    @contextlib.contextmanager
    def _distribute_region(self, spec, generator: torch.Generator | None = None):
        shard = shard_index(spec)
        if shard is None:  # replicated: the synchronised generator, the same draw on every rank
            with _on_default(generator):
                yield
            return
        source = generator if generator is not None else torch.default_generator
        subseed = int(torch.randint(SUBSEED_LIMIT, (), generator=source))  # advances every rank alike
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(subseed + shard)
            yield


def shard_index(spec) -> int | None:
    """The linear index of this rank's shard of a DTensor (torch's own shard coordinates,
    ``torch.distributed.tensor._random``), or None when no placement shards it."""
    coordinate = spec.mesh.get_coordinate()
    if coordinate is None or not any(p.is_shard() for p in spec.placements):
        return None
    index, count = dtensor_random._calc_shard_info(coordinate, spec)
    return int(dtensor_random._calc_shard_linear_idx(index, count))


@contextlib.contextmanager
def _on_default(generator: torch.Generator | None):
    """Run a random op that DTensor took ``generator`` from on the default generator, with
    ``generator``'s state, and give the advanced state back to it."""
    if generator is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(generator.get_state())
        yield
        generator.set_state(torch.get_rng_state())


def install_tracker(tp_mesh: DeviceMesh) -> None:
    """Make DTensor draw random numbers per the module docstring on ``tp_mesh``'s device type:
    torch's Philox-offset tracker where the device has one (CUDA), else :class:`ShardSeededTracker`.
    Every rank has seeded its generator alike (:func:`seed_step`), so no state is broadcast."""
    handle = getattr(torch, tp_mesh.device_type, None)
    if tp_mesh.device_type != "cpu" and hasattr(handle, "set_rng_state"):
        dtensor_random._rng_tracker = dtensor_random.OffsetBasedRNGTracker(tp_mesh, run_state_sync=False)
    else:
        dtensor_random._rng_tracker = ShardSeededTracker(tp_mesh)


def seed_step(*, seed: int, step: int, pp_rank: int) -> None:
    """Seed this rank's generators for the random ops of training step ``step``: the same on every
    dp and tp rank of a pipeline stage, a stream of its own per stage (module docstring), apart from
    the stream the step's batch was drawn from. Call after drawing the (global, identical) batch."""
    torch.manual_seed(STREAM_OFFSET + (seed + 1 + step) * MAX_STAGES + pp_rank)


# ---- dropout off for --verify ------------------------------------------------------------------

#: dropout functions (and their in-place forms) whose output with dropout off is their input
DROPOUT_FUNCTIONS = frozenset(
    {
        F.dropout,
        F.dropout1d,
        F.dropout2d,
        F.dropout3d,
        F.alpha_dropout,
        F.feature_alpha_dropout,
        torch.dropout,
        torch.dropout_,
        torch.feature_dropout,
        torch.feature_dropout_,
        torch.alpha_dropout,
        torch.alpha_dropout_,
        torch.feature_alpha_dropout,
        torch.feature_alpha_dropout_,
        # what a torch.export-ed graph calls (a pipeline stage): the same ops as aten overloads
        *(
            getattr(torch.ops.aten, f"{kind}dropout{inplace}").default
            for kind in ("", "feature_", "alpha_", "feature_alpha_")
            for inplace in ("", "_")
        ),
    }
)
#: attention with a dropout_p argument, in Python and in an exported graph
ATTENTION_FUNCTIONS = frozenset({F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default})
#: aten ops (any overload) that draw random numbers, as an exported graph calls them: counted
RANDOM_ATEN = frozenset(
    {
        "bernoulli",
        "bernoulli_",
        "native_dropout",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "normal_",
        "uniform_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "random_",
        "multinomial",
    }
)
#: random draws that are not dropout: counted, left as they are
OTHER_RANDOM = frozenset(
    {
        torch.bernoulli,
        torch.Tensor.bernoulli,
        torch.Tensor.bernoulli_,
        torch.native_dropout,
        torch.rand,
        torch.rand_like,
        torch.randn,
        torch.randn_like,
        torch.randint,
        torch.randint_like,
        torch.randperm,
        torch.normal,
        torch.multinomial,
        torch.Tensor.multinomial,
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        torch.Tensor.exponential_,
        torch.Tensor.geometric_,
        torch.Tensor.cauchy_,
        torch.Tensor.log_normal_,
        torch.Tensor.random_,
    }
)
#: stochastic depth's modules, by class-name suffix, and the attribute holding their rate: timm's and Hugging Face's
#: ``*DropPath`` (``drop_prob``), torchvision's ``StochasticDepth`` (``p``); each returns its input at rate 0
STOCHASTIC_DEPTH = (("DropPath", "drop_prob"), ("StochasticDepth", "p"))
SDPA_DROPOUT_INDEX = 4  # F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)
#: nn.MultiheadAttention's F.multi_head_attention_forward(query, ..., add_zero_attn, dropout_p, ...): torch takes a
#: mode off its stack while the mode handles a call, so the dropout it hands SDPA inside would pass the mode by
MHA_DROPOUT_INDEX, MHA_TRAINING_INDEX = 10, 13
_ops = torch.ops.aten
#: nn.LSTM's, nn.GRU's and nn.RNN's functions (called through torch._VF) and the aten ops an exported stage calls:
#: (input, hx, params, has_biases, num_layers, dropout, train, ...), with a packed sequence's batch sizes second
RNN_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
RNN_FUNCTIONS = frozenset(
    {getattr(torch, name) for name in RNN_NAMES}
    | {getattr(getattr(_ops, name), form) for name in RNN_NAMES for form in ("input", "data")}
)


class DropoutOff(TorchFunctionMode):
    """Every dropout call returns its input, and attention runs with ``dropout_p = 0``; counts
    the dropout calls that would have dropped (``dropped``) and the other random draws
    (``other_random``, by function name)."""

    def __init__(self):
        super().__init__()
        self.dropped = 0
        self.other_random: Counter[str] = Counter()
        self.depth_off = 0  # stochastic-depth modules whose rate was set to 0 (stochastic_depth_off)
        self._reruns: contextlib.ExitStack | None = None

    def __enter__(self):
        self._reruns = contextlib.ExitStack()
        self._reruns.enter_context(reruns_under(self))
        self._reruns.enter_context(host_draws_counted(self.other_random))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._reruns.close()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DROPOUT_FUNCTIONS:
            self.dropped += _would_drop(func, args, kwargs)
            return args[0] if args else kwargs["input"]
        if func in ATTENTION_FUNCTIONS:
            args, kwargs, rate = _without_attention_dropout(args, kwargs)
            self.dropped += int(rate > 0)
        elif func in RNN_FUNCTIONS:  # the dropout between stacked layers: (..., num_layers, dropout, train, ...)
            at = _rnn_dropout_index(args)
            args, _, rate = _without_attention_dropout(args, {}, index=at)
            self.dropped += int(rate > 0 and bool(args[at + 1]) and args[at - 1] > 1)
        elif func is F.multi_head_attention_forward:
            args, kwargs, rate = _without_attention_dropout(args, kwargs, index=MHA_DROPOUT_INDEX)
            training = kwargs.get("training", args[MHA_TRAINING_INDEX] if len(args) > MHA_TRAINING_INDEX else True)
            self.dropped += int(rate > 0 and training)
        elif func in OTHER_RANDOM or _random_aten(func):
            self.other_random[getattr(func, "__name__", str(func))] += 1
        return func(*args, **kwargs)


@contextlib.contextmanager
def reruns_under(mode: TorchFunctionMode):
    """Re-run checkpointed forwards under ``mode`` too. torch's autograd engine runs a backward without the torch
    function modes its forward ran under, and a checkpointed block re-runs its forward inside the backward
    (autoplan's recompute, a model's own ``torch.utils.checkpoint``): there dropout was on again, so the re-run
    saved other tensors than the forward (torch's CheckpointError) or other values. Both of torch's checkpoints
    are wrapped, while ``mode`` is entered: the re-run of the non-reentrant one (``_CheckpointFrame``'s
    ``recompute_fn``), and the reentrant one's backward; each enters ``mode`` where the stack lacks it."""
    from torch.utils import checkpoint as ckpt

    frame, reentrant = getattr(ckpt, "_CheckpointFrame", None), getattr(ckpt, "CheckpointFunction", None)
    init = frame.__init__ if frame is not None else None
    backward = reentrant.__dict__.get("backward") if reentrant is not None else None
    if init is not None:
        frame.__init__ = lambda self, recompute_fn, *a, **k: init(self, _entering(mode, recompute_fn), *a, **k)
    if isinstance(backward, staticmethod):
        reentrant.backward = staticmethod(_entering(mode, backward.__func__))
    try:
        yield
    finally:
        if init is not None:
            frame.__init__ = init
        if isinstance(backward, staticmethod):
            reentrant.backward = backward


#: draws of numpy's and Python's global generators, which no torch function mode sees (Hugging Face Wav2Vec2's
#: SpecAugment masks draw with numpy): counted by :func:`host_draws_counted`
HOST_RANDOM = {
    "numpy.random": ("rand", "randn", "random", "random_sample", "uniform", "normal", "randint", "choice",
                     "permutation", "shuffle", "binomial", "poisson"),
    "random": ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample", "gauss"),
}  # fmt: skip


@contextlib.contextmanager
def host_draws_counted(counts: Counter):
    """Count each call of :data:`HOST_RANDOM`'s functions into ``counts`` (as ``numpy.random.rand``) while entered."""
    import importlib

    patched = []
    for module_name, names in HOST_RANDOM.items():
        module = importlib.import_module(module_name)
        for name in names:
            original = getattr(module, name, None)
            if original is not None:
                patched.append((module, name, original))
                setattr(module, name, _counted(original, f"{module_name}.{name}", counts))
    try:
        yield
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


def _counted(fn, name: str, counts: Counter):
    def draw(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)

    return draw


def _entering(mode: TorchFunctionMode, fn):
    """``fn`` run under ``mode`` where the torch function mode stack lacks it (inside a backward)."""

    def run(*args, **kwargs):
        if any(m is mode for m in _function_modes()):
            return fn(*args, **kwargs)
        torch.overrides._push_mode(mode)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.overrides._pop_mode()

    return run


def _function_modes() -> list:
    return torch.overrides._get_current_function_mode_stack()


def _random_aten(func) -> bool:
    return isinstance(func, torch._ops.OpOverload) and func.overloadpacket.__name__ in RANDOM_ATEN


def _rnn_dropout_index(args: tuple) -> int:
    """Where a recurrent function's ``dropout`` is: 5, or 6 after a packed sequence's batch sizes (an integer
    vector second, where the unpacked call has its hidden state)."""
    second = args[1]
    packed = isinstance(second, torch.Tensor) and second.dim() == 1 and not second.is_floating_point()
    return 6 if packed else 5


def _would_drop(func, args: tuple, kwargs: dict) -> int:
    """1 when this dropout call, left alone, would have dropped anything (p > 0 in training)."""
    try:
        if isinstance(func, torch._ops.OpOverload):
            raise TypeError("an aten op: (input, p, train)")
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
    except (TypeError, ValueError):  # torch's builtins and aten ops: (input, p, train), all given
        values = {**dict(zip(("input", "p", "train"), args)), **kwargs}
    training = values.get("training", values.get("train", True))
    return int(bool(training) and float(values.get("p", 0.0)) > 0)


def _without_attention_dropout(args: tuple, kwargs: dict, index: int = SDPA_DROPOUT_INDEX) -> tuple[tuple, dict, float]:
    """An attention function's arguments with ``dropout_p`` (positional ``index``) = 0, and the rate it had."""
    rate = float(kwargs.get("dropout_p", args[index] if len(args) > index else 0.0))
    if len(args) > index:
        args = (*args[:index], 0.0, *args[index + 1 :])
    if "dropout_p" in kwargs:
        kwargs = {**kwargs, "dropout_p": 0.0}
    return args, kwargs, rate


def dropout_off(model: torch.nn.Module | None = None) -> DropoutOff:
    """A context (a torch function mode) in which dropout is off; ``model``'s stochastic depth off for good (module
    docstring): call before the model is copied or split."""
    mode = DropoutOff()
    if model is not None:
        mode.depth_off = stochastic_depth_off(model)
    return mode


def stochastic_depth_off(model: torch.nn.Module) -> int:
    """Set the rate of each of ``model``'s stochastic-depth modules (:data:`STOCHASTIC_DEPTH`) to 0; how many had."""
    turned = 0
    for module in model.modules():
        for suffix, attribute in STOCHASTIC_DEPTH:
            rate = getattr(module, attribute, None)
            if type(module).__name__.endswith(suffix) and type(rate) in (int, float) and rate > 0:
                setattr(module, attribute, 0.0)
                turned += 1
    return turned


def describe(mode: DropoutOff) -> str:
    """How --verify controlled randomness, in words, after the run and its reference ran under ``mode``."""
    if mode.dropped:
        said = f"dropout off in the run and in the reference ({mode.dropped} calls with p > 0 returned their input)"
    else:
        said = "dropout off in the run and in the reference (the model ran no dropout with p > 0)"
    if mode.depth_off:
        said += f", and stochastic depth ({mode.depth_off} modules' rate set to 0)"
    if mode.other_random:
        drawn = ", ".join(f"{name} x{count}" for name, count in sorted(mode.other_random.items()))
        said += f"; the model also draws random numbers outside dropout ({drawn}), which the two draw differently"
    return said
