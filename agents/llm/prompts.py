"""System prompts, loaded at run time from editable Markdown files: ``agents/prompts/``, shipped
in the package (``DEFAULT_PROMPTS``), or the folder that ``llm.prompts_dir`` names.

    _base.md            rules every agent gets (tools, read-only regions, answers)
    <optimization>.md   an introduction, then one ``## <step>`` section per step (analyse, plan,
                        transform, review) and ``## examples`` (few-shot), appended to every step

A prompt for (optimization, step) is _base.md + the introduction + the step's section + the
examples. ``{{name}}`` placeholders are filled from ``values`` (a custom optimization's text spec).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

STEPS = ("analyse", "plan", "transform", "review")
_HEADING = re.compile(r"^## +(\w+)\s*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# Package data (pyproject.toml), so that an installed warpfleet finds them as a checkout does.
DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "prompts"


class Prompts:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else DEFAULT_PROMPTS

    def sections(self, name: str) -> dict[str, str]:
        """A prompt file's parts: "" (the introduction) and each ``## heading``'s text."""
        path = self.root / f"{name}.md"
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise FileNotFoundError(f"no prompt file {path} (one per optimization under the prompts directory)") \
                from None
        parts = _HEADING.split(text)
        out = {"": parts[0].strip()}
        for heading, body in zip(parts[1::2], parts[2::2], strict=True):
            out[heading.lower()] = body.strip()
        return out

    def system(self, name: str, step: str, values: Mapping[str, str] | None = None) -> str:
        if step not in STEPS:
            raise ValueError(f"unknown step {step!r} (steps: {', '.join(STEPS)})")
        base = self.sections("_base")
        own = self.sections(name)
        if step not in own:
            raise KeyError(f"{self.root / (name + '.md')} has no '## {step}' section")
        parts = [base[""], base.get(step, ""), own[""], own[step]]
        if own.get("examples"):
            parts.append("Examples:\n\n" + own["examples"])
        text = "\n\n".join(part for part in parts if part)
        values = values or {}

        def fill(match: re.Match[str]) -> str:
            if match.group(1) not in values:
                raise KeyError(f"prompt {name}.md needs a value for {{{{{match.group(1)}}}}}")
            return values[match.group(1)]

        return _PLACEHOLDER.sub(fill, text)

    def check(self, name: str, values: Mapping[str, str] | None = None) -> None:
        """Load every step's prompt once, so that a missing file or section fails before a sweep."""
        for step in STEPS:
            self.system(name, step, values)
