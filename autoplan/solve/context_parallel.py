"""Where the search may split every sequence over ``cp`` ranks, and by which variant (docs/ilp.md, section 4).

- cp > 1 only for a model :func:`autoplan.types.context_parallel.cp_refusal` accepts (SDPA over the
  whole sequence, causal, unmasked or masked by a mask made before the blocks), and only where ``2 cp``
  divides the sequence
  (:func:`~autoplan.types.context_parallel.cp_divides`: head-tail load balancing gives each rank
  chunks r and 2cp-1-r of 2cp, Megatron-Core's and torch's context_parallel's layout);
- cp composes with tp, pp and dp/ZeRO; not with ep (Plan refuses cp > 1 with ep > 1); nor with pp where
  attention takes an explicit mask: a pipeline stage is exported with its blocks' inputs sharded, and the
  export's attention cannot meet a whole-sequence mask with a shard's queries;
- the variant is one the executor runs on the profile's backend (``runnable_cp_variants``), and for a model
  whose attention takes an explicit mask one that runs masks (``MASKED_CP_VARIANTS``: not ring); the cost
  model prices every variant, so a plan read from another trainer may use any.

- a (dp, cp, mbs) with g = gcd(cp, mbs) > 1 is not searched unless dp, cp or mbs is pinned
  (:func:`folds_into_dp`): (dp g, cp / g, mbs / g) runs the same tokens per rank through the same ops
  and syncs gradients over the same dp x cp ranks, while its smaller cp group moves less K,V
  (allgather gathers mbs/g sequences, not mbs; ring takes cp/g - 1 steps of the same chunk), so
  the plan with the larger cp can only tie or lose.

A pin the model, the sequence or the backend refuses is one sentence (:func:`check_cp_pins`).
"""

from __future__ import annotations

import math

from autoplan.errors import PlanError
from autoplan.types.context_parallel import (
    MASKED_CP_VARIANTS,
    cp_divides,
    cp_refusal,
    masked_attention,
    runnable_cp_variants,
)
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile


def cp_sequence(graph: Graph, profile: Profile, fixes: dict) -> int:
    """The sequence length cp may split, or 0 where the search keeps cp = 1: the model refuses
    cp (types/context_parallel.py), the executor runs no variant on the profile's backend, or
    ``--fix cp=1`` / an ``ep`` pin above 1 rules it out."""
    ruled_out = fixes.get("cp", 0) == 1 or fixes.get("ep", 1) > 1 or not runnable_cp_variants(profile.backend)
    if ruled_out or cp_refusal(graph) is not None:
        return 0
    return graph.seq_len


def cp_allows(cp: int, *, seq_len: int) -> bool:
    """Whether the search may take this cp for a model whose cp sequence (:func:`cp_sequence`) is ``seq_len``."""
    return cp == 1 or (seq_len > 0 and cp_divides(seq_len, cp))


def folds_into_dp(*, cp: int, mbs: int, fixes: dict) -> bool:
    """Whether (dp, cp, mbs) is (dp g, cp / g, mbs / g) with more K,V to move, g = gcd(cp, mbs) > 1
    (module docstring), and no pin of dp, cp or mbs rules that plan out."""
    return math.gcd(cp, mbs) > 1 and not {"dp", "cp", "mbs"} & set(fixes)


def variant_options(profile: Profile, *, cp: int, fixes: dict, masked: bool = False) -> list[str]:
    """The cp variants searched at this cp: those the executor runs on the profile's backend (for a model
    whose attention takes masks, ``masked``, those that run them), or the pinned one; at cp = 1 the plan's
    default, which nothing reads."""
    if cp == 1:
        return ["allgather"]
    runnable = list(runnable_cp_variants(profile.backend, masked=masked))
    return [fixes["cp_variant"]] if "cp_variant" in fixes else runnable


def check_cp_pins(graph: Graph, profile: Profile, fixes: dict) -> None:
    """A ``cp`` or ``cp_variant`` pin the model, its sequence, the ep pin or the backend refuses: one sentence."""
    cp = fixes.get("cp", 1)
    if cp > 1:
        if (refusal := cp_refusal(graph)) is not None:
            raise PlanError(f"--fix cp={cp}: {refusal}")
        if not cp_divides(graph.seq_len, cp):
            raise PlanError(
                f"--fix cp={cp} splits each sequence of {graph.seq_len} tokens into 2*cp = {2 * cp} equal chunks "
                f"(head-tail load balancing, so causal attention costs every cp rank the same), and {2 * cp} does "
                f"not divide {graph.seq_len}; pin a cp whose double divides the sequence length."
            )
        if fixes.get("pp", 1) > 1 and masked_attention(graph):
            raise PlanError(
                f"--fix cp={cp} with pp={fixes['pp']}: this model's attention takes an explicit mask, which "
                "context parallelism applies only outside a pipeline (an exported stage's attention cannot meet "
                "the whole sequence's mask with a shard's queries); pin one of them to 1."
            )
        if fixes.get("ep", 1) > 1:
            raise PlanError(
                f"--fix cp={cp} with ep={fixes['ep']}: context parallelism does not compose with expert "
                "parallelism yet; pin one of them to 1."
            )
    variant = fixes.get("cp_variant")
    if variant is not None and variant not in runnable_cp_variants(profile.backend):
        runnable = ", ".join(runnable_cp_variants(profile.backend)) or "none"
        raise PlanError(
            f"--fix cp_variant={variant}: autoplan's executor does not run it on profile '{profile.name}' "
            f"({profile.backend}), which runs {runnable}; pin one of those."
        )
    if variant is not None and variant not in MASKED_CP_VARIANTS and masked_attention(graph):
        runs = ", ".join(runnable_cp_variants(profile.backend, masked=True)) or "none"
        raise PlanError(
            f"--fix cp_variant={variant}: this model's attention takes an explicit mask, which {variant} attention "
            f"cannot apply; pin one that does ({runs})."
        )
