"""The package layout keeps the pipeline's order: stages import only earlier stages, prices are
defined only under cost/, commands live only in cli/ (issue: one place for each idea)."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

PACKAGE = Path(__file__).resolve().parents[2] / "autoplan"
ORDER = (
    "errors",
    "version",
    "quiet",
    "types",
    "display",
    "jobs",
    "modelfile",
    "trace",
    "profile",
    "cost",
    "solve",
    "execute",
    "report",
    "calibrate",
    "export",
    "cli",
)
PRICES = (
    "op_time_s",
    "node_times_s",
    "node_time_s",
    "collective_time_s",
    "bucketed_time_s",
    "memory_time_s",
    "summarise",
    "exposed_tp_s",
    "model_states",
    "stage_memory",
)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield parts[0], path, ast.parse(path.read_text())


def _imported(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [n for n in names if n == "autoplan" or n.startswith("autoplan.")]


def test_every_stage_imports_only_earlier_stages():
    late = []
    for stage, path, tree in _modules():
        if stage == "__init__":
            continue
        for name in _imported(tree):
            target = name.split(".")[1] if "." in name else "__root__"
            if target == "__root__" or (target != stage and ORDER.index(target) > ORDER.index(stage)):
                late.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not late, late


def test_prices_are_defined_only_under_cost():
    where = {}
    for stage, path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in PRICES:
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert set(where) == set(PRICES)
    assert all(path.startswith("cost/") for paths in where.values() for path in paths), where


def test_commands_live_in_one_layer():
    assert not list(PACKAGE.glob("*/cli.py"))
    registered = {path.stem for path in (PACKAGE / "cli").glob("*.py") if "def register(" in path.read_text()}
    assert registered == {"trace", "profile", "solve", "execute", "report", "calibrate"}


def test_unit_test_folders_mirror_the_package():
    folders = {
        path.name for path in Path(__file__).parent.iterdir() if path.is_dir() and not path.name.startswith((".", "_"))
    }
    assert folders and folders <= {
        path.name for path in PACKAGE.iterdir() if path.is_dir() and not path.name.startswith("_")
    }


def test_the_appliers_never_import_the_job_that_runs_them():
    appliers = [path for path in (PACKAGE / "execute").glob("*.py")]
    found = [
        f"{path.name} imports {name}"
        for path in appliers
        for name in _imported(ast.parse(path.read_text()))
        if name.startswith("autoplan.execute.job")
    ]
    assert appliers and not found, found


def test_no_module_holds_two_ideas_by_length():
    """STYLE.md: a file over about 400 lines usually holds two ideas."""
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in lengths.items() if n > 400}
    assert not long, long


def test_one_port_picker():
    defined = [
        str(path.relative_to(PACKAGE))
        for _, path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and "port" in node.name and "free" in node.name
    ]
    assert defined == ["jobs/launcher.py"]


def _file_format_code(node: ast.AST) -> str | None:
    """What ``node`` is, when it is a run folder class, a profile name resolver or a CSV reader or writer."""
    if isinstance(node, ast.ClassDef) and node.name.endswith("RunFolder"):
        return f"class {node.name}"
    if isinstance(node, ast.FunctionDef) and (
        ("resolve" in node.name and "profile" in node.name) or node.name == "profile_file"
    ):
        return f"def {node.name}"
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("csv", "pd"):
        return f"{node.value.id}.{node.attr}" if node.attr in ("read_csv", "reader", "DictReader", "writer") else None
    return None


def test_each_file_format_has_one_reader_and_writer():
    """Issue 31: the run folder is one class, read and written in types/run_folder.py (execute writes it,
    report and calibrate read it); a profile name is resolved in profile/io.py only; the per-op and
    per-stage CSVs' columns are their row types' fields in types/tables.py, which holds the one CSV reader
    and writer (the report's own tables are DataFrames it writes with ``to_csv``)."""
    where: dict[str, set[str]] = {}
    for _, path, tree in _modules():
        for node in ast.walk(tree):
            if (what := _file_format_code(node)) is not None:
                where.setdefault(what, set()).add(str(path.relative_to(PACKAGE)))
    assert where == {
        "class RunFolder": {"types/run_folder.py"},
        "def resolve_profile_path": {"profile/io.py"},
        "def profile_file": {"profile/io.py"},
        "pd.read_csv": {"types/tables.py"},
        "csv.writer": {"types/tables.py"},
    }, where


def test_no_file_is_exempt_from_the_line_limit():
    """Every file keeps ruff's line limit and formatting (CI runs ``ruff check`` and ``ruff format
    --check``): no per-file exemption from E501, the long-line rule."""
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["ruff"]
    exempt = [name for name, rules in config["lint"].get("per-file-ignores", {}).items() if "E501" in rules]
    assert config["line-length"] == 120 and "E501" not in config["lint"].get("ignore", []) and not exempt, exempt


def test_the_version_is_the_projects():
    from autoplan.version import __version__

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]
