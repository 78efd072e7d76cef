"""The README's first command is a user's install: the package and its runtime dependencies, no
test extras (DeepSpeed, Megatron-Core, torchtitan, TorchX, a Kubernetes client: minutes more); its
second installs the test extras and runs the tests, and CI (.ci/run) runs exactly those installs
and that test command. Every install names the distribution through this checkout, never
``autoplan`` on an index (an unrelated project on PyPI)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[list[str]]:
    """The README's first bash block: one list of ``&&``-joined commands per line."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL).group(1)
    return [[part.strip() for part in line.split("&&")] for line in block.strip().splitlines()]


def _installs(commands: list[str]) -> list[list[str]]:
    return [shlex.split(command) for command in commands if command.startswith("pip install")]


def test_the_first_command_installs_the_package_without_the_test_extras():
    first, second = _readme_commands()
    targets = [words[-1] for words in _installs(first)]
    assert targets == ["torch==2.13.0", "."], targets  # the checkout, with no [extras]
    assert first[-1].startswith("autoplan plan ")
    assert [words[-1] for words in _installs(second)] == [".[test]"]
    assert second[-1] == "python -m pytest -q -n auto --dist loadgroup tests"


def test_ci_runs_the_readmes_installs_and_test_command():
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    first, second = _readme_commands()
    readme = [f"python3 -m {command}" for command in first[:-1] + second[:-1]] + [second[-1]]
    ci_steps = [line.replace(" -q -c", " -c") for line in ci if "pip install" in line or "pytest" in line]
    assert ci_steps == readme


def test_no_install_names_autoplan_on_an_index():
    texts = [(ROOT / name).read_text() for name in ("README.md", ".ci/run", "docs/launch.md", "docs/cli.md")]
    texts += [path.read_text() for path in (ROOT / "examples").glob("*.py")]
    assert not [t for t in texts if re.search(r"pip install[^\n`&;]*(?<![\w~/-])autoplan(==|\[|\s|$)", t)]
