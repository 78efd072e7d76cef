"""torchtitan's model flavours, read from the installed torchtitan, and the one a traced model is.

torchtitan trains only the models of its own registry: a model module (``llama3``, ``qwen3``, ...)
and one of its flavours (``debugmodel``, ``8B``, ...). A config that names none trains torchtitan's
default, ``debugmodel``, so the exporter names the flavour whose shape is the traced model's:

    layers, hidden size, attention heads, KV heads, vocabulary, and the dense FFN's hidden size,

each compared where both sides state it; layers, hidden size, heads and vocabulary must be stated.

:func:`read_registry` runs this module as a program (``python -m autoplan.export.torchtitan_flavours``)
in a subprocess that imports the installed torchtitan's model packages, builds every flavour's
config (dataclasses, no tensors) and prints the shapes as JSON. A subprocess, because torchtitan's
model packages import triton for their expert-parallel kernels, which a CPU machine lacks, and pull
torchao and more into the caller: the subprocess puts an inert module in place of those kernels
when triton is missing (only configs are built; no kernel is called). It also finds each flavour's
training recipe (the shortest-named function of the model's ``config_registry`` that trains it:
``llama3_8b`` rather than ``llama3_8b_mxfp8``) and the modules torchtitan puts before the first
and after the last block of a pipeline (torchtitan's own ``_generate_llm_fqn_per_model_part``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoplan.export.common import ModelFacts
from autoplan.types._check import write_text_atomic

SHAPE_KEYS = ("layers", "dim", "heads", "kv_heads", "vocab", "ffn")
REQUIRED_KEYS = ("layers", "dim", "heads", "vocab")
# the modules that import triton when imported: 0.3's expert-parallel kernels, 0.2's MoE kernels
KERNELS = ("torchtitan.distributed.minimal_async_ep.kernels", "torchtitan.models.moe.kernels")


@dataclass(frozen=True)
class Flavour:
    """One flavour of torchtitan's registry and its shape (None where the config does not state it)."""

    module: str  # the model package under torchtitan.models, e.g. "llama3"
    flavor: str  # e.g. "8B"
    recipe: str | None  # the config_registry function that trains it, e.g. "llama3_8b"
    shape: dict[str, int | None]


@dataclass
class Registry:
    """The flavours of the installed torchtitan, or why none could be read (``reason``)."""

    version: str = ""
    flavours: list[Flavour] = field(default_factory=list)
    input_modules: list[str] = field(default_factory=list)  # before the first block, e.g. ["tok_embeddings"]
    output_modules: list[str] = field(default_factory=list)  # after the last block, e.g. ["norm", "lm_head"]
    reason: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Registry":
        flavours = [Flavour(**f) for f in data.get("flavours", [])]
        return cls(**{**data, "flavours": flavours})


def facts_shape(facts: ModelFacts) -> dict[str, int | None]:
    """The traced model's shape in :data:`SHAPE_KEYS` terms (KV heads default to the heads)."""
    return {
        "layers": facts.layers,
        "dim": facts.hidden_size,
        "heads": facts.num_heads,
        "kv_heads": facts.num_kv_heads or facts.num_heads,
        "vocab": facts.vocab_size,
        "ffn": facts.ffn_hidden_size,
    }


def matching(registry: Registry, facts: ModelFacts) -> list[Flavour]:
    """The flavours whose shape is the traced model's (module docstring)."""
    traced = facts_shape(facts)
    if any(traced[k] is None for k in REQUIRED_KEYS):
        return []
    return [f for f in registry.flavours if _same_shape(traced, f.shape)]


def _same_shape(traced: dict[str, int | None], theirs: dict[str, int | None]) -> bool:
    if any(theirs.get(k) is None for k in REQUIRED_KEYS):
        return False
    return all(traced[k] == theirs.get(k) for k in SHAPE_KEYS if traced[k] is not None and theirs.get(k) is not None)


def describe_shape(facts: ModelFacts) -> str:
    names = {"layers": "layers", "dim": "hidden", "heads": "heads", "kv_heads": "KV heads", "vocab": "vocab"}
    names["ffn"] = "FFN hidden"
    return ", ".join(f"{names[k]} {v}" for k, v in facts_shape(facts).items() if v)


