"""The package layout keeps the pipeline's order: stages import only earlier stages, prices are
defined only under cost/, commands live only in cli/ (issue: one place for each idea)."""

from __future__ import annotations

import ast
import functools
import re
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


@functools.cache
def _parsed() -> tuple[tuple[str, Path, ast.Module], ...]:
    """(stage, path, tree) of every module, parsed once for all the checks (the trees are only read)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found.append((parts[0], path, ast.parse(path.read_text())))
    return tuple(found)


def _modules():
    yield from _parsed()


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
#: on cost/'s TP block analysis, and lives with it in cost/tp/
EXECUTE_EXCEPTIONS = {("execute/api.py", "autoplan.cost.tp.default")}


def test_the_executor_imports_only_types_trace_and_jobs():
    found = [
        (str(path.relative_to(PACKAGE)), name)
        for stage, path, tree in _modules()
        if stage == "execute"
        for name in _imported(tree)
        if name.split(".")[1] not in EXECUTE_MAY_IMPORT
    ]
    assert set(found) == EXECUTE_EXCEPTIONS, sorted(set(found) - EXECUTE_EXCEPTIONS)


#: the stages after cost/ that ask it for prices (execute/ imports none of its prices: the audit's
#: prediction is passed in; its one rule from cost/ is EXECUTE_EXCEPTIONS')
ASKS_COST = ("solve", "report", "calibrate", "export", "cli")


def _cost_imports(stages: tuple[str, ...]) -> tuple[dict[str, set[str]], set[str]]:
    """({module: the cost submodules it imports}, {every name imported from autoplan.cost}) of ``stages``."""
    deep: dict[str, set[str]] = {}
    asked: set[str] = set()
    for stage, path, tree in _modules():
        if stage not in stages:
            continue
        name = str(path.relative_to(PACKAGE))
        for node in ast.walk(tree):
            module = node.module if isinstance(node, ast.ImportFrom) and node.level == 0 else None
            imported = [module] if module else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for target in (t for t in imported if t.startswith("autoplan.cost")):
                if target != "autoplan.cost":
                    deep.setdefault(name, set()).add(target)
                if isinstance(node, ast.ImportFrom) and target == "autoplan.cost":
                    asked.update(a.name for a in node.names)
    return deep, asked


def _cost_interface() -> list[str]:
    tree = ast.parse((PACKAGE / "cost" / "api.py").read_text())
    found = [n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"]
    return ast.literal_eval(found[0])


def test_solve_asks_the_cost_model_only_through_its_interface():
    """Issue 31 item 10: solve/ (and report/, calibrate/, export/, cli/) import cost/ only as
    ``autoplan.cost`` (cost/api.py, re-exported by the package), never a submodule, so what the
    search may ask the cost model is one short list."""
    deep, _ = _cost_imports(ASKS_COST)
    assert not deep, {k: sorted(v) for k, v in deep.items()}


def test_every_name_of_the_cost_interface_is_asked_for():
    """No dead export: each name cost/api.py offers is imported by solve/ or a later stage, and each is
    listed once."""
    interface = _cost_interface()
    _, asked = _cost_imports(ASKS_COST)
    assert len(interface) == len(set(interface)) and not set(interface) - asked, sorted(set(interface) - asked)


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


#: Files longer than :data:`MAX_LINES` that still hold one idea, each with the reason written down
#: (issue 31: a file is split where its ideas part, never to get under a line count).
ONE_IDEA: dict[str, str] = {}

#: cost/'s top level: the model that composes the terms, the block and stage summaries every term
#: reads, and the audit's per-step volumes; every other module sits in the subpackage of its idea
#: (docs/architecture.md "The cost model's layout": which file to touch for each kind of change)
COST_TOP_LEVEL = {
    "bounds.py",
    "__init__.py",
    "api.py",
    "model.py",
    "blocks.py",
    "node_terms.py",  # blocks.py's idea: a block's sums node by node (blocks.py was near 400; docs/architecture.md)
    "summaries.py",  # blocks.py's idea, as CostModel keeps it: which blocks share a summary (model.py was at 400)
    "stages.py",
    "stored.py",  # the search cache beneath the pure functions of pp/ and memory/ (no idea of its own: a memo)
    "volumes.py",
    "op_table.py",
}
COST_IDEAS = {"network", "compute", "tp", "dp", "pp", "moe", "cp", "memory", "run"}


def test_the_cost_model_is_grouped_by_idea():
    """Issue 31 item 3: cost/ is grouped by idea, not 27 flat files; a new idea gets a subpackage
    (and a line in docs/architecture.md), not a module beside model.py."""
    cost = PACKAGE / "cost"
    top = {p.name for p in cost.glob("*.py")}
    ideas = {p.name for p in cost.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert top == COST_TOP_LEVEL and ideas == COST_IDEAS, (top ^ COST_TOP_LEVEL, ideas ^ COST_IDEAS)
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    picture = architecture.split("## The cost model's layout")[1].split("\n## ")[0]
    assert all(f"── {idea}/" in picture for idea in ideas), "docs/architecture.md draws every cost/ subpackage"


def _cost_bases() -> dict[str, list[str]]:
    """Class under autoplan/cost/ -> its bases that are classes defined under autoplan/cost/."""
    classes = [node for stage, _, tree in _modules() if stage == "cost" for node in ast.walk(tree)]
    classes = [node for node in classes if isinstance(node, ast.ClassDef)]
    defined = {node.name for node in classes}
    named = {node.name: [getattr(b, "id", getattr(b, "attr", None)) for b in node.bases] for node in classes}
    return {name: [b for b in bases if b in defined] for name, bases in named.items()}


def test_the_cost_models_terms_are_composed_not_mixed_in():
    """Issue 31 item 2: a term of the cost model is an object with explicit inputs, priced and tested
    alone (tests/unit/cost/test_cost_terms.py, test_dp_messages.py), never a mixin that reads another's
    private state: no class under cost/ inherits from one, and CostModel has no base class at all."""
    mixed = {name: found for name, found in _cost_bases().items() if found}
    model = ast.parse((PACKAGE / "cost" / "model.py").read_text())
    cost_model = next(n for n in ast.walk(model) if isinstance(n, ast.ClassDef) and n.name == "CostModel")
    assert not mixed and not cost_model.bases, (mixed, [ast.unparse(b) for b in cost_model.bases])


#: the one statement of what data parallelism sends (docs/cost-model.md "Who says what is sent")
MESSAGE_STATEMENT = "cost/dp/messages.py"
COLLECTIVE_KINDS = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}
DP_CHOICES = {"zero_stage", "grad_reduce_dtype", "PRECISION_BYTES", "STATE_BYTES"}


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of ``function`` outside the functions nested in it."""
    nested = {
        id(n) for f in ast.walk(function) if f is not function and isinstance(f, ast.FunctionDef) for n in ast.walk(f)
    }
    return [n for n in ast.walk(function) if id(n) not in nested]


