"""Sites: the topology level above the node (docs/profile-format.md, "Sites"). A profile's optional
``sites`` section says that every ``nodes_per_site`` consecutive nodes form one site (a region, a data
centre), and that sites are joined by ``link``, a wide-area link with its own collective fits:

    site(rank) = rank // (devices_per_node * nodes_per_site)

``link.collectives.<kind>.busbw_bytes_per_s`` is the bandwidth one site has to the others, shared by every
rank of the site that sends over it (as the inter-node link's is per node); ``alpha_s`` is the per-call
latency across the link. A group whose ranks sit on more than one site is priced by the slowest level it
crosses (autoplan/cost/network/comm.py). A profile without the section is one site, priced as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.errors import ProfileError
from autoplan.types._check import require


@dataclass
class SiteSpec:
    nodes_per_site: int
    link: Any  # LinkSpec (types/profile.py); Profile.from_dict builds it from its mapping
    source: str = ""  # where the site layout comes from; each collective fit carries its own

    def check(self) -> None:
        require(
            isinstance(self.nodes_per_site, int)
            and not isinstance(self.nodes_per_site, bool)
            and self.nodes_per_site >= 1,
            ProfileError,
            f"profile field 'sites.nodes_per_site' is {self.nodes_per_site!r}; expected an integer >= 1.",
        )
        require(
            hasattr(self.link, "check"),
            ProfileError,
            f"profile field 'sites.link' is {self.link!r:.60}; expected a link with 'name' and 'collectives'.",
        )
        self.link.check("sites.link")


def devices_per_site(profile: Any) -> int:
    """Devices of one site, or 0 where the profile has no sites (one site: no group crosses a site)."""
    sites = getattr(profile, "sites", None)
    return profile.devices_per_node * sites.nodes_per_site if sites is not None else 0