def read_registry(timeout_s: float = 300.0) -> Registry:
    """The installed torchtitan's flavours (module docstring), read in a subprocess once per
    installation: a read is kept in :func:`cache_path` and reused while its key holds."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        return Registry(reason="torchtitan is not installed here")
    cache = cache_path(Path(next(iter(spec.submodule_search_locations))))
    if cache.is_file():
        try:
            return Registry.from_dict(json.loads(cache.read_text()))
        except (ValueError, TypeError):
            pass  # a damaged cache is read again below and replaced
    found = _read_registry_now(timeout_s)
    if not found.reason:
        try:
            write_text_atomic(cache, json.dumps(asdict(found)))
        except OSError:
            pass  # an unwritable cache folder only costs the next export this read again
    return found


def cache_path(package: Path) -> Path:
    """Where a registry read is kept: under ``$XDG_CACHE_HOME/autoplan`` (default ``~/.cache``),
    named by a hash of what the read depends on: this module's source, torchtitan's folder, and
    the size and modification time of every file of ``torchtitan/models`` (an upgrade or an
    edited flavour makes a new key)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(str(package).encode())
    for path in sorted((package / "models").rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "autoplan" / f"torchtitan-flavours-{digest.hexdigest()[:16]}.json"


def _read_registry_now(timeout_s: float) -> Registry:
    root = str(Path(__file__).resolve().parents[2])  # this autoplan, not another one on the path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "autoplan.export.torchtitan_flavours"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return Registry(reason=f"torchtitan's model registry took over {timeout_s:.0f} s to read")
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return Registry(reason=f"torchtitan's model registry could not be read ({last})")
    return Registry.from_dict(json.loads(lines[-1]))


# ---- the subprocess ----------------------------------------------------------------------------
def _inert_kernels() -> None:
    """Stand in for torchtitan's triton kernels where triton is missing: only configs are built here."""
    if importlib.util.find_spec("triton") is not None:
        return
    for name in KERNELS:
        kernels = types.ModuleType(name)
        kernels.__getattr__ = lambda attr: None  # the names it exports, never called
        sys.modules[name] = kernels


def _registry_now() -> dict[str, Any]:
    _inert_kernels()
    import torchtitan
    from torchtitan.models import _supported_models

    out: dict[str, Any] = {"version": getattr(torchtitan, "__version__", ""), "flavours": []}
    skipped = []
    for name in sorted(_supported_models):
        try:
            out["flavours"] += _module_flavours(name)
        except Exception as exc:  # one model package that cannot load must not hide the others
            skipped.append(f"{name} ({type(exc).__name__}: {exc})")
    out["input_modules"], out["output_modules"] = _end_modules()
    if not out["flavours"]:
        out["reason"] = "no flavour could be read from torchtitan's registry: " + "; ".join(skipped)
    return out


def _module_flavours(name: str) -> list[dict[str, Any]]:
    package = importlib.import_module(f"torchtitan.models.{name}")
    # 0.3: <name>_configs, flavour -> a function of the model's config; 0.2: <name>_args, flavour -> its args
    configs = next(v for k, v in vars(package).items() if k.endswith(("_configs", "_args")) and isinstance(v, dict))
    recipes = _recipes(name)
    flavours = []
    for flavor, config in configs.items():
        try:
            shape = _shape(package.model_registry(flavor).model) if callable(config) else _args_shape(config)
        except Exception:  # a flavour that needs what is not installed (a vision tower, a kernel)
            continue
        flavours.append({"module": name, "flavor": flavor, "recipe": recipes.get(flavor), "shape": shape})
    return flavours


def _recipes(name: str) -> dict[str, str]:
    """flavor -> the shortest-named no-argument function of the model's config_registry that trains it."""
    try:
        registry = importlib.import_module(f"torchtitan.models.{name}.config_registry")
    except Exception:
        return {}
    found: dict[str, str] = {}
    for fn_name, fn in sorted(vars(registry).items(), key=lambda kv: (len(kv[0]), kv[0])):
        if not fn_name.startswith(f"{name}_") or not inspect.isfunction(fn) or fn.__module__ != registry.__name__:
            continue  # the model's own pre-training recipes (sft_debugmodel fine-tunes)
        if any(p.default is p.empty for p in inspect.signature(fn).parameters.values()):
            continue
        try:
            spec = getattr(fn(), "model_spec", None)
        except Exception:
            continue
        if spec is not None and spec.name == name:
            found.setdefault(spec.flavor, fn_name)
    return found


def _shape(model: Any) -> dict[str, int | None]:
    layers = getattr(model, "layers", None)
    first = _as_dict(layers[0]) if isinstance(layers, (list, tuple)) and layers else {}
    heads = _first_int(first.get("attention", {}), "n_heads")
    ffn = _first_int(first.get("feed_forward") or {}, "out_features")  # w1: dim -> hidden
    return {
        "layers": len(layers) if isinstance(layers, (list, tuple)) else None,
        "dim": getattr(model, "dim", None),
        "heads": heads,
        "kv_heads": _first_int(first.get("attention", {}), "n_kv_heads") or heads,
        "vocab": getattr(model, "vocab_size", None),
        "ffn": ffn,
    }


def _args_shape(args: Any) -> dict[str, int | None]:
    """0.2's model args (``TransformerModelArgs``): sizes as attributes; the FFN width is derived, not stated."""
    heads = getattr(args, "n_heads", None)
    return {
        "layers": getattr(args, "n_layers", None),
        "dim": getattr(args, "dim", None),
        "heads": heads,
        "kv_heads": getattr(args, "n_kv_heads", None) or heads,
        "vocab": getattr(args, "vocab_size", None),
        "ffn": None,
    }


def _as_dict(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else {}


def _first_int(tree: Any, key: str) -> int | None:
    """The first integer under ``key`` in a nested dict/list, depth first."""
    if isinstance(tree, dict):
        if isinstance(tree.get(key), int) and not isinstance(tree.get(key), bool):
            return tree[key]
        children = tree.values()
    elif isinstance(tree, (list, tuple)):
        children = tree
    else:
        return None
    return next((v for v in (_first_int(c, key) for c in children) if v is not None), None)


def _end_modules() -> tuple[list[str], list[str]]:
    from torchtitan.distributed import pipeline_parallel

    generate = getattr(pipeline_parallel, "_generate_llm_fqn_per_model_part", None) or getattr(
        pipeline_parallel, "generate_llm_fqn_per_model_part"
    )
    first, last = generate(2, 2, 0, 0)
    return first[: first.index("layers.0")], last[last.index("layers.1") + 1 :]


if __name__ == "__main__":
    print(json.dumps(_registry_now()))
