"""Reading configs: YAML in, typed values out. Parsing happens here and only here; every later
stage receives ``RunPlan``/``Target`` values. Any problem raises ``ConfigError`` with one line naming
the file and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from cluster.config.kernel import kernel_target_problem
from cluster.config.run import RunConfig, RunPlan
from cluster.config.target import (
    BUILD_PLACEHOLDERS,
    HEADER_SUFFIXES,
    RUN_PLACEHOLDERS,
    Target,
    TargetSpec,
    _Model,
    shared_build_problem,
)
from cluster.core.errors import ConfigError
from cluster.core.placeholders import names_in
from cluster.core.types import SourceBundle
from cluster.toolchains import get_toolchain
from search_spaces import FlagSpace, compile_constraint, evaluate_constraint, load_space

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a run config or target file; YAML parses at about 3 MB/s


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error: the last one would win
    unseen (``trials: 8`` ... ``trials: 800``). Merge keys (``<<``) may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the constructor's own error follows
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(path, "", f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MB: not a config file")
        data = yaml.load(raw.decode(), Loader=_UniqueKeys)  # a SafeLoader
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "", f"cannot be read ({exc})") from None
    except RecursionError:
        raise ConfigError(path, "", "nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise ConfigError(path, where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(path, "", "must be a mapping of fields")
    return data


def _validate(model: type[_Model], data: dict[str, Any], path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        if kind := _other_kind(model, data):
            raise ConfigError(path, "", kind) from None
        errors = exc.errors()
        # An unknown field first: a misspelt one (`tagets:`) leaves the field it meant missing too.
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), _fields_at(model, err["loc"][:-1]), n=1)
            message = f"unknown field (did you mean {close[0]}?)" if close else "unknown field"
        raise ConfigError(path, _field_path(err["loc"]), message) from None


def _other_kind(model: type[_Model], data: dict[str, Any]) -> str:
    """What to say when a target file is given where a run config is expected, or back; else ""."""
    if model is RunConfig and "targets" not in data and {"sources", "kernel"} & set(data):
        return ("a target file, not a run config: list it under a run config's targets: "
                "(warpfleet optimize takes a target file)")
    if model is TargetSpec and "targets" in data:
        return "a run config, not a target file: warpfleet sweep and validate take it"
    return ""


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The names of the fields at ``loc`` (a validation error's, below ``model``); [] where no model is."""
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list
        field = model.model_fields.get(part)
        nested = [t for t in _types(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)] \
            if field else []
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)


def _types(annotation: Any) -> Iterator[Any]:
    yield annotation
    for arg in get_args(annotation):
        yield from _types(arg)


def load_target(path: str | Path) -> Target:
    """Load and check a target file, reading its sources and files into a bundle."""
    path = Path(path)
    spec: TargetSpec = _validate(TargetSpec, _read_yaml(path), path)
    try:
        toolchain = get_toolchain(spec.toolchain)
    except KeyError as exc:
        raise ConfigError(path, "toolchain", str(exc.args[0])) from None
    try:
        space = load_space(spec.space or toolchain.name, base=path.parent)
    except (KeyError, ValueError) as exc:
        raise ConfigError(path, "space", str(exc.args[0])) from None
    roots = _shared_roots(spec, path)
    files = []
    for field, names in (("sources", spec.sources), ("files", spec.files)):
        for i, name in enumerate(names):
            file = path.parent / name
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ConfigError(path, f"{field}[{i}]", "must be a path inside the target's folder")
            if not file.is_file():
                raise ConfigError(path, f"{field}[{i}]", f"file not found: {file}")
            _check_inside(path, f"{field}[{i}]", file, roots)
            files.append((name, file.read_bytes()))
    if all(Path(name).suffix.lower() in HEADER_SUFFIXES for name in spec.sources):
        raise ConfigError(path, "sources", "only headers: name at least one file the compiler builds")
    _check_commands(spec, path, toolchain.default_build)
    space = _with_baseline(space, spec.baseline_flags, path)
    for name, value in spec.defaults.items():
        if name not in spec.params:
            raise ConfigError(path, f"defaults.{name}", "is not a param")
        if value not in spec.params[name]:
            raise ConfigError(path, f"defaults.{name}", f"{value!r} is not one of the param's values")
    target = Target(spec, str(path), SourceBundle(tuple(files)), space)
    for i, expr in enumerate(spec.constraints):
        try:
            compile_constraint(expr, spec.params)
            holds = evaluate_constraint(expr, spec.params, target.baseline_params)
        except ValueError as exc:
            raise ConfigError(path, f"constraints[{i}]", str(exc)) from None
        if not holds:
            raise ConfigError(path, "defaults", f"the baseline's params violate the constraints ({expr})")
    if spec.runner == "persistent" and (problem := shared_build_problem(spec)):
        raise ConfigError(path, "runner", f"persistent needs a shared-library build: {problem}")
    if spec.kernel is not None and (problem := kernel_target_problem(spec.kernel, spec.params, spec.files,
                                                                     target.baseline_params)):
        raise ConfigError(path, *problem)
    return target


