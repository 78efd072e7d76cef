"""Context parallelism's time: attention's work per cp rank, and the K,V traffic left exposed after the
attention computing beside it (docs/cost-model.md, "Context parallelism", has the derivations).

**Work per rank.** The traced attention FLOPs F are the whole S x S rectangle (no causal discount,
autoplan/trace/flops.py, at every degree). The busiest rank's share of the causal work, n = cp:
1/n unmasked or with head-tail balancing (rank r holds chunks r and 2n-1-r of 2n, each chunk j doing
c^2 (j + 1/2)); (2n-1)/n^2 with contiguous chunks (Brandon et al. 2023, "Striped Attention"; Megatron-Core's
context-parallel guide; torch's ``_HeadTailLoadBalancer``). Priced: F/n x share n.

**Executed FLOPs** (what the audit measures), causal, c = S/2n: the all-gather path runs its two query
chunks j against keys 0..(j+1)c, (2n+1) c^2 of the 4n^2 c^2 rectangle; torch's ring the local 2c x 2c
block and n-1 blocks of 2c^2: (2n+2)/(4n^2); Ulysses a causal kernel over S with H/n heads, 1/n.
Unmasked: 1/n.

**Exposed time.** A message of time t beside attention compute A (its ``overlap`` share of the pass's
attention time) shows, with the profile's overlap efficiency eta (docs/cost-model.md, "Step time"):

    exposed = count * (t - eta * min(t, overlap * A_pass))

so a ring step shows only the transfer left after the shard's attention block (Liu et al. 2023, Ring
Attention, section 3: overlap is complete when a block's compute outlasts its K,V transfer).
"""

from __future__ import annotations

from autoplan.cost.cp.messages import FORWARD, CpMessage
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.types.profile import Profile


def busiest_share(cp: int, *, causal: bool, balanced: bool = True) -> float:
    """The busiest cp rank's share of one attention call's work (module docstring)."""
    if cp == 1 or not causal or balanced:
        return 1.0 / cp
    return (2 * cp - 1) / cp**2


def attention_time_factor(cp: int, *, causal: bool, balanced: bool = True) -> float:
    """The busiest rank's attention time over 1/cp of the whole: 1 when every rank does the same work."""
    if cp == 1 or not causal or balanced:
        return 1.0
    return busiest_share(cp, causal=causal, balanced=balanced) * cp


def executed_fraction(cp: int, *, causal: bool, variant: str) -> float:
    """The share of the traced attention FLOPs a cp rank's kernels execute (module docstring)."""
    if cp == 1 or not causal or variant == "ulysses":
        return 1.0 / cp
    return (2 * cp + (1 if variant == "allgather" else 2)) / (4 * cp**2)


def exposed_s(
    messages: tuple[CpMessage, ...],
    *,
    profile: Profile,
    group: AxisGroup,
    attention_fwd_s: float,
    attention_bwd_s: float,
    efficiency: float | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of ``messages`` left exposed beside the attention's forward and
    backward compute on this rank (module docstring); ``efficiency`` overrides the profile's eta."""
    eta = profile.comm_overlap.efficiency if efficiency is None else efficiency
    totals = {FORWARD: 0.0, "backward": 0.0}
    for message in messages:
        t = collective_time_s(profile, message.kind, message.message_bytes, group=group)
        beside = message.overlap * (attention_fwd_s if message.phase == FORWARD else attention_bwd_s)
        totals[message.phase] += message.count * (t - eta * min(t, beside))
    return totals[FORWARD], totals["backward"]