def test_one_statement_of_what_data_parallelism_sends():
    """Issue 31 item 1: the dp/ZeRO schedule was written three times (the time terms, the audit's
    volumes, the search's bounds), each picking a collective and its bytes from the ZeRO stage and
    the reduce dtype. Now a function that names a collective kind may read neither ``zero_stage``,
    ``grad_reduce_dtype`` nor a bytes-per-dtype table unless it is in cost/dp/messages.py: everyone
    else prices or counts the statement's messages (before the change: ten functions in three files)."""
    found = []
    for _, path, tree in _modules():
        name = str(path.relative_to(PACKAGE))
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            nodes = _own_nodes(function)
            kinds = {n.value for n in nodes if isinstance(n, ast.Constant) and n.value in COLLECTIVE_KINDS}
            reads = {n.attr for n in nodes if isinstance(n, ast.Attribute)} | {
                n.id for n in nodes if isinstance(n, ast.Name)
            }
            if kinds and reads & DP_CHOICES and name != MESSAGE_STATEMENT:
                found.append(f"{name}:{function.lineno} {function.name} {sorted(kinds)} {sorted(reads & DP_CHOICES)}")
    assert not found, found


MAX_LINES = 400


def test_no_module_holds_two_ideas_by_length():
    """STYLE.md: a file over about 400 lines usually holds two ideas; one that does not is named in
    ONE_IDEA with its reason, and an entry whose file is no longer long is taken out."""
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in ONE_IDEA}
    stale = [name for name in ONE_IDEA if lengths.get(name, 0) <= MAX_LINES]
    unexplained = [name for name, why in ONE_IDEA.items() if len(why.split()) < 5]
    assert not long and not stale and not unexplained, (long, stale, unexplained)