def _with_baseline(space: FlagSpace, baseline: dict[str, str], path: Path) -> FlagSpace:
    """The space with each flag of ``baseline`` given that option first: the baseline's."""
    flags = dict(space.flags)
    for name, option in baseline.items():
        if name not in flags:
            raise ConfigError(path, f"baseline_flags.{name}",
                              f"not a flag of space {space.name} (flags: {', '.join(flags)})")
        if option not in flags[name]:
            known = ", ".join(repr(o) for o in flags[name])
            raise ConfigError(path, f"baseline_flags.{name}", f"{option!r} is not one of its options ({known})")
        flags[name] = (option, *(o for o in flags[name] if o != option))
    return dataclasses.replace(space, flags=flags) if baseline else space


def _shared_roots(spec: TargetSpec, path: Path) -> list[Path]:
    """The target's folder and the ``shared`` folders beside it: where its files may really be."""
    folder = path.parent.resolve()
    roots = [folder]
    for i, name in enumerate(spec.shared):
        shared = (path.parent / name).resolve()
        if Path(name).is_absolute() or not shared.is_dir() or folder.is_relative_to(shared):
            raise ConfigError(path, f"shared[{i}]", "must be a folder beside the target's (../common), "
                              "not an absolute path or one of its parents")
        roots.append(shared)
    return roots


def _check_inside(path: Path, field: str, file: Path, roots: list[Path]) -> None:
    """A target's files stay in its folder (or a ``shared`` one), symbolic links followed: a source
    linked to /etc/shadow would be shipped to every node and echoed by the compiler into the results."""
    real = file.resolve()
    if not any(real.is_relative_to(root) for root in roots):
        raise ConfigError(path, field, f"leaves the target's folder through a symbolic link (to {real})")


def _check_commands(spec: TargetSpec, path: Path, default_build: tuple[str, ...]) -> None:
    params = set(spec.params)
    checks = [("build", spec.build or list(default_build), BUILD_PLACEHOLDERS),
              ("run", spec.run, RUN_PLACEHOLDERS)]
    if spec.verify.test:
        checks.append(("verify.test", spec.verify.test, RUN_PLACEHOLDERS))
    if spec.verify.sanitize_run:
        checks.append(("verify.sanitize_run", spec.verify.sanitize_run, RUN_PLACEHOLDERS))
    for field, template, allowed in checks:
        for i, arg in enumerate(template):
            unknown = names_in([arg]) - allowed - params
            if unknown:
                known = ", ".join(sorted(allowed | params))
                raise ConfigError(path, f"{field}[{i}]",
                                  f"unknown placeholder {{{sorted(unknown)[0]}}} (known: {known})")


def load_run(path: str | Path) -> RunPlan:
    """Load a run config and every target it names (paths relative to the config file)."""
    path = Path(path)
    config: RunConfig = _validate(RunConfig, _read_yaml(path), path)
    targets = []
    for i, name in enumerate(config.targets):
        target_path = path.parent / name
        if not target_path.is_file():
            raise ConfigError(path, f"targets[{i}]", f"file not found: {target_path}")
        targets.append(load_target(target_path))
    if config.search.storage and (problem := _storage_problem(config.search.storage)):
        raise ConfigError(path, "search.storage", problem)
    objective = config.search.objective
    for target in targets:
        if objective != "time" and get_toolchain(target.spec.toolchain).device_kind != "gpu":
            raise ConfigError(path, "search.objective",
                              f"{objective} needs GPU workers (NVML energy); target {target.name} runs on a CPU")
    seen: dict[str, int] = {}
    for i, target in enumerate(targets):
        if target.name in seen:
            raise ConfigError(path, f"targets[{i}]", f"a second target named {target.name!r}")
        seen[target.name] = i
    return RunPlan(config, str(path), tuple(targets))


def _storage_problem(url: str) -> str:
    """Why Optuna could not open the database ``url`` names ("" when it looks as if it could): not
    a URL, a driver not installed, an SQLite file in a folder that does not exist. Said now, before
    a run directory is made; a server that is down is still found out when the sweep opens it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return "not a database URL (sqlite:///FILE, postgresql://USER@HOST/DB, ...)"
    shown = parsed.render_as_string(hide_password=True)
    try:
        parsed.get_dialect().import_dbapi()
    except (NoSuchModuleError, ImportError) as exc:
        return f"{shown}: its database driver is not installed ({exc})"
    database = parsed.database or ""
    if parsed.get_backend_name() == "sqlite" and database not in ("", ":memory:") \
            and not database.startswith("file:") and not Path(database).absolute().parent.is_dir():
        return f"{shown}: the folder of {database} does not exist"
    return ""
