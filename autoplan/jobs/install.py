"""How a cloud node installs the autoplan that wrote its job: this checkout, never a name on an index.

The distribution is ``torch-autoplan`` (the name ``autoplan`` on PyPI belongs to an unrelated
project) and it is not published, so ``pip install autoplan==VERSION`` on a node installs the wrong
thing. A node installs the source tree this process runs: the folder above the ``autoplan``
package, when it holds this project's ``pyproject.toml`` (an editable install, ``pip install -e .``).
SkyPilot gets it to the nodes in one of two ways (:func:`node_install`):

- the checkout lies inside the job's folder, which SkyPilot syncs (``workdir: .``): the setup
  installs it from its path there;
- else a ``file_mounts`` entry copies it to ``~/torch-autoplan`` on every node, and the setup installs
  it from there.

Either way the setup is the README's install, ``pip install -c constraints.txt -e CHECKOUT``: the
checkout with its runtime dependencies at the tested versions (torch among them). A wheel
install (no checkout) is refused in one sentence: pass ``--setup`` with the command that installs
it on the nodes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from autoplan.errors import RunError

#: The distribution name on the package index (pyproject.toml); the import name stays ``autoplan``.
DISTRIBUTION = "torch-autoplan"
#: Where a checkout outside the job's folder is copied on each node (SkyPilot ``file_mounts``).
NODE_CHECKOUT = "~/torch-autoplan"


@dataclass(frozen=True)
class NodeInstall:
    """SkyPilot's ``setup`` command and the ``file_mounts`` (node path -> local path) it needs."""

    setup: str
    file_mounts: dict[str, str] = field(default_factory=dict)


def checkout_root() -> Path | None:
    """The source tree the running ``autoplan`` package comes from, or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or not (root / "constraints.txt").is_file():
        return None
    if not re.search(rf'^name\s*=\s*"{DISTRIBUTION}"', pyproject.read_text(), flags=re.MULTILINE):
        return None
    return root


def node_install(*, checkout: Path | None, workdir: Path) -> NodeInstall:
    """How each node installs ``checkout`` (module docstring); ``workdir`` is the folder SkyPilot syncs."""
    if checkout is None:
        raise RunError(
            f"autoplan runs here from an installed package, not a checkout, and {DISTRIBUTION} is not on PyPI; "
            "pass --setup with the command that installs it on the nodes."
        )
    try:
        path = checkout.resolve().relative_to(workdir.resolve()).as_posix()
        mounts = {}
    except ValueError:
        path, mounts = NODE_CHECKOUT, {NODE_CHECKOUT: str(checkout.resolve())}
    quoted = path if path.startswith("~/") else shlex.quote(path)  # ~ must stay unquoted to expand
    return NodeInstall(setup=f"pip install -c {quoted}/constraints.txt -e {quoted}", file_mounts=mounts)
