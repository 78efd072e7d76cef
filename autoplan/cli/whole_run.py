"""The whole-run flags ``autoplan plan`` and ``autoplan sweep`` share: the run's length (``--tokens``
or ``--steps``), prices, ``--spot``, ``--deadline`` and ``--budget`` -> a :class:`RunSpec`
(autoplan/types/run.py; cost/run/whole_run.py prices it). Quantities take the suffixes people write:
``15T`` tokens, ``72h`` or ``3d``, ``$40k``."""

from __future__ import annotations

import argparse
import re

from autoplan.errors import PlanError

_NUMBER = re.compile(r"^\s*\$?\s*([0-9][0-9_,]*\.?[0-9]*(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
TOKEN_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
DOLLAR_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6}
HOUR_SUFFIXES = {"": 1.0, "h": 1.0, "min": 1 / 60, "d": 24.0, "w": 168.0}


def quantity(text: str, *, flag: str, suffixes: dict[str, float], example: str) -> float:
    """``text`` as a number times its suffix's scale (case-insensitive); one sentence when it is not."""
    match = _NUMBER.match(str(text))
    scale = suffixes.get(match.group(2).lower()) if match else None
    if match is None or scale is None:
        raise PlanError(f"{flag} {text!r} is not valid; expected a number such as {example}.")
    return float(match.group(1).replace(",", "").replace("_", "")) * scale


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--tokens", help="the whole run's tokens (e.g. 2e12, 300B, 15T): report its time and cost")
    length.add_argument("--steps", type=int, help="the whole run's optimizer steps (instead of --tokens)")
    parser.add_argument(
        "--price-per-device-hour", type=float, help="on-demand dollars per device-hour (overrides the profile's)"
    )
    parser.add_argument("--spot", action="store_true", help="price the run on spot devices, interruptions included")
    parser.add_argument("--spot-price-per-device-hour", type=float, help="spot dollars per device-hour")
    parser.add_argument(
        "--spot-interruptions-per-device-hour", type=float, help="how often a spot device is reclaimed, per hour"
    )
    parser.add_argument("--deadline", help="the whole run must finish within this (hours, or 72h, 3d, 2w)")
    parser.add_argument("--budget", help="the whole run must cost at most this many dollars (e.g. 50000, $40k)")


def run_spec_of(args: argparse.Namespace):
    """The RunSpec the flags give, or None when none of them was given (the step-only planner)."""
    from autoplan.types.run import RunSpec

    given = (
        args.tokens,
        args.steps,
        args.price_per_device_hour,
        args.spot_price_per_device_hour,
        args.spot_interruptions_per_device_hour,
        args.deadline,
        args.budget,
    )
    if all(value is None for value in given) and not args.spot:
        return None
    return RunSpec(
        tokens=quantity(args.tokens, flag="--tokens", suffixes=TOKEN_SUFFIXES, example="2e12 or 15T")
        if args.tokens is not None
        else None,
        steps=args.steps,
        spot=args.spot,
        price_per_device_hour=args.price_per_device_hour,
        spot_price_per_device_hour=args.spot_price_per_device_hour,
        spot_interruptions_per_device_hour=args.spot_interruptions_per_device_hour,
        deadline_h=quantity(args.deadline, flag="--deadline", suffixes=HOUR_SUFFIXES, example="72, 72h or 3d")
        if args.deadline is not None
        else None,
        budget_usd=quantity(args.budget, flag="--budget", suffixes=DOLLAR_SUFFIXES, example="50000 or $40k")
        if args.budget is not None
        else None,
    )