#: Module docstrings longer than :data:`MAX_DOCSTRING_LINES`, each with its reason (issue 31 item 9:
#: a module docstring states the formulation, its symbols and its source; the discussion lives in docs/)
LONG_DOCSTRINGS: dict[str, str] = {}
MAX_DOCSTRING_LINES = 25


def _module_docstring_lines(tree: ast.Module) -> int:
    """Lines from a module docstring's opening quotes to its closing ones (0 without one)."""
    first = tree.body[0] if tree.body else None
    if not (isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str)):
        return 0
    return first.end_lineno - first.lineno + 1


def test_module_docstrings_state_the_formula_not_the_discussion():
    """A module docstring over MAX_DOCSTRING_LINES is an essay (they were 11% of the package): the
    formula, its symbols and its source stay; the why, the measurements and the history move to the
    docs page the docstring names. A longer one is listed in LONG_DOCSTRINGS with its reason, and an
    entry whose docstring is no longer long is taken out."""
    lengths = {str(path.relative_to(PACKAGE)): _module_docstring_lines(tree) for _, path, tree in _modules()}
    long = {name: n for name, n in lengths.items() if n > MAX_DOCSTRING_LINES and name not in LONG_DOCSTRINGS}
    stale = [name for name in LONG_DOCSTRINGS if lengths.get(name, 0) <= MAX_DOCSTRING_LINES]
    unexplained = [name for name, why in LONG_DOCSTRINGS.items() if len(why.split()) < 5]
    assert not long and not stale and not unexplained, (long, stale, unexplained)


def _doc_sections(page: Path) -> list[str]:
    """A docs page's headings and bold paragraph lead-ins (``**The mesh.**``): what a pointer may name."""
    text = page.read_text()
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")] + re.findall(
        r"\*\*([^*]+)\*\*", text
    )


def test_module_docstrings_point_at_sections_that_exist():
    """A docstring that moved its discussion to docs/ names the page and the section
    (``docs/cost-model.md, "Compute"``); both must exist, so a renamed heading fails here."""
    docs = PACKAGE.parent / "docs"
    sections = {page.name: _doc_sections(page) for page in docs.glob("*.md")}
    missing = []
    for _, path, tree in _modules():
        text = " ".join((ast.get_docstring(tree) or "").split())
        for page, section in re.findall(r'docs/([\w-]+\.md),? "([^"]+)"', text):
            if not any(name.startswith(section) for name in sections.get(page, [])):
                missing.append(f"{path.relative_to(PACKAGE)}: {page} {section!r}")
    assert not missing, missing


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


# ---- one home for each small rule (issue 31, items 6 and 8) -----------------------------------
#: Sites that still state a rule outside its home because another helper of issue 31 owns their file
#: this round; whoever merges both moves them onto the home named and deletes the entry.
PENDING = {}
#: ``x % pp`` that is not a chunk's stage.
NOT_PLACEMENT = {("report/timeline.py", "i % pp"): "interleaved 1F1B's micro-batch order, pp micro-batches a group"}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_pp(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "pp") or (isinstance(node, ast.Attribute) and node.attr == "pp")


def _divisibility(node: ast.AST, parent: ast.AST) -> bool:
    """``x % pp`` asked only whether it is zero: ``== 0``, ``if x % pp``, ``not x % pp``."""
    if isinstance(parent, ast.Compare):
        return any(isinstance(c, ast.Constant) and c.value == 0 for c in [parent.left, *parent.comparators])
    return isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.BoolOp)) or (
        isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)
    )


def _unexcused(stage_path: str, text: str) -> bool:
    return (stage_path, text) not in PENDING and (stage_path, text) not in NOT_PLACEMENT


def test_a_chunks_stage_is_computed_in_one_place():
    """Chunk c runs on stage c % pp: only autoplan/types/layout.py says so in code; everyone else
    calls stage_of_chunk / chunks_of_stage / chunk_index (it was written in about ten places)."""
    found = []
    for _, path, tree in _modules():
        name, source, parents = str(path.relative_to(PACKAGE)), path.read_text(), _parents(tree)
        if name == "types/layout.py":
            continue
        for node in ast.walk(tree):
            chunk_mod = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _is_pp(node.right)
            stride = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range" and len(node.args) == 3
            if (chunk_mod and not _divisibility(node, parents[node])) or (stride and _is_pp(node.args[2])):
                text = ast.get_source_segment(source, node)
                if _unexcused(name, text):
                    found.append(f"{name}:{node.lineno} {text}")
    assert not found, found


