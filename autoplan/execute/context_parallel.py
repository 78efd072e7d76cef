"""Context parallelism in the executor: where the sequence is sharded and how attention reaches its
shards (docs/executor.md, "Context parallelism"; the rule of which models it runs:
autoplan/types/context_parallel.py).

Every sequence of ``S`` tokens is cut into 2cp chunks; cp rank r keeps chunks r and 2cp-1-r (head-
tail balancing, torch's ``_HeadTailLoadBalancer`` order), ``2c = S / cp`` tokens, in that order.

- **Where**: at every block's inputs. A forward pre-hook on each block keeps this rank's positions
  of each tensor argument that carries the whole sequence: the hidden states entering the first
  block, and rotary tables or any other sequence-long argument entering every block. The model's
  own inputs and what runs before the first block (embeddings, positions built with
  ``torch.arange(T)``, rotary tables sliced ``[:T]``) run whole, so positions stay global. Hidden
  states leave each block already sharded, and so do the model's outputs; the targets are sharded
  the same way (:meth:`ContextParallel.shard_target`), and each rank's loss is its shard's mean (weighed by
  the tokens it scores where targets skip some: cp_loss.py), the cp group's mean the reference's; dp x cp average.
- **Which dim**: a tensor whose dim 0 is the micro-batch carries the sequence in dim 1; a mask over
  the scores (``[B or 1, H or 1, S or 1, S]``) in none: it stays whole, and attention takes its shard's rows;
  any other in its first dim of length S.
- **Attention**: a torch function mode, entered by each block's forward (so by a recomputed
  forward too, and by a pipeline stage's exported block), replaces SDPA calls on shards (query and
  key length 2c; ``F.scaled_dot_product_attention`` or the aten op an exported graph calls) by
  autoplan's all-gather attention (gloo) or torch's CP attention (NCCL), both in cp_attention.py;
  DTensor operands (tensor parallelism's heads) run on their local heads. Every other op runs on
  the shard unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from autoplan.errors import PlanError, RunError
from autoplan.execute import cp_attention
from autoplan.types.plan import Plan

#: how attention is called: from Python, and from a pipeline stage's exported graph
SDPA_FUNCTIONS = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)
#: torch's Python functions that call SDPA by torch.nn.functional's module-level name: nn.MultiheadAttention's. torch
#: takes a mode off its stack while the mode handles a call, so the SDPA inside would pass the mode by (the PyTorch
#: tutorial's nn.TransformerEncoder ran attention on each rank's shard alone: gradients 100% off)
SDPA_CALLERS = (F.multi_head_attention_forward,)
#: the cp variant -> torch's rotate method on NCCL (ring passes KV round the group)
TORCH_ROTATE_METHOD = {"allgather": "allgather", "ring": "alltoall"}


def head_tail_positions(*, seq_len: int, cp: int, rank: int, device: Any = None) -> torch.Tensor:
    """The global positions cp rank ``rank`` holds: chunks rank and 2cp-1-rank of 2cp (module docstring)."""
    c = seq_len // (2 * cp)
    head = torch.arange(rank * c, (rank + 1) * c)
    tail = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)
    return torch.cat([head, tail]).to(device)


def sequence_dim(shape: torch.Size | tuple, *, seq_len: int, batch: int) -> int | None:
    """The dim of a tensor of ``shape`` that carries the whole sequence, or None (module docstring)."""
    if len(shape) >= 2 and shape[0] == batch and shape[1] == seq_len:
        return 1
    if _is_score_mask(shape, seq_len=seq_len):
        return None
    if len(shape) >= 2 and shape[0] == batch:
        return None
    return next((d for d, size in enumerate(shape) if size == seq_len), None)


def _is_score_mask(shape: torch.Size | tuple, *, seq_len: int) -> bool:
    """A mask over the scores of the whole sequence as SDPA takes it, ``[B or 1, H or 1, S or 1, S]``
    (types/context_parallel.py ``is_score_mask``)."""
    from autoplan.types.context_parallel import is_score_mask

    return is_score_mask(shape, q_len=seq_len, kv_len=seq_len)


def shard_sequence(obj: Any, *, positions: torch.Tensor, seq_len: int, batch: int) -> Any:
    """``obj`` with every plain tensor that carries the whole sequence cut to ``positions``."""
    if isinstance(obj, torch.Tensor):
        dim = sequence_dim(obj.shape, seq_len=seq_len, batch=batch)
        return obj if dim is None else obj.index_select(dim, positions.to(obj.device))
    if isinstance(obj, (tuple, list)):
        return type(obj)(shard_sequence(o, positions=positions, seq_len=seq_len, batch=batch) for o in obj)
    if isinstance(obj, dict):
        return {k: shard_sequence(v, positions=positions, seq_len=seq_len, batch=batch) for k, v in obj.items()}
    return obj


def _sdpa_arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    """F.scaled_dot_product_attention's arguments by name."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    return {**defaults, **bound}


