"""Named compiler-flag spaces, kept as YAML files beside this module.

A space maps each flag to its options; an option is the text added to the compiler's command
line (split like a shell would split it, but never run by one), ``""`` meaning "leave unset".
The first option of every flag is the baseline's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

SPACES_DIR = Path(__file__).parent
MAX_SPACE_BYTES = 1024 * 1024
MAX_OPTIONS = 1000  # per flag


@dataclass(frozen=True)
class FlagSpace:
    name: str
    toolchain: str
    flags: dict[str, tuple[str, ...]]

    @property
    def baseline(self) -> dict[str, str]:
        return {name: options[0] for name, options in self.flags.items()}


def available_spaces() -> list[str]:
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def load_space(name_or_path: str, base: Path | None = None) -> FlagSpace:
    """A space by name (``nvcc``, ``cc``) or by path (relative to ``base``).

    Raises KeyError for an unknown name, ValueError for a malformed file.
    """
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = SPACES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise KeyError(f"unknown space {name_or_path!r} (known: {', '.join(available_spaces())})")
    elif base is not None and not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise KeyError(f"space file not found: {path}")
    if path.stat().st_size > MAX_SPACE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_SPACE_BYTES // 1024} KB: not a flags space")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: not valid YAML ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("flags"), dict):
        raise ValueError(f"{path}: needs a 'flags' mapping")
    flags: dict[str, tuple[str, ...]] = {}
    for flag, options in data["flags"].items():
        if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
            raise ValueError(f"{path}: flags.{flag}: needs a non-empty list of option strings")
        if len(options) > MAX_OPTIONS or len(set(options)) != len(options):
            raise ValueError(f"{path}: flags.{flag}: at most {MAX_OPTIONS} options, each once")
        for option in options:
            try:
                shlex.split(option)  # fails early on unbalanced quotes
            except ValueError as exc:
                raise ValueError(f"{path}: flags.{flag}: {option!r}: {exc}") from None
        flags[str(flag)] = tuple(options)
    return FlagSpace(str(data.get("name", path.stem)), str(data.get("toolchain", path.stem)), flags)
