"""CLI start-up: building the parser imports no heavy library, frozen_imports leaves the
garbage collector as it found it, and a trace imports torch._dynamo only when it needs it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.cli.startup import frozen_imports

HEAVY = ("torch", "scipy", "pandas", "matplotlib", "rich", "pulp", "networkx", "torch.distributed", "numpy", "yaml")
#: the planner and the cost model: `autoplan plan` imports them in its handler, with the GC paused (cli/solve.py)
PLANNER = ("autoplan.solve.space", "autoplan.solve.api", "autoplan.cost")


@pytest.mark.parametrize("command", [None, "plan"])
def test_parser_builds_without_heavy_imports(command):
    """`autoplan --help` and the plan command's parser import no heavy library and not the planner: the choices
    they offer (--objective, --fix, --runtime) come from autoplan/types and solve/pins.py."""
    code = (
        f"import sys, autoplan.cli as cli; cli.build_parser({command!r}); "
        f"print(','.join(m for m in {HEAVY + PLANNER!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_the_planner_imports_no_pulp():
    """`autoplan plan` imports the planner up front (cli/solve.py, PLAN_IMPORTS); PuLP comes only where one of
    its solvers runs (solve/backend.py), not with the modules (~20 ms of a plan's start-up)."""
    from autoplan.cli.solve import PLAN_IMPORTS

    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {PLAN_IMPORTS!r}]; print('pulp' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def _commands(parser) -> set[str]:
    return set(parser._subparsers._group_actions[0].choices)


def test_every_command_still_registered():
    from autoplan.cli import build_parser

    assert {"trace", "profile", "plan", "run", "report", "explain", "calibrate"} <= _commands(build_parser())


def test_a_command_line_imports_only_its_commands_module():
    """cli/__init__.py, COMMAND_MODULES: what each module registers is what the table says, the table names
    every command, and a command line naming one imports no other command module (unknown: all of them)."""
    from autoplan.cli import COMMAND_MODULES, build_parser

    listed = {command for commands in COMMAND_MODULES.values() for command in commands}
    assert listed == _commands(build_parser())
    for commands in COMMAND_MODULES.values():
        for command in commands:
            assert _commands(build_parser(command)) == set(commands)
    assert _commands(build_parser("no-such-command")) == listed
    code = "import sys, autoplan.cli as cli; cli.build_parser(cli.command_named(['--json', 'plan'])); "
    code += "print(sorted(m for m in sys.modules if m.startswith('autoplan.cli.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "'autoplan.cli.solve'" in loaded and "autoplan.cli.execute" not in loaded and "cli.report" not in loaded


@pytest.mark.parametrize("enabled", [True, False])
def test_frozen_imports_restores_the_collector(enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        frozen_before = gc.get_freeze_count()
        with frozen_imports("json", "csv"):
            assert gc.get_freeze_count() > frozen_before  # the heap is frozen inside
            assert gc.isenabled() == enabled
            assert "csv" in sys.modules
        assert gc.get_freeze_count() == 0 and gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_frozen_imports_unfreezes_on_error():
    with pytest.raises(ModuleNotFoundError):
        with frozen_imports("autoplan_no_such_module"):
            pass
    assert gc.get_freeze_count() == 0 and gc.isenabled()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--json", "explain", "out"], True), (["explain", "out", "--json"], True), (["explain", "out"], False)],
)
def test_the_common_flags_hold_before_or_after_the_command(argv, expected):
    import autoplan.cli as cli

    args = cli.build_parser().parse_args(argv)
    assert args.json is expected and args.quiet is False and args.debug is False


#: what a rank imports and ``autoplan run``'s launcher need not: it waits on its ranks, so each second it
#: spends importing before it starts them is a second added to every run (autoplan/execute/job/contract.py)
RANK_ONLY = ("torch.distributed.tensor", "torch.distributed.fsdp", "torch._dynamo", "torch.distributed.checkpoint")
LAUNCH_PROBE = """
import sys
import autoplan.jobs.launcher as launcher
launcher.launch = lambda **kw: print([m for m in RANK_ONLY if m in sys.modules]) or 3  # 3: --verify failed
from autoplan.cli import main
sys.exit(main(sys.argv[1:]))
"""
TINY_MODEL = """
import torch
def build_model():
    return torch.nn.Linear(8, 8)
def example_inputs(batch_size):
    return (torch.randn(batch_size, 8),)
"""


def test_run_starts_its_ranks_before_importing_what_only_a_rank_needs(tmp_path):
    """``autoplan run --verify``'s checks (the plan, the model file, --verify's steps, the device rules) run
    in the launcher without DTensor, FSDP2, dynamo or the checkpoint reader: the launcher is replaced by
    one that prints what is imported when the ranks would start."""
    from autoplan.types.plan import Plan

    (tmp_path / "model.py").write_text(TINY_MODEL)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1).save(tmp_path / "plan.json")
    argv = ["run", str(tmp_path / "model.py"), "--plan", str(plan), "--steps", "2", "--verify"]
    argv += ["--out", str(tmp_path / "r")]
    probe = f"RANK_ONLY = {RANK_ONLY!r}\n{LAUNCH_PROBE}"
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "--verify found differences" in done.stderr, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SMALL_GPT = {"AUTOPLAN_GPT_N_LAYER": "2", "AUTOPLAN_GPT_N_EMBD": "32", "AUTOPLAN_GPT_VOCAB_SIZE": "128"}
#: what a trace imports beyond torch itself (cli/trace.py, TRACE_IMPORTS, and trace/dtensor_reach.py's registry)
TRACE_HEAVY = ("sympy", "torch.fx.experimental.symbolic_shapes", "torch.distributed.tensor", "numpy")
#: what a plan whose model torch.fx captures never needs: pydoc names the classes only in torch.export's graphs;
#: PuLP, whose solvers run only for CBC, without highspy, and in the partition ILP (solve/backend.py)
NOT_NEEDED = ("pydoc", "pulp")
#: commands run one after another in this process (argv lists, JSON in sys.argv[1]); after each, one JSON line:
#: its exit code, what torch._dynamo is ('module': the real one, not the stand-in), and, for each watched module
#: imported so far, whether the cyclic GC was on as it was first imported
COMMANDS_PROBE = """
import gc
import json
import sys

WATCHED = {watched!r}
seen = {{}}


class Watch:
    def find_spec(self, name, path, target=None):
        if name in WATCHED:
            seen.setdefault(name, gc.isenabled())


sys.meta_path.insert(0, Watch())
{first}
from autoplan.cli import main

for argv in json.loads(sys.argv[1]):
    code = main(argv)
    dynamo = sys.modules.get("torch._dynamo")
    dynamo = "absent" if dynamo is None else type(dynamo).__name__
    gc_on = sorted(name for name, on in seen.items() if on)
    print(json.dumps({{"code": code, "dynamo": dynamo, "gc_on": gc_on, "imported": sorted(seen)}}), flush=True)
"""


