"""Loading the configuration (its schema is :mod:`rollstream.config`), validated at start-up.

Precedence (later wins): defaults < profile < TOML file < environment < ``--set`` overrides.

* Profile: a TOML file of defaults that a command brings (``rollstream run`` uses
  ``rollstream/profiles/quick.toml``, a short run that fits a 2-core CPU machine).
* TOML: ``rollstream --config rollstream.toml ...`` (or ``$ROLLSTREAM_CONFIG``). Sections
  nest where settings belong together: ``[learner.loss]``, ``[learner.optim]``,
  ``[learner.checkpoint]``, ``[learner.lora]`` (its presence turns LoRA on).
* Backends: ``[generator.backend]``, ``[executor.backend]`` and ``[learner.backend]`` are tagged
  tables: ``kind`` names the backend and the table holds that backend's own settings
  (``[generator.backend] kind = "sglang"``, ``url = ...``). The kind alone stands for its table
  with the defaults (``generator.backend = "sim"``, ``--set generator.backend=sim``); a layer that
  names another kind replaces the table of the layers under it instead of merging into it.
* Environment: ``ROLLSTREAM__SECTION__KEY=value`` (double underscores, one per level), e.g.
  ``ROLLSTREAM__LEARNER__OPTIM__LR=1e-6``. Values are parsed as TOML values, falling back
  to a plain string.
* CLI: ``--set section.key=value`` or ``--set section.sub.key=value`` (same parsing), repeatable.

The flat keys of versions before 0.1.0 (``learner.lr``, ``generator.sglang_url``, ...) and the
backend sections before the tagged tables (``[generator.sim]``, ``[generator.sglang]``,
``executor.sim_seconds``, ...) are refused with an error naming the key that replaced them
(:data:`MOVED`, :data:`INTO_BACKEND`). A wrong key or value fails
with :class:`rollstream.errors.ConfigError`, naming the key and the allowed keys or values
(:func:`explain`). :func:`to_toml` writes a resolved config back as TOML.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from rollstream.config import Config, check_consistency
from rollstream.errors import ConfigError

log = logging.getLogger(__name__)
PROFILES = Path(__file__).resolve().parent / "profiles"
ENV_PREFIX = "ROLLSTREAM__"
# Flat keys of versions before 0.1.0 -> where they live now (refused, naming the new key).
# ``learner.lora = true`` is refused apart: LoRA is on when a [learner.lora] table is present.
MOVED: dict[str, str] = {
    **{f"learner.{k}": f"learner.optim.{k}" for k in ("lr", "weight_decay", "warmup_steps", "grad_clip")},
    **{f"learner.{k}": f"learner.loss.{k}" for k in ("clip_low", "clip_high", "is_cap", "loss_agg", "kl_beta")},
    **{f"learner.checkpoint_{k}": f"learner.checkpoint.{k}" for k in ("every", "dir", "keep")},
    "learner.lora_rank": "learner.lora.rank",
    "learner.lora_broadcast": "learner.lora.broadcast",
}
# Keys and tables that moved into a backend's table -> (the backend's kind, its key there; "" for a
# whole table), refused naming both.
INTO_BACKEND: dict[str, tuple[str, str]] = {
    "generator.sim": ("sim", ""),
    "generator.sglang": ("sglang", ""),
    **{f"generator.sglang_{k}": ("sglang", k)
       for k in ("url", "weights_dir", "abort_on_update", "flush_cache", "concurrency", "timeout_s")},
    "generator.scripted_answers": ("scripted", "answers"),
    "executor.sim_seconds": ("sim", "seconds"),
    "learner.sim_per_token_s": ("sim", "per_token_s"),
}
BACKENDS = ("generator", "executor", "learner")
"""The sections whose ``backend`` is a tagged table."""


def parse_value(text: str) -> Any:
    """A TOML value ("3", "true", "[1, 2]", "'x'"), or the text itself when it is not one."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_path(tree: dict[str, Any], dotted: str, value: Any, origin: str) -> None:
    parts = dotted.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"{origin}: expected section.key, got {dotted!r}; sections: {', '.join(_fields(Config))}")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {part!r} is a value, not a table, so {dotted!r} cannot be set")
        node = child
    key = parts[-1]
    if len(parts) == 2 and key == "backend" and parts[0] in BACKENDS and isinstance(value, str):
        # the kind alone: its table, keeping keys this layer already set for the same kind
        under = node.get(key)
        same = isinstance(under, dict) and under.get("kind", value) == value
        value = {**(under if same else {}), "kind": value}
    node[key] = value


