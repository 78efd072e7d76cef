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


#: what the executor may import: the data types, the trace, the job layer, the model-file loader
#: (the stage before trace) and the shared errors/quiet/version/display; the planner's answers
#: (the audit's prediction, --elastic's re-plan) are computed or passed in by cli/ (issue 31, item 7)
EXECUTE_MAY_IMPORT = {"execute", "types", "trace", "jobs", "modelfile", "errors", "quiet", "version", "display"}
#: the one exception, with its reason: what an empty tp_plan at tp > 1 means (Megatron's split where
#: legal) is one rule of the cost model's, which parallelize() applies to a plan made by hand; it rests
#: on cost/'s TP block analysis, and moves with it when cost/ is grouped by idea (issue 31, item 3)
EXECUTE_EXCEPTIONS = {("execute/api.py", "autoplan.cost.tp_default")}


def test_the_executor_imports_only_types_trace_and_jobs():
    found = [
        (str(path.relative_to(PACKAGE)), name)
        for stage, path, tree in _modules()
        if stage == "execute"
        for name in _imported(tree)
        if name.split(".")[1] not in EXECUTE_MAY_IMPORT
    ]
    assert set(found) == EXECUTE_EXCEPTIONS, sorted(set(found) - EXECUTE_EXCEPTIONS)


def test_run_options_are_declared_once():
    """RunOptions (types/run_options.py) is the one declaration of ``autoplan run``'s options: no
    other module adds a run flag, parses a rank's argv, or restates a default such as the 45 s timeout."""
    flags = ("--timeout-s", "--checkpoint-every", "--async-checkpoint", "--max-restarts")
    restated, timeouts = [], []
    for _, path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value == 45.0:
                timeouts.append(str(path.relative_to(PACKAGE)))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value in flags:
                    restated.append(f"{path.relative_to(PACKAGE)}: {first.value}")
    assert not restated and timeouts == ["types/run_options.py"], (restated, timeouts)


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
