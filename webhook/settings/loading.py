"""The settings file: every key checked against its type and bounds, every mistake a ConfigError
that names the setting, the value and what is allowed. `load_config(path)` is the one function
that opens a file."""
from __future__ import annotations

import dataclasses
import importlib
import re
from typing import IO, Any, Mapping

import yaml

from .config import (DEFAULT_NCCL_PROFILES, DEFAULT_PROFILES, LINK_CLASSES, PROVISIONING_CLASSES, Config, ConfigError,
                     HardwareProfile)
from .presets import HOSTNAME_LABEL, PRESETS, Level

def levels_from(spec: Any) -> tuple[Level, ...]:
    """Levels from a preset name or a list of labels / {label, name, link, oversubscription} maps."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ConfigError(f"levels: unknown preset {spec!r}; allowed: auto, {', '.join(sorted(PRESETS))}")
        return PRESETS[spec]
    if not isinstance(spec, list) or not spec:
        raise ConfigError(f"levels: {spec!r} is not a preset name or a non-empty list of node label keys")
    entries = [e if isinstance(e, dict) else {"label": e} for e in spec]
    if entries[-1].get("label") == HOSTNAME_LABEL:
        entries = entries[:-1]  # the node level is always implicit
    defaults = ("leaf", "spine", "zone") + ("cluster",) * len(entries)
    levels = []
    for depth, entry in enumerate(reversed(entries)):
        label = entry.get("label")
        if not isinstance(label, str) or not is_label_key(label) or label == HOSTNAME_LABEL:
            raise ConfigError(f"levels[{len(entries) - 1 - depth}]: {label!r} is not a node label key "
                              f"(an optional DNS subdomain prefix and '/', then a name of letters, digits, "
                              f"'-', '_' and '.'; {HOSTNAME_LABEL} may only be last)")
        link = entry.get("link", defaults[depth])
        if link not in LINK_CLASSES:
            raise ConfigError(f"levels: link {link!r} of {label} is not one of {', '.join(LINK_CLASSES)}")
        where = f"levels[{len(entries) - 1 - depth}]"
        _no_unknown(where, entry, {f.name for f in dataclasses.fields(Level)})
        name = _text(f"{where}.name", entry.get("name", label.rsplit("/", 1)[-1]))
        oversubscription = _number(f"{where}.oversubscription", entry.get("oversubscription", 1.0),
                                   *_LEVEL_OVERSUBSCRIPTION)
        levels.append(Level(label, name, link, oversubscription))
    labels = [lv.label for lv in levels]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"levels: label keys must be unique, got {list(reversed(labels))}")
    return tuple(reversed(levels))


# Bounds of the scalar settings: (type, least, most). Outside them a setting is a mistake (a TTL of
# 0 s would drop every hold at once; a body limit above the apiserver's own 3 MiB is never used).
_SCALARS: Mapping[str, tuple[type, float, float]] = {
    "cluster_oversubscription": (float, 1.0, 1000.0),
    "reservation_ttl_seconds": (float, 1.0, 86400.0),
    "provisional_hold_seconds": (float, 1.0, 300.0),
    "stale_after_seconds": (float, 5.0, 86400.0),
    "protect_waiting_seconds": (float, 0.0, 86400.0),
    "communication_share": (float, 0.0, 1.0),
    "tight_wait_weight": (float, 0.0, 1000.0),
    "tight_wait_seconds": (float, 0.0, 604800.0),
    "tight_wait_cap": (float, 0.0, 1000.0),
    "max_body_bytes": (int, 1024, 3 * 1024 * 1024),
    "preferred_weight": (int, 1, 100),
}
_LEVEL_OVERSUBSCRIPTION: tuple[type, float, float] = (float, 1.0, 1000.0)
_PROFILE_REQUIRED = ("name", "match", "nvlink_gbs", "pcie_gbs", "nic_gbs", "nics_per_node")
_PROFILE_NUMBERS: Mapping[str, tuple[type, float, float]] = {
    "nvlink_gbs": (float, 0.001, 100000.0), "pcie_gbs": (float, 0.001, 100000.0), "nic_gbs": (float, 0.001, 100000.0),
    "nics_per_node": (int, 1, 64), "nvlink_domain_size": (int, 0, 1024),
}
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# As Kubernetes validates them (apimachinery's validation): a DNS-1123 subdomain (scheduler names,
# a label key's prefix) and a qualified name (a label key: an optional prefix, then `/` and a name).
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(text) is not None


def is_label_key(text: str) -> bool:
    prefix, _, name = text.rpartition("/")
    return (len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None
            and (not prefix and "/" not in text or is_dns_subdomain(prefix)))


def _show(value: Any) -> str:
    """The offending value, short enough for one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _no_unknown(where: str, entry: Any, known: set[str]) -> None:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: {_show(entry)} is not a mapping; allowed keys: {', '.join(sorted(known))}")
    unknown = sorted(str(k) for k in set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")


def _number(key: str, value: Any, kind: type, least: float, most: float) -> Any:
    """`value` as `kind` within [least, most]; YAML's `true` or `"5"` is not a number."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not whole):
        noun = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{key}: {_show(value)} is not {noun}; allowed: {noun} from {_plain(least)} to {_plain(most)}")
    if not least <= value <= most:
        raise ConfigError(f"{key}: {_show(value)} is out of range; allowed: {_plain(least)} to {_plain(most)}")
    return kind(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: a non-empty string")
    return value


SCHEDULER_NAME_RULE = "a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 characters"


def _scheduler_name(key: str, value: Any) -> str:
    """A name the webhook writes into pods as schedulerName: what the API would accept there."""
    if not isinstance(value, str) or not is_dns_subdomain(value):
        raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: a scheduler name ({SCHEDULER_NAME_RULE})")
    return value


_YAML11_BOOLEANS = frozenset(("yes", "no", "on", "off", "y", "n"))


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        hint = (" (YAML 1.1's yes/no/on/off are not booleans here)"
                if isinstance(value, str) and value.strip().lower() in _YAML11_BOOLEANS else "")
        raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: true, false{hint}")
    return value


# Profile patterns are searched in every node's product name with Python's backtracking engine, so
# a pattern that can backtrack exponentially ((a+)+$) would stall every admission: patterns are
# parsed once at load and refused unless their worst case stays polynomial and small.
PATTERN_MAX_CHARS = 256
PATTERN_MAX_VARIABLE_REPEATS = 4
PATTERN_RULE = (f"a regular expression of at most {PATTERN_MAX_CHARS} characters with no backreference, no "
                "repeat or alternation (|) inside a repeat that matches more than once (as in (a+)+, (a?){9} or "
                f"(ab|a)*), and at most {PATTERN_MAX_VARIABLE_REPEATS} repeats of variable length (*, +, ?, {{n,m}})")
try:  # the parser `re` compiles with: re._parser since Python 3.11, sre_parse before
    _sre_parser: Any = importlib.import_module("re._parser")
except ImportError:  # pragma: no cover - Python 3.10
    _sre_parser = importlib.import_module("sre_parse")
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _pattern_problem(pattern: str) -> str | None:
    """Why `pattern` could backtrack catastrophically, or None: walks the parsed pattern."""
    if len(pattern) > PATTERN_MAX_CHARS:
        return f"{len(pattern)} characters"
    variable = 0
    # (parsed items, whether they sit inside a repeat that matches more than once)
    stack: list[tuple[Any, bool]] = [(_sre_parser.parse(pattern), False)]
    while stack:
        items, repeated = stack.pop()
        for op, arg in items:
            name = getattr(op, "name", str(op))
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "a backreference"
            if name in _REPEATS:
                least, most, body = arg
                if least != most:
                    variable += 1
                    if repeated:
                        return "a repeat inside a repeat"
                stack.append((body, repeated or most > 1))
            elif name == "BRANCH":
                if repeated:
                    return "an alternation inside a repeat"
                stack.extend((branch, repeated) for branch in arg[1])
            elif name == "SUBPATTERN":
                stack.append((arg[-1], repeated))
            elif name in ("ASSERT", "ASSERT_NOT"):
                stack.append((arg[1], repeated))
            elif name == "ATOMIC_GROUP":
                stack.append((arg, repeated))
    if variable > PATTERN_MAX_VARIABLE_REPEATS:
        return f"{variable} repeats of variable length"
    return None


def _pattern(key: str, value: str) -> str:
    try:
        re.compile(value)
    except re.error as err:
        raise ConfigError(f"{key}: {_show(value)} is not a regular expression ({err})") from None
    problem = _pattern_problem(value)
    if problem:
        raise ConfigError(f"{key}: {_show(value)} is not allowed ({problem}: searching it could take exponential "
                          f"time); allowed: {PATTERN_RULE}")
    return value


def _profile(where: str, entry: Any) -> HardwareProfile:
    fields = {f.name for f in dataclasses.fields(HardwareProfile)}
    _no_unknown(where, entry, fields)
    missing = sorted(f for f in _PROFILE_REQUIRED if f not in entry)
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    values: dict[str, Any] = {"name": _text(f"{where}.name", entry["name"])}
    match = entry["match"] if isinstance(entry["match"], str) else _text(f"{where}.match", entry["match"])
    values["match"] = _pattern(f"{where}.match", match)
    for key, bounds in _PROFILE_NUMBERS.items():
        if key in entry:
            values[key] = _number(f"{where}.{key}", entry[key], *bounds)
    if "estimate" in entry:
        values["estimate"] = _flag(f"{where}.estimate", entry["estimate"])
    return HardwareProfile(**values)


# A value becomes a container's environment: no character that could end or forge a line.
NCCL_VALUE_RULE = ("a string or number without control characters (newline, tab, any other character below U+0020, "
                   "or U+007F)")


def _nccl_profiles(value: Any) -> Mapping[str, Mapping[str, str]]:
    """The NCCL profiles: the built-in ones, each class given replaced whole by its variables."""
    _no_unknown("nccl_profiles", value, set(DEFAULT_NCCL_PROFILES))
    merged = dict(DEFAULT_NCCL_PROFILES)
    for link, variables in value.items():
        where = f"nccl_profiles.{link}"
        if not isinstance(variables, Mapping):
            raise ConfigError(f"{where}: {_show(variables)} is not a mapping of NCCL variables to values")
        for name, setting in variables.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise ConfigError(f"{where}: {_show(name)} is not an environment variable name")
            if isinstance(setting, bool) or not isinstance(setting, (str, int, float)):
                raise ConfigError(f"{where}.{name}: {_show(setting)} is not allowed; allowed: a string or number")
            if _CONTROL.search(str(setting)):
                raise ConfigError(f"{where}.{name}: {_show(setting)} is not allowed; allowed: {NCCL_VALUE_RULE}")
        merged[link] = {name: str(setting) for name, setting in variables.items()}
    return merged


_FLAGS = ("pin_when_waiting", "pin_only_where_locality_pays", "fill_nics", "gate_waits", "refuse_unplaceable")
# The keys a settings file may hold, each read below. Not every Config field is one: `levels_auto`
# follows from `levels: auto`.
FILE_KEYS = frozenset((*_SCALARS, *_FLAGS, "levels", "profiles", "nccl_profiles", "scheduler_names",
                       "default_scheduler", "provisioning_request_class"))


def config_from_mapping(data: Mapping[str, Any]) -> Config:
    """A Config from parsed YAML, every setting checked for its type and bounds; unknown keys are
    errors so typos do not pass silently. Raises ConfigError naming the key, the value and what is
    allowed: a bad file stops start-up instead of failing every admission later."""
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        hint = " (levels_auto follows from levels: auto)" if "levels_auto" in unknown else ""
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}{hint}; allowed: {', '.join(sorted(FILE_KEYS))}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SCALARS:
            values[key] = _number(key, value, *_SCALARS[key])
        elif key == "levels" and value == "auto":
            values["levels_auto"] = True
        elif key == "levels":
            values[key] = levels_from(value)
            values["levels_auto"] = False
        elif key == "profiles":
            if not isinstance(value, list):
                raise ConfigError(f"profiles: {_show(value)} is not a list of hardware profiles")
            values[key] = tuple(_profile(f"profiles[{i}]", p) for i, p in enumerate(value)) + (DEFAULT_PROFILES[-1],)
        elif key == "nccl_profiles":
            values[key] = _nccl_profiles(value)
        elif key == "scheduler_names":
            if not isinstance(value, list):
                raise ConfigError(f"scheduler_names: {_show(value)} is not a list of scheduler names")
            values[key] = tuple(_scheduler_name(f"scheduler_names[{i}]", name) for i, name in enumerate(value))
        elif key == "default_scheduler":
            values[key] = _scheduler_name(key, value)
        elif key == "provisioning_request_class":
            if value not in ("", *PROVISIONING_CLASSES):
                raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: an empty string (none), "
                                  + ", ".join(PROVISIONING_CLASSES))
            values[key] = value
        elif key in _FLAGS:
            values[key] = _flag(key, value)
        else:  # pragma: no cover - every key of FILE_KEYS has its branch above
            raise AssertionError(f"setting {key} is accepted but not read")
    return Config(**values)


class SettingsLoader(yaml.SafeLoader):
    """YAML as PyYAML's safe loader reads it, but with YAML 1.2's booleans: only true and false (any
    case). YAML 1.1's yes/no/on/off/y/n stay strings, which a boolean setting refuses with a hint,
    instead of `on` quietly reading as true."""

    yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
                               for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


SettingsLoader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                     re.compile(r"^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"), list("tTfF"))


def read_settings(stream: str | IO[str]) -> Any:
    """The YAML of a settings file, read by SettingsLoader: every reader of settings goes through here."""
    return yaml.load(stream, Loader=SettingsLoader)  # a SafeLoader: builds plain data only


def load_config(path: str | None) -> Config:
    if not path:
        return Config()
    try:
        with open(path, encoding="utf-8") as handle:
            data = read_settings(handle) or {}
    except OSError as err:
        raise ConfigError(f"config file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text; expected a YAML mapping of settings") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings")
    return config_from_mapping(data)
