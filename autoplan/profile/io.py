"""Load and save hardware profiles (YAML or JSON).

``load_profile(name_or_path)`` takes a path to a ``.yaml``/``.yml``/``.json`` file, or a
file stem such as ``dgx-h100`` that is looked up in ``./profiles/`` and then in the
``profiles/`` folder shipped beside the package, or an instance family such as ``p5`` that
names exactly one profile stem ending in ``-p5`` (``aws-p5``). :func:`resolve_profile_path` is
the one place a profile name is resolved; :func:`profile_file` says whether a name was a file.
Every way a file can be wrong (missing, unparsable, a missing or unknown field, a bad value)
raises :class:`ProfileError` with one sentence naming the file, the field, the value and what was expected.

``save_profile(profile, path)`` writes YAML or JSON by the path's suffix, atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from autoplan.errors import ProfileError
from autoplan.types._check import write_text_atomic
from autoplan.types.host_spec import HostProfile
from autoplan.types.pricing import PricingSpec
from autoplan.types.profile import CollectiveFit, CommOverlap, DeviceSpec, Efficiency, LinkSpec, OpTiming, Profile
from autoplan.types.reliability import ReliabilitySpec, StorageSpec

SUFFIXES = (".yaml", ".yml", ".json")
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "profiles"

#: Which dataclass describes the mapping found at each nesting level ("*" = any key).
_SCHEMA: dict[tuple[str, ...], type] = {
    (): Profile,
    ("device",): DeviceSpec,
    ("device", "efficiency", "*"): Efficiency,
    ("device", "op_table", "*"): OpTiming,
    ("intra_node",): LinkSpec,
    ("inter_node",): LinkSpec,
    ("intra_node", "collectives", "*"): CollectiveFit,
    ("inter_node", "collectives", "*"): CollectiveFit,
    ("comm_overlap",): CommOverlap,
    ("storage",): StorageSpec,
    ("reliability",): ReliabilitySpec,
    ("host",): HostProfile,
    ("pricing",): PricingSpec,
}
#: Older top-level fields still read (Profile.from_dict turns them into ``pricing``).
_LEGACY: frozenset[str] = frozenset({"price_per_device_hour", "price_source"})


class _Loader(yaml.SafeLoader):
    """A safe loader that also reads ``200e9`` and ``1e-5`` as floats (YAML 1.1 wants a dot)."""


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """:class:`_Loader`'s tags and constructors on libyaml's scanner and parser, in C where PyYAML was built
    with it: dgx-a100.yaml in 1 ms rather than 10 (every ``plan`` reads a profile). The same YAML 1.1 grammar;
    a file it refuses is read again by :class:`_Loader`, whose verdict and error message stand (:func:`_yaml_data`)."""


for _loader in (_Loader, _FastLoader):
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$"), list("-+0123456789.")
    )


def search_dirs() -> list[Path]:
    """Folders searched for a profile given by stem: ./profiles, then the shipped folder."""
    dirs = [Path.cwd() / "profiles", SHIPPED_DIR]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def available_profiles() -> list[str]:
    """Stems of every profile file found in :func:`search_dirs`."""
    return sorted({p.stem for d in search_dirs() if d.is_dir() for p in d.iterdir() if p.suffix in SUFFIXES})


def _is_path(name_or_path: str | os.PathLike) -> bool:
    """A profile given as a file (a profile suffix or a folder in it), not as a name."""
    path = Path(name_or_path)
    return path.suffix in SUFFIXES or len(path.parts) > 1


def profile_file(profile: Profile | str | os.PathLike) -> str | None:
    """The absolute path of a profile given as an existing file, else None (a name or a Profile): what
    plan.json records as its ``profile`` so that ``run --audit`` and ``calibrate`` can load it again."""
    if isinstance(profile, Profile) or not _is_path(profile) or not Path(profile).is_file():
        return None
    return str(Path(profile).resolve())


def resolve_profile_path(name_or_path: str | os.PathLike) -> Path:
    """A path that exists, else the file a stem names in :func:`search_dirs`, else the one profile
    whose stem ends in ``-NAME`` (an instance family: ``p5`` for ``aws-p5``)."""
    path = Path(name_or_path)
    if _is_path(path):
        if not path.is_file():
            raise ProfileError(
                f"profile file '{path}' does not exist; give an existing .yaml/.json path "
                f"or one of: {', '.join(available_profiles())}."
            )
        return path
    family = [stem for stem in available_profiles() if stem.endswith(f"-{path.name}")]
    found = _stem_file(path.name) or (_stem_file(family[0]) if len(family) == 1 else None)
    if found is not None:
        return found
    raise ProfileError(
        f"unknown profile or instance '{name_or_path}'; use one of: {', '.join(available_profiles())}, "
        "or give a file path."
    )


def _stem_file(stem: str) -> Path | None:
    """The first file named ``stem`` with a profile suffix in :func:`search_dirs`."""
    for folder in search_dirs():
        for suffix in SUFFIXES:
            if (folder / f"{stem}{suffix}").is_file():
                return folder / f"{stem}{suffix}"
    return None


def load_profile(name_or_path: str | os.PathLike | Profile) -> Profile:
    """Load and validate a profile by stem or path (a Profile is returned unchanged)."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    path = resolve_profile_path(name_or_path)
    data = _parse(path)
    try:
        _check_fields(data, (), path)
        return Profile.from_dict(data)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(f"{path}: profile is malformed ({exc}); see docs/profile-format.md.") from None