def overrides_from_env(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``ROLLSTREAM__SECTION__KEY=value`` pairs as ("section.key", "value")."""
    pairs = []
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX):
            pairs.append((name[len(ENV_PREFIX) :].lower().replace("__", "."), value))
    return sorted(pairs)


def read_toml(path: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def profile_path(name: str) -> Path:
    """A profile shipped with rollstream (``rollstream/profiles/<name>.toml``), or a path."""
    shipped = PROFILES / f"{name}.toml"
    return shipped if shipped.is_file() else Path(name)


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    profile: str | Path | None = None,
) -> Config:
    """Resolve the config: defaults < ``profile`` < file < environment < ``overrides``
    ("section.key=value")."""
    environ = os.environ if environ is None else environ
    tree: dict[str, Any] = _refuse_moved(read_toml(profile), f"profile {profile}") if profile else {}
    path = path or environ.get("ROLLSTREAM_CONFIG")
    if path:
        _merge(tree, _refuse_moved(read_toml(path), f"config file {path}"))
    layer: dict[str, Any] = {}
    for dotted, text in overrides_from_env(environ):
        _set_path(layer, dotted, parse_value(text), f"environment {ENV_PREFIX}{dotted.upper().replace('.', '__')}")
    _merge(tree, _refuse_moved(layer, "the environment"))
    layer = {}
    for item in overrides:
        dotted, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        _set_path(layer, dotted.strip(), parse_value(text.strip()), f"--set {item!r}")
    _merge(tree, _refuse_moved(layer, "--set"))
    return validate(tree)


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> None:
    """``top`` over ``base``, table by table (a table replaces a non-table and vice versa; a tagged
    table naming another ``kind`` replaces the one under it)."""
    for key, value in top.items():
        under = base.get(key)
        if (isinstance(value, Mapping) and isinstance(under, dict)
                and value.get("kind", under.get("kind")) == under.get("kind")):
            _merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value


def _refuse_moved(tree: dict[str, Any], origin: str) -> dict[str, Any]:
    """Refuse the keys of earlier versions, naming the key that replaced each; a backend named by
    its kind alone becomes its table (``{"kind": kind}``)."""
    learner = tree.get("learner")
    if isinstance(learner, dict) and isinstance(learner.get("lora"), bool):
        raise ConfigError(f"{origin}: learner.lora = {str(learner['lora']).lower()} is no longer a switch: LoRA is "
                          "on when a [learner.lora] table is present (e.g. [learner.lora] rank = 8, or "
                          "--set learner.lora.rank=8); remove the key to leave it off")
    for old, new in MOVED.items():
        section, key = old.split(".")
        table = tree.get(section)
        if isinstance(table, dict) and key in table:
            raise ConfigError(f"{origin}: {old} moved to {new} (write [{new.rsplit('.', 1)[0]}] "
                              f"{new.rsplit('.', 1)[1]} = ..., or --set {new}=...)")
    for old, (kind, key) in INTO_BACKEND.items():
        section, name = old.split(".")
        table = tree.get(section)
        if isinstance(table, dict) and name in table:
            where = f"{section}.backend"
            what = f"its keys in [{where}]" if not key else f"{key} = ... in it"
            example = f"--set {where}.{key}=..." if key else f"--set {where}.KEY=..."
            raise ConfigError(f"{origin}: {old} moved into the backend's table {where}: write [{where}] "
                              f"kind = {kind!r} and {what} (or --set {where}={kind} {example})")
    for section in BACKENDS:
        table = tree.get(section)
        if isinstance(table, dict) and isinstance(table.get("backend"), str):
            table["backend"] = {"kind": table["backend"]}
    return tree


def _lora_on(tree: dict[str, Any]) -> bool:
    return isinstance(tree.get("learner"), dict) and isinstance(tree["learner"].get("lora"), dict)


def validate(tree: Mapping[str, Any]) -> Config:
    """The config a tree of tables makes (each backend a table: :func:`load_config` makes them)."""
    try:
        config = msgspec.convert(tree, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(explain(exc, tree)) from None
    return check_consistency(config)


_PATH = re.compile(r"at `\$((?:\.\w+|\[\d+\])*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")


def explain(exc: msgspec.ValidationError, tree: Mapping[str, Any] | None = None) -> str:
    """A validation error rewritten to name the key and what it accepts (``tree``: the values
    validated, which tell a tagged table's variant)."""
    message = str(exc)
    match = _PATH.search(message)
    path = [p for p in (match.group(1).split(".") if match else []) if p]
    owner: Any = Config
    node: Any = tree
    for part in path:
        name = part.split("[")[0]
        node = node.get(name) if isinstance(node, Mapping) else None
        field = _field_type(owner, name)
        variants = _variants(field)
        if variants:
            kind = node.get("kind") if isinstance(node, Mapping) else None
            where = ".".join(path[: path.index(part) + 1])
            if kind is None or kind not in variants:
                got = "no kind" if kind is None else f"kind = {kind!r}"
                return (f"{where!r} has {got}: a backend's table names it with kind = one of "
                        f"{', '.join(map(repr, variants))} (e.g. {where} = {next(iter(variants))!r})")
            owner = variants[kind]
            continue
        owner = _struct_of(field) or owner
    unknown = _UNKNOWN.search(message)
    if unknown:
        where = ".".join(path + [unknown.group(1)]) or unknown.group(1)
        allowed = ", ".join(_fields(owner)) if _is_struct(owner) else "?"
        tag = owner.__struct_config__.tag if _is_struct(owner) and owner.__struct_config__.tag_field else None
        return f"unknown config key {where!r}; allowed here{f' (kind {tag!r})' if tag else ''}: {allowed or 'none'}"
    key = ".".join(path) or "config"
    allowed = _describe(owner)
    return f"bad value for {key!r}: {message.split(' - at ')[0]}" + (f"; allowed: {allowed}" if allowed else "")


def _struct_of(tp: Any) -> Any:
    """The Struct in ``tp`` (``X | None`` included), else ``tp``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        structs = [a for a in typing.get_args(tp) if _is_struct(a)]
        return structs[0] if structs else tp
    return tp


def _variants(tp: Any) -> dict[str, Any]:
    """A tagged union's variants by their kind ({} for any other type)."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return {}
    tagged = [a for a in typing.get_args(tp) if _is_struct(a) and a.__struct_config__.tag_field]
    return {a.__struct_config__.tag: a for a in tagged}


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _fields(tp: Any) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(tp))


def _field_type(tp: Any, name: str) -> Any:
    if not _is_struct(tp):
        return None
    for f in msgspec.structs.fields(tp):
        if f.name == name:
            return f.type
    return None


def _describe(tp: Any) -> str:
    """Human words for what a field type accepts."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *metas = typing.get_args(tp)
        bounds = []
        for meta in metas:
            if isinstance(meta, Meta):
                for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                    if getattr(meta, name) is not None:
                        bounds.append(f"{sym} {getattr(meta, name)}")
        return " ".join(filter(None, [_describe(base), " and ".join(bounds)]))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if _is_struct(tp):
        return "a table with keys " + ", ".join(_fields(tp))
    if tp is type(None):
        return "none (leave unset)"
    return getattr(tp, "__name__", str(tp))


def to_toml(config: Config, base: Config | None = None) -> str:
    """The resolved config as TOML text (None values are left out; nested sections as tables).
    With ``base``: only what differs from it (a section or backend table only where something in
    it differs; a backend of another kind whole), so that the file read over ``base``'s layers
    resolves to ``config`` — e.g. a bench's run over the profile ``rollstream run`` applies
    (``profiled``), which a whole dump of the defaults would override."""
    lines: list[str] = []
    for section in _fields(Config):
        value = getattr(config, section)
        _table(lines, section, value, getattr(base, section) if base is not None else None)
    return "\n".join(lines)


def profiled(profile: str | None = "quick") -> Config:
    """The config ``rollstream run`` (or any command taking ``--profile``) resolves from ``profile``
    alone: no file, no environment, no overrides (None: the defaults, as a command without a
    profile resolves them)."""
    return load_config(None, (), environ={}, profile=profile_path(profile) if profile else None)


def _table(lines: list[str], name: str, section: msgspec.Struct, base: msgspec.Struct | None = None) -> None:
    if base is not None and (section == base or type(section) is not type(base)):
        if section == base:
            return
        base = None  # another backend kind: the whole table (it replaces the one under it)
    own: list[str] = []
    config = type(section).__struct_config__
    nested = []
    for field in _fields(type(section)):
        value = getattr(section, field)
        under = getattr(base, field) if base is not None else None
        if isinstance(value, msgspec.Struct):
            nested.append((f"{name}.{field}", value, under if isinstance(under, msgspec.Struct) else None))
        elif value is None and under is not None:
            raise ValueError(f"{name}.{field}: a file cannot unset what its base sets ({under!r}); "
                             "write the whole config (to_toml without base) instead")
        elif value is not None and (base is None or value != under):
            own.append(f"{field} = {_toml_value(value)}")
    if own or base is None or config.tag_field:
        lines.append(f"[{name}]")
        if config.tag_field:
            lines.append(f"{config.tag_field} = {_toml_value(config.tag)}")
        lines.extend(own)
        lines.append("")
    for sub, value, under in nested:
        _table(lines, sub, value, under)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{msgspec.json.encode(k).decode()} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