class _AttentionOnShards(TorchFunctionMode):
    """Routes SDPA calls on sequence shards to context-parallel attention (module docstring); meta
    tensors (a pipeline stage's shape inference) only need the shape, which is the query's."""

    def __init__(self, cp: "ContextParallel"):
        super().__init__()
        self.cp = cp

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SDPA_CALLERS:
            with _sdpa_named(functools.partial(self._attention, F.scaled_dot_product_attention)):
                return func(*args, **kwargs)
        if func not in SDPA_FUNCTIONS:
            return func(*args, **kwargs)
        return self._attention(func, *args, **kwargs)

    def _attention(self, func, *args, **kwargs):
        """SDPA ``func`` on shards routed to the cp group; on anything else run as called."""
        call = _sdpa_arguments(args, kwargs)
        q, k = call["query"], call["key"]
        local = self.cp.local_len
        if q.size(-2) != local or k.size(-2) != local or q.is_meta or _on_cp_mesh(q, self.cp.cp_mesh):
            return func(*args, **kwargs)
        if call["attn_mask"] is not None:
            self.cp.check_mask(call["attn_mask"])
        return self.cp.attention(**call)


@contextlib.contextmanager
def _sdpa_named(routed):
    """torch.nn.functional's module-level ``scaled_dot_product_attention`` is ``routed`` for the context: what
    torch's own Python functions (SDPA_CALLERS) call by that name."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


#: torch's message when two operands of an elementwise op disagree on one dim
_MISMATCH = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def _on_cp_mesh(tensor: torch.Tensor, cp_mesh: DeviceMesh) -> bool:
    """Whether ``tensor`` is already a DTensor of the cp mesh (torch's CP dispatch on its way)."""
    return isinstance(tensor, DTensor) and tensor.device_mesh == cp_mesh


@dataclass
class ContextParallel:
    """One rank's context parallelism: its cp group, the sequence length and how attention runs."""

    cp_mesh: DeviceMesh
    seq_len: int
    micro_batch_size: int
    variant: str
    backend: str
    kv_group: dist.ProcessGroup  # the cp group's KV exchange, a group of its own (build_context_parallel)

    @property
    def cp(self) -> int:
        return self.cp_mesh.size()

    @property
    def rank(self) -> int:
        return self.cp_mesh.get_local_rank()

    @property
    def local_len(self) -> int:
        return self.seq_len // self.cp

    def positions(self, device: Any = None) -> torch.Tensor:
        return head_tail_positions(seq_len=self.seq_len, cp=self.cp, rank=self.rank, device=device)

    def install(self, *, model: nn.Module, blocks: list[str]) -> None:
        """A pre-hook on each of ``blocks`` present in ``model`` that shards its sequence-long inputs.
        Before the pipeline split, which traces it into the stage graphs."""
        present = dict(model.named_modules())
        for fqn in blocks:
            if fqn in present:
                present[fqn].register_forward_pre_hook(self._shard_inputs, with_kwargs=True)

    def _shard_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        positions, batch = self.positions(), self.micro_batch_size
        kept = {"positions": positions, "seq_len": self.seq_len, "batch": batch}
        return shard_sequence(args, **kept), shard_sequence(kwargs, **kept)

    def shard_target(self, target: Any, *, batch: int) -> Any:
        """This rank's shard of a target batch of ``batch`` samples (module docstring)."""
        return shard_sequence(target, positions=self.positions(), seq_len=self.seq_len, batch=batch)

    def check_mask(self, mask: torch.Tensor) -> None:
        """Raise PlanError unless ``mask`` is one the variant applies: over the whole sequence's queries (or
        broadcast over them) and keys, made before the blocks (types/context_parallel.py MASKED_CP_VARIANTS)."""
        from autoplan.types.context_parallel import MASKED_CP_VARIANTS

        if self.variant not in MASKED_CP_VARIANTS:
            raise PlanError(
                f"context parallelism's {self.variant} attention cannot apply the explicit mask this model's "
                f"attention takes; plan cp_variant={MASKED_CP_VARIANTS[0]} (or cp=1)."
            )
        if not _is_score_mask(mask.shape, seq_len=self.seq_len):
            raise PlanError(
                f"context parallelism applies a mask of shape [batch or 1, heads or 1, {self.seq_len}, "
                f"{self.seq_len}] made before the first block, and attention here got one of shape "
                f"{list(mask.shape)} (made inside a block from its shard of the sequence, or 2-D); build such a "
                "mask before the first block and pass it in, or plan cp=1."
            )

    def attention(self, *, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
        """SDPA on this rank's shards; DTensor operands (tensor-parallel heads) run on their local heads. A mask
        (:meth:`check_mask`) runs through autoplan's all-gather or Ulysses attention on any backend."""
        placed = query if isinstance(query, DTensor) else None
        if placed is not None:
            query, key, value = (t.to_local() for t in (query, key, value))
        if isinstance(attn_mask, DTensor):
            attn_mask = attn_mask.full_tensor()
        kwargs = {"is_causal": is_causal, "dropout_p": dropout_p, "scale": scale, "enable_gqa": enable_gqa}
        if attn_mask is not None:
            kwargs["attn_mask"] = cp_attention.mask_of_heads(attn_mask, heads=query.size(1))
        if self.variant == "ulysses":
            self._check_heads(query, key)
            out = cp_attention.ulysses_attention(query, key, value, group=self.kv_group, **kwargs)
        elif self.backend == "nccl" and attn_mask is None:
            out = cp_attention.torch_cp_attention(query, key, value, cp_mesh=self.cp_mesh, **kwargs)
        else:
            out = cp_attention.allgather_attention(query, key, value, group=self.kv_group, **kwargs)
        if placed is None:
            return out
        return DTensor.from_local(out, placed.device_mesh, placed.placements, run_check=False)

    def refusal(self, exc: BaseException) -> PlanError | None:
        """A PlanError in place of ``exc`` when ``exc`` is an op meeting a shard and a whole sequence: the
        model mixes a block's output with a sequence-long tensor made outside the blocks (a skip from
        the embedding to the head), which sharding at the blocks' inputs cannot reach."""
        found = _MISMATCH.search(str(exc))
        if found is None or {int(found[1]), int(found[2])} != {self.local_len, self.seq_len}:
            return None
        return PlanError(
            f"context parallelism shards the sequence at the blocks' inputs ({self.local_len} of {self.seq_len} "
            "tokens per cp rank), and this model combines a block's output with a whole-sequence tensor made "
            "outside the blocks (e.g. a skip from the embedding to the head); plan cp=1 (docs/executor.md, "
            '"Context parallelism").'
        )

    def _check_heads(self, query: torch.Tensor, key: torch.Tensor) -> None:
        """Ulysses splits this rank's query and key/value heads over the cp group."""
        heads, kv_heads = query.size(1), key.size(1)
        if heads % self.cp or kv_heads % self.cp:
            raise PlanError(
                f"plan cp_variant='ulysses' splits attention heads over cp={self.cp}, and this rank's attention has "
                f"{heads} query and {kv_heads} key/value heads; use cp_variant='allgather' or a cp that divides them."
            )

    def route_attention(self, *, module: nn.Module, blocks: list[str]) -> None:
        """Each of ``blocks`` present in ``module`` runs its forward in the mode that routes attention on
        shards to the cp group. On the stage modules, after the pipeline split (which replaces a
        block's Python forward by its exported graph) and before recomputation, whose checkpoint
        then re-enters the mode when it re-runs the forward in backward (a mode entered around the
        step is not active there)."""
        present = dict(module.named_modules())
        for fqn in blocks:
            if fqn in present:
                present[fqn].forward = self._routed(present[fqn].forward)

    def _routed(self, forward):
        @functools.wraps(forward)
        def routed(*args, **kwargs):
            with _AttentionOnShards(self):
                return forward(*args, **kwargs)

        return routed


def check_cp_runs_here(plan: Plan) -> None:
    """Raise PlanError, in one sentence, when this machine's backend (NCCL with CUDA, else gloo) does
    not run the plan's cp variant, or the sequence its traced inputs record does not split into 2cp
    chunks: before a rank starts (autoplan/execute/tp_overlap.py ``check_runs_here``)."""
    if plan.cp == 1:
        return
    from autoplan.types.context_parallel import cp_divides, runnable_cp_variants

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    runs = runnable_cp_variants(backend)
    if plan.cp_variant not in runs:
        raise PlanError(
            f"plan cp_variant='{plan.cp_variant}' does not run on {backend} here (it runs: {', '.join(runs)}); "
            f"set cp_variant to '{runs[0]}' in the plan, or re-plan on this machine."
        )
    seq_len = _traced_seq_len(plan)
    if seq_len and not cp_divides(seq_len, plan.cp):
        raise PlanError(f"plan cp={plan.cp}: {seq_len} tokens do not split into {2 * plan.cp} equal chunks.")


def _traced_seq_len(plan: Plan) -> int | None:
    """The sequence length of the plan's traced inputs: the tracer's rule (trace/build.py ``seq_len_of``)
    on their specs, the second dim of the first integer [B, S] input."""
    for spec in plan.inputs or []:
        if spec.kind == "tensor" and len(spec.shape) == 2 and spec.dtype.startswith(("int", "uint")):
            return spec.shape[1]
    return None


def build_context_parallel(*, plan: Plan, mesh: DeviceMesh, seq_len: int | None) -> ContextParallel | None:
    """The rank's :class:`ContextParallel` for ``plan`` (None at cp = 1); on NCCL, torch's CP dispatcher
    is enabled and its head-tail shard checked against autoplan's."""
    if plan.cp == 1:
        return None
    from autoplan.types.context_parallel import cp_divides, runnable_cp_variants

    if not seq_len:
        raise PlanError(
            f"plan cp={plan.cp} splits the sequence, and the model's inputs have no [batch, sequence] "
            "integer tensor to read its length from; plan cp=1."
        )
    if not cp_divides(seq_len, plan.cp):
        raise PlanError(f"plan cp={plan.cp}: {seq_len} tokens do not split into {2 * plan.cp} equal chunks.")
    # NCCL runs torch's CP; any other backend (gloo, or a test's fake group) autoplan's CPU path
    backend = "nccl" if dist.get_backend(mesh["cp"].get_group()) == "nccl" else "gloo"
    if plan.cp_variant not in runnable_cp_variants(backend):
        runs = ", ".join(runnable_cp_variants(backend)) or "none"
        raise PlanError(f"plan cp_variant='{plan.cp_variant}' does not run on {backend} (it runs: {runs}).")
    cp = ContextParallel(
        cp_mesh=mesh["cp"],
        seq_len=seq_len,
        micro_batch_size=plan.micro_batch_size,
        variant=plan.cp_variant,
        backend=backend,
        kv_group=kv_group(plan) if backend == "gloo" else mesh["cp"].get_group(),  # torch's CP uses the mesh's
    )
    if backend == "nccl":
        enable_torch_cp(cp)
    return cp


def kv_group(plan: Plan) -> dist.ProcessGroup:
    """This rank's cp group, made apart from the mesh's so that the audit tells the KV exchange from
    a gradient sync over the same ranks (dp = 1). A collective: every rank makes every cp group."""
    from autoplan.types.layout import plan_groups

    groups = plan_groups(pp=plan.pp, dp=plan.dp, tp=plan.tp, cp=plan.cp)["cp"]
    mine, _ = dist.new_subgroups_by_enumeration(groups)
    return mine


def enable_torch_cp(cp: ContextParallel) -> None:
    """torch's CP dispatcher on, with its rotate method for the variant and its head-tail balancer
    (the private API torchtitan calls); refused unless torch's shard of the positions is autoplan's."""
    from torch.distributed.tensor.experimental import _attention

    _attention.set_rotate_method(TORCH_ROTATE_METHOD[cp.variant])
    _attention._enable_context_parallel_dispatcher()
    positions = torch.arange(cp.seq_len, device=cp_device(cp))
    balancer = _attention._HeadTailLoadBalancer(cp.seq_len, cp.cp, positions.device)
    (theirs,) = _attention._context_parallel_shard(cp.cp_mesh, [positions], [0], load_balancer=balancer)
    if not torch.equal(theirs.cpu(), cp.positions()):
        raise RunError(
            f"torch's head-tail shard of {cp.seq_len} positions on cp rank {cp.rank} is {theirs.tolist()[:8]}..., "
            "not chunks r and 2cp-1-r; this torch version balances differently from autoplan's plan."
        )


def cp_device(cp: ContextParallel) -> torch.device:
    return torch.device(cp.cp_mesh.device_type, torch.cuda.current_device()) if cp.backend == "nccl" else "cpu"