def _parse(path: Path) -> Any:
    text = path.read_text()
    try:
        return json.loads(text) if path.suffix == ".json" else _yaml_data(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile file '{path}' is not valid JSON ({exc.msg} at line {exc.lineno}).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "parse error"
        raise ProfileError(f"profile file '{path}' is not valid YAML ({problem}{where}).") from None


def _yaml_data(text: str) -> Any:
    """``text`` read by :class:`_FastLoader`, or by :class:`_Loader` where that fails (its error is the one raised)."""
    try:
        return yaml.load(text, Loader=_FastLoader)
    except yaml.YAMLError:
        return yaml.load(text, Loader=_Loader)


def _check_fields(data: Any, where: tuple[str, ...], path: Path) -> None:
    """Walk the mapping against the dataclasses, naming the first missing or unknown field."""
    kind = _SCHEMA.get(where) or _SCHEMA.get(where[:-1] + ("*",))
    label = ".".join(where) or "the top level"
    if kind is None:
        return
    if not isinstance(data, dict):
        raise ProfileError(f"profile field '{label}' is {type(data).__name__} {data!r:.60}; expected a mapping.")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    for name, spec in fields.items():
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        if required and name not in data:
            raise ProfileError(
                f"profile is missing the field '{'.'.join(where + (name,))}'; see docs/profile-format.md."
            )
    for name, value in data.items():
        if name not in fields and not (where == () and name in _LEGACY):
            raise ProfileError(
                f"profile has an unknown field '{'.'.join(where + (str(name),))}'; expected one of {', '.join(fields)}."
            )
        _check_children(value, where + (name,), path)


def _check_children(value: Any, where: tuple[str, ...], path: Path) -> None:
    if where in _SCHEMA:
        if value is not None or where == ("device",):
            _check_fields(value, where, path)
        return
    child = where + ("*",)
    if child not in _SCHEMA:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_fields(item, where + (str(key),), path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_fields(item, where + (str(index),), path)
    else:
        raise ProfileError(f"profile field '{'.'.join(where)}' is {value!r:.60}; expected a mapping or list.")


def save_profile(profile: Profile, path: str | os.PathLike) -> Path:
    """Validate and write ``profile`` as YAML (.yaml/.yml) or JSON (.json), atomically."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ProfileError(
            f"profile output '{path}' has suffix '{path.suffix}'; expected one of {', '.join(SUFFIXES)}."
        )
    data = profile.to_dict()
    Profile.from_dict(data)  # re-validate: the object may have been changed after it was built
    if path.suffix == ".json":
        text = json.dumps(data, indent=2) + "\n"
    else:
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
    return write_text_atomic(path, text)