def _commands_in_one_process(commands: list[list[str]], *, first: str = "") -> list[dict]:
    """Run the commands, in this order, in one fresh process with the trace cache off; what each left."""
    env = {**os.environ, "AUTOPLAN_TRACE_CACHE": "off", **SMALL_GPT}
    probe = COMMANDS_PROBE.format(watched=TRACE_HEAVY + NOT_NEEDED, first=first)
    argv = [sys.executable, "-c", probe, json.dumps(commands)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"code"')]
    assert [run["code"] for run in seen] == [0] * len(commands), done.stderr[-2000:]
    return seen


@pytest.fixture(scope="module")
def traced_runs(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """Four traces in three fresh processes (each costs a fresh interpreter's torch import, ~3 s of CPU), read by
    the three tests below. The 4-layer GPT's plan and examples/moe.py's trace each start a bare process: each is
    the first trace of its process, as a command line's is (a plan traced after another in one process was seen
    to import torch._dynamo). The third process imports torch._dynamo first, then plans the GPT and
    traces moe.py again (the stand-in stays out where torch._dynamo is imported): the references the first two's
    graphs must match."""
    tmp = tmp_path_factory.mktemp("traced")
    gpt = ["plan", str(EXAMPLES / "gpt.py"), "--devices", "8", "--profile", "dgx-a100", "--batch", "16", "--quiet"]
    moe = ["trace", str(EXAMPLES / "moe.py"), "--batch", "8", "--quiet"]
    runs = _commands_in_one_process([[*gpt, "--out", str(tmp / "without")]])
    runs += _commands_in_one_process([[*moe, "--out", str(tmp / "late")]])
    early = [[*gpt, "--out", str(tmp / "with")], [*moe, "--out", str(tmp / "early")]]
    runs += _commands_in_one_process(early, first="import torch._dynamo")
    return tmp, dict(zip(("without", "late", "with", "early"), runs))


def test_a_plan_that_traces_imports_no_torch_dynamo_and_traces_the_same_graph(traced_runs):
    """cli/dynamo_stand_in.py: the 4-layer GPT's trace needs none of torch._dynamo, so `autoplan plan` leaves
    it out, and graph.json is the one traced with it imported."""
    tmp, runs = traced_runs
    assert runs["without"]["dynamo"] == "absent"
    assert runs["with"]["dynamo"] == "module"
    assert (tmp / "without" / "graph.json").read_bytes() == (tmp / "with" / "graph.json").read_bytes()


def test_a_trace_that_needs_torch_dynamo_imports_the_real_one_and_traces_the_same_graph(traced_runs):
    """examples/moe.py traces through torch.export, which needs torch._dynamo: the stand-in imports it in
    its place, and graph.json is the one traced with it imported from the start."""
    tmp, runs = traced_runs
    assert runs["late"]["dynamo"] == "module"
    assert runs["early"]["dynamo"] == "module"
    assert (tmp / "late" / "graph.json").read_bytes() == (tmp / "early" / "graph.json").read_bytes()


def test_a_traced_plan_imports_what_its_trace_needs_with_the_collector_paused(traced_runs):
    """cli/trace.py, prepare: sympy (loaded by fake tensors' first op) and DTensor's op registry (the tensor-parallel
    verdict, trace/dtensor_reach.py) are imported with torch, the GC paused, not mid-trace; the planner's libraries
    with the planner (cli/solve.py, PLAN_IMPORTS), not by the parser; pydoc not at all (trace/propagate.py). Read
    from the GPT's plan in a bare process (traced_runs): any model torch.fx captures needs the same imports."""
    _, runs = traced_runs
    plan = runs["without"]
    assert {"gc_on": plan["gc_on"], "imported": plan["imported"]} == {"gc_on": [], "imported": sorted(TRACE_HEAVY)}


MARKED_MODEL = """
import atexit
import pathlib

import torch


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))


def example_inputs(batch_size):
    return (torch.randn(batch_size, 8),)


atexit.register(lambda: pathlib.Path(__file__).with_name("marks.txt").write_text("exit handler ran"))
"""
#: ``autoplan`` run as a program (main() reads sys.argv), telling how it leaves
EXIT_PROBE = """
import os
import sys

leave = os._exit
os._exit = lambda code: (print(f"os._exit({code})", flush=True), leave(code))
sys.argv = ["autoplan", *sys.argv[1:]]
from autoplan.cli import main

sys.exit(main())
"""


def _program(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOPLAN_TRACE_CACHE": "off", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, *argv], capture_output=True, text=True, env=env, timeout=300
    )


def test_plan_runs_the_exit_handlers_and_leaves_without_the_teardown(tmp_path):
    """cli/startup.py, exit_now: `autoplan plan` run as a program prints its whole table to a pipe and runs
    the exit handlers (here a model file's own), then leaves with os._exit, skipping the interpreter's teardown."""
    (tmp_path / "model.py").write_text(MARKED_MODEL)
    argv = ["plan", str(tmp_path / "model.py"), "--devices", "2", "--profile", "dgx-a100", "--batch", "8"]
    done = _program([*argv, "--out", str(tmp_path / "out")])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "best: " in done.stdout and done.stdout.rstrip().endswith("os._exit(0)")
    assert (tmp_path / "marks.txt").read_text() == "exit handler ran"
    assert (tmp_path / "out" / "plan.json").is_file()


def test_plan_leaves_fast_with_its_exit_code_on_bad_input(tmp_path):
    argv = ["plan", str(tmp_path / "none.py"), "--devices", "2", "--profile", "dgx-a100", "--batch", "8"]
    done = _program([*argv, "--out", str(tmp_path / "out")])
    assert done.returncode == 2 and done.stderr.startswith("autoplan: error: "), done.stderr[-2000:]
    assert done.stdout.strip() == "os._exit(2)"


#: a trace run as `autoplan plan` runs it (cli/trace.py, model_graph): whether the Graph is left to the collector
FREEZE_PROBE = """
import gc
import sys

from autoplan.cli import build_parser
from autoplan.cli.trace import model_graph

graph = model_graph(build_parser().parse_args(sys.argv[1:]))
print("collected" if any(o is graph for o in gc.get_objects()) else "frozen", gc.isenabled())
"""
GC_MARKING_MODEL = """
import gc
import os
import pathlib

import torch

pathlib.Path(os.environ["AUTOPLAN_TEST_GC_MARK"]).write_text(str(gc.isenabled()))


def build_model():
    return torch.nn.Linear(8, 8)


def example_inputs(batch_size):
    return (torch.randn(batch_size, 8),)
"""


def test_a_trace_imports_the_model_file_with_the_collector_paused_and_freezes_what_it_leaves(tmp_path):
    """cli/startup.py: the model file's imports (transformers) run with the GC paused, as torch's do, and the
    traced model and Graph, which live to the end of the command, are frozen so the search's full collections
    skip them; the collector is on again afterwards."""
    (tmp_path / "model.py").write_text(GC_MARKING_MODEL)
    mark = tmp_path / "gc_on_at_import.txt"
    env = {**os.environ, "AUTOPLAN_TRACE_CACHE": "off", "AUTOPLAN_TEST_GC_MARK": str(mark)}
    argv = ["trace", str(tmp_path / "model.py"), "--batch", "4", "--out", str(tmp_path / "out")]
    done = subprocess.run(
        [sys.executable, "-c", FREEZE_PROBE, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["frozen", "True"]
    assert mark.read_text() == "False"


def test_the_trace_runs_with_the_collector_paused(tmp_path, monkeypatch):
    """cli/trace.py: the trace (here the model's build, inside it) runs with the cyclic GC paused, and the
    collector is on again once the command is done."""
    from autoplan.cli import build_parser
    from autoplan.cli import trace as trace_command

    model = GC_MARKING_MODEL.replace("def build_model():\n", "def build_model():\n    mark_gc()\n")
    model = model.replace(
        'pathlib.Path(os.environ["AUTOPLAN_TEST_GC_MARK"]).write_text(str(gc.isenabled()))',
        'def mark_gc():\n    pathlib.Path(os.environ["AUTOPLAN_TEST_GC_MARK"]).write_text(str(gc.isenabled()))',
    )
    (tmp_path / "model.py").write_text(model)
    mark = tmp_path / "gc_on_at_build.txt"
    monkeypatch.setenv("AUTOPLAN_TRACE_CACHE", "off")
    monkeypatch.setenv("AUTOPLAN_TEST_GC_MARK", str(mark))
    argv = ["trace", str(tmp_path / "model.py"), "--batch", "4", "--quiet", "--out", str(tmp_path / "out")]
    assert trace_command.run(build_parser().parse_args(argv)) == 0
    assert mark.read_text() == "False"
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_search_runs_with_the_collector_paused(tmp_path, monkeypatch):
    """cli/solve.py: `autoplan plan`'s search runs with the cyclic GC paused (its collections only rescanned what
    lives to the end), and the collector is on again once the command is done, here with the search stopped."""
    import autoplan.solve.api
    from autoplan.cli import build_parser
    from autoplan.cli import solve as plan_command

    class Stop(Exception):
        pass

    seen = []

    def search(graph, **options):
        seen.append(gc.isenabled())
        raise Stop

    (tmp_path / "model.py").write_text(GC_MARKING_MODEL)
    monkeypatch.setenv("AUTOPLAN_TRACE_CACHE", "off")
    monkeypatch.setenv("AUTOPLAN_TEST_GC_MARK", str(tmp_path / "mark.txt"))
    monkeypatch.setattr(autoplan.solve.api, "plan_graph", search)
    argv = ["plan", str(tmp_path / "model.py"), "--devices", "2", "--profile", "dgx-a100", "--batch", "8"]
    with pytest.raises(Stop):
        plan_command.run(build_parser().parse_args([*argv, "--quiet", "--out", str(tmp_path / "out")]))
    assert seen == [False]
    assert gc.isenabled()


RANK_PROBE = """
import os, sys
import torch
torch.set_num_threads(1)  # as `autoplan run` keeps it until it forks (cli/execute.py)
from autoplan.cli import execute
from autoplan.jobs import launcher
from autoplan.types.plan import Plan
from autoplan.types.run_options import RunOptions

threads = len(os.listdir("/proc/self/task"))
def launch(**kw):
    wanted = (*execute.RANK_MODULES, "autoplan.execute.job.reference", "autoplan.execute.job.audit")
    print([m for m in wanted if m not in sys.modules], len(os.listdir("/proc/self/task")) - threads, kw["fork"])
    return 0
launcher.launch = launch
opts = RunOptions(model="m.py", plan="p.json", steps=2, out="o", verify=True, audit=True)
plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)
execute._launch(opts, plan=plan, hint="", fork=True)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_run_imports_its_ranks_modules_before_it_forks_them_and_starts_no_thread():
    """`autoplan run` forks its local CPU ranks (autoplan/jobs/forked.py) after importing what they run, so no
    rank imports it again; forking is only safe from a process that started no thread, and these imports start
    none (a fresh interpreter: the launch itself is replaced by a probe)."""
    printed = subprocess.run([sys.executable, "-c", RANK_PROBE], capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert printed.stdout.split("\n")[-2] == "[] 0 True"
