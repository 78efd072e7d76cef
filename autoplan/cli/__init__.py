"""The ``autoplan`` command line: a thin shell over the public API, in one layer.

Every command lives in this package, one module per pipeline stage (``trace``, ``profile``,
``solve``, ``execute``, ``report``, ``calibrate``), each registering its subcommands with
``register(subparsers, common)``; a command module may import any stage, while the stages
themselves are libraries that import only earlier stages and ``autoplan.types``. Start-up
laziness lives here too (:mod:`autoplan.cli.startup`): a command imports torch and the stages
it needs inside its handler. This module parses the shared flags and turns errors into one
sentence and a non-zero exit.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys

from autoplan.cli.outpath import check_out
from autoplan.errors import DEBUG_ENV, AutoplanError, StopSignal
from autoplan.quiet import silence_known_noise

#: Command modules, in pipeline order, with the commands each registers: a command line that names one
#: imports only its module (tests/unit/cli/test_startup.py holds this to what each module registers).
COMMAND_MODULES = {
    "autoplan.cli.trace": ("trace",),
    "autoplan.cli.profile": ("profile",),
    "autoplan.cli.solve": ("plan", "sweep"),
    "autoplan.cli.execute": ("run", "replan", "launch"),
    "autoplan.cli.report": ("report", "explain", "export"),
    "autoplan.cli.calibrate": ("calibrate",),
}

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130


def _common_flags(default) -> argparse.ArgumentParser:
    """--debug, --quiet and --json. The command parsers get them with ``default=SUPPRESS``: a
    subparser's default would otherwise overwrite the same flag given before the command name
    (``autoplan --json plan ...``), which argparse parses first."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=default, help="show full tracebacks")
    common.add_argument("--quiet", action="store_true", default=default, help="print nothing but errors")
    common.add_argument("--json", action="store_true", default=default, help="print the result as JSON on stdout")
    return common


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's, or only that of ``command``'s module when it is one."""
    common = _common_flags(argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="autoplan",
        description="Plan, run and explain hybrid data/tensor/pipeline parallel training.",
        parents=[_common_flags(False)],
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    known = any(command in commands for commands in COMMAND_MODULES.values())
    for name, commands in COMMAND_MODULES.items():
        if not known or command in commands:
            importlib.import_module(name).register(subparsers, common)
    return parser


def command_named(argv: list[str]) -> str | None:
    """The command a command line names: its first word that is not a flag (the common flags take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as a program: after the last atexit handler, freeze the heap so the
        atexit.register(gc.freeze)  # interpreter's final collection (~0.7 s over torch's objects) is skipped
    silence_known_noise()  # before any library is imported: their known harmless lines (autoplan/quiet.py)
    parser = build_parser(command_named(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.own_process = argv is None  # the program's own process, not a caller's (autoplan run forks its ranks)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    debug_set = getattr(args, "debug", False) and DEBUG_ENV not in os.environ
    if debug_set:  # the ranks autoplan run starts show their refusals' tracebacks too
        os.environ[DEBUG_ENV] = "1"
    try:
        code = _dispatch(args)
    finally:
        if debug_set:
            os.environ.pop(DEBUG_ENV, None)
    if args.own_process and getattr(args, "exits_fast", False):  # plan, sweep, trace: nothing left to finalise
        from autoplan.cli.startup import exit_now

        exit_now(code)  # the interpreter's teardown skipped (cli/startup.py)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command; its exit code, with bad input, a stop or a bug of ours said in one sentence."""
    try:
        check_out(args)  # a path --out cannot be, before any work (cli/outpath.py)
        result = args.func(args)
        return int(result or 0)
    except StopSignal as exc:
        print(f"autoplan: {exc}", file=sys.stderr)
        return exc.exit_code
    except AutoplanError as exc:
        if args.debug:
            raise
        print(f"autoplan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("autoplan: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug of ours: say so, keep the traceback for --debug
        if args.debug:
            raise
        if isinstance(exc, OSError) and exc.filename:  # the file system refused a path: not a bug
            print(f"autoplan: error: cannot use '{exc.filename}': {exc.strerror or exc}.", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(
            f"autoplan: internal error: {type(exc).__name__}: {exc} "
            "(rerun with --debug for the traceback, and please report it).",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
