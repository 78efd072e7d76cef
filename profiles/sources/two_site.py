"""Build profiles/two-site-h100.yaml: DGX H100 nodes in two regions joined by a wide-area link.

Run:  python profiles/sources/two_site.py   (rewrites the file)

Everything inside a site is profiles/dgx-h100.yaml's (device, NVSwitch, InfiniBand between nodes,
storage, reliability). The ``sites`` section (autoplan/types/sites.py, docs/profile-format.md "Sites") adds:

* ``nodes_per_site`` = 4: 32 GPUs per region, so ``--devices 64`` is the two sites (an example layout:
  set your own site size; nothing below depends on it);
* bandwidth: one dedicated 100 Gb/s inter-region connection per site (AWS Direct Connect's dedicated
  port speeds are 1, 10, 100 and 400 Gb/s: aws.amazon.com/directconnect/pricing, "Dedicated connection
  100 Gbps port hours") x 0.96, the achieved fraction autoplan takes for a NIC without a published sweep
  (NVIDIA/nccl #812; profiles/sources/instances.py) = 12 GB/s for the whole site;
* latency: 72 ms round trip, the largest monthly-average round trip between Azure's North America
  regions (docs.microsoft.com/azure/networking/azure-network-latency, October 2019: "5 ms to 72 ms for
  round trips within North America regions"), a coast-to-coast pair. An all-reduce across the link
  reduces one way and broadcasts back (one round trip, alpha = 72 ms); the other collectives and a
  send cross it once (alpha = 36 ms).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoplan.profile import load_profile  # noqa: E402
from autoplan.profile.io import save_profile  # noqa: E402
from autoplan.types.profile import COLLECTIVES, CollectiveFit, LinkSpec  # noqa: E402
from autoplan.types.sites import SiteSpec  # noqa: E402

NODES_PER_SITE = 4
LINE_RATE_BITS_PER_S = 100e9
ACHIEVED = 0.96
ROUND_TRIP_S = 0.072
BANDWIDTH_SOURCE = (
    "one dedicated 100 Gb/s inter-region connection per site (AWS Direct Connect dedicated port, "
    "aws.amazon.com/directconnect/pricing) x 0.96 (NVIDIA/nccl #812, autoplan's factor without a sweep)"
)
LATENCY_SOURCE = (
    "72 ms round trip: the largest monthly average between Azure North America regions "
    "(docs.microsoft.com/azure/networking/azure-network-latency, October 2019)"
)


def wan_fit(kind: str) -> CollectiveFit:
    """The wide-area link's fit for ``kind``: one round trip for an all-reduce, one way otherwise."""
    alpha_s = ROUND_TRIP_S if kind == "all_reduce" else ROUND_TRIP_S / 2
    way = "one round trip" if kind == "all_reduce" else "one way, half of it"
    return CollectiveFit(
        alpha_s=alpha_s,
        busbw_bytes_per_s=LINE_RATE_BITS_PER_S / 8 * ACHIEVED,
        source=f"{BANDWIDTH_SOURCE}; alpha {way}: {LATENCY_SOURCE}",
    )


def build() -> None:
    base = load_profile("dgx-h100")
    profile = copy.deepcopy(base)
    profile.name = "two-site-h100"
    profile.description = (
        f"DGX H100 nodes in two regions, {NODES_PER_SITE} nodes per site, joined by a 100 Gb/s wide-area link "
        "with a 72 ms round trip (profiles/sources/two_site.py)"
    )
    link = LinkSpec(name="wide-area link between regions, per site", collectives={k: wan_fit(k) for k in COLLECTIVES})
    profile.sites = SiteSpec(nodes_per_site=NODES_PER_SITE, link=link, source="an example layout: set your site size")
    out = Path(__file__).resolve().parents[1] / "two-site-h100.yaml"
    save_profile(profile, out)
    print(f"wrote {out}: {NODES_PER_SITE} nodes per site, {wan_fit('all_reduce').busbw_bytes_per_s / 1e9:.0f} GB/s")


if __name__ == "__main__":
    build()