def _definitions() -> dict[str, list[str]]:
    """Function name -> the modules that define it (excused ones left out)."""
    where: dict[str, list[str]] = {}
    for _, path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _unexcused(str(path.relative_to(PACKAGE)), node.name):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    return where


def test_each_small_rule_is_defined_once():
    """The busbw factor (the profile fitter and the cost model differed at n <= 1), the threads a
    process gets (the profiler used the affinity mask, the runner the machine's cores), a module
    path's prefix test and a chunk's stage: one definition each, in a module every user may import."""
    homes = {
        "bus_factor": ["types/profile.py"],
        "threads_per_process": ["jobs/threads.py"],
        "available_cores": ["jobs/threads.py"],
        "within": ["types/graph.py"],
        "stage_of_chunk": ["types/layout.py"],
    }
    defined = _definitions()
    assert {name: defined.get(name) for name in homes} == homes
    counting = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for _, path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in ("cpu_count", "sched_getaffinity")
        and _unexcused(str(path.relative_to(PACKAGE)), node.attr)
    ]
    assert counting and all(site.startswith("jobs/threads.py:") for site in counting), counting


def test_a_module_prefix_is_tested_by_one_function():
    """``path == prefix or path.startswith(prefix + ".")`` is types/graph.within, written once."""
    inline = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for _, path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", "") == "startswith"
        and node.args
        and isinstance(node.args[0], ast.BinOp)
        and getattr(node.args[0].right, "value", None) == "."
    ]
    assert len(inline) == 1 and inline[0].startswith("types/graph.py:"), inline


def test_the_mesh_order_is_stated_once():
    """The (pp, dp, tp) mesh and its (edp, ep) unflattening are named only in types/layout.py; the
    cost model's groups and the executor's DeviceMesh both read it."""
    from autoplan.types.layout import EXPERT_AXES, MESH_AXES

    named = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for _, path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple)
        and all(isinstance(e, ast.Constant) for e in node.elts)
        and tuple(e.value for e in node.elts) in (MESH_AXES, EXPERT_AXES)
    ]
    assert named and all(site.startswith("types/layout.py:") for site in named), named
    for user in ("cost/network/mesh.py", "execute/mesh.py"):
        assert "autoplan.types.layout" in _imported(ast.parse((PACKAGE / user).read_text())), user


def test_planning_imports_no_torch():
    """docs/architecture.md: types/, cost/ and solve/ import no torch (cost/moe/experts.py once reached
    torch.distributed through trace/layers.py for a string prefix test)."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys\n"
        "for name in ('autoplan.types', 'autoplan.cost', 'autoplan.solve'):\n"
        "    package = importlib.import_module(name)\n"
        "    for module in [name, *(m.name for m in pkgutil.walk_packages(package.__path__, name + '.'))]:\n"
        "        importlib.import_module(module)\n"
        "        if 'torch' in sys.modules:\n"
        "            sys.exit(f'importing {module} imports torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_step_time_is_stated_once_and_matches_the_cost_fields():
    """docs/cost-model.md "Step time" states step_time_s as the sum of Cost.TIME_FIELDS, one
    definition line per field; cost/model.py points there instead of keeping its own copy (the two
    copies had drifted: the docstring lacked m*T_ep and both lacked the compression term)."""
    from autoplan.types.cost import Cost

    docs = (PACKAGE.parent / "docs" / "cost-model.md").read_text()
    block = docs.split("## Step time", 1)[1].split("```", 2)[1]
    formula, _, definitions = block.partition("\n\n")
    terms = [term.strip() for term in formula.split("=", 1)[1].split("+")]
    defined = [line.split("=")[0].strip() for line in definitions.strip().splitlines()]
    assert formula.strip().startswith("step_time_s =")
    assert terms == list(Cost.TIME_FIELDS) == defined, (terms, defined)
    model_doc = ast.get_docstring(ast.parse((PACKAGE / "cost" / "model.py").read_text()))
    assert "docs/cost-model.md" in model_doc and "step =" not in model_doc and "T_comp" not in model_doc
