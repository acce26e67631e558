"""The ReAct loop of a tool-calling agent: ask the model, run the tools it calls, give it their
results, until it calls a final tool or the step limit comes.

    system + user ─► complete ─► tool calls ─► Toolbox.call ─► tool messages ─► complete ─► ...
                              └► a final tool accepted ─► ReactResult(final)
                              └► plain text: parsed as the final tool's JSON if it is one, else told to use the tools

Nothing here raises: an endpoint that fails, a spent budget or the step limit is a result with
``error``, and what the conversation cost so far is in its ``usage``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agents.llm.accounting import BudgetExhausted, Usage
from agents.llm.client import ChatClient, ChatRequest, EndpointError, Message
from agents.llm.tools import Session, Toolbox


@dataclass(frozen=True)
class ReactResult:
    final: Any  # what the final tool stored; None when the conversation ended without one
    finished: bool
    usage: Usage
    exchanges: tuple[str, ...]
    steps: int
    messages: tuple[Message, ...]
    error: str = ""  # why there is no final answer
    drifted: bool = False  # a replayed answer was found by label, not by the exact request


_FENCED = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.DOTALL)


def _json_in(text: str) -> str | None:
    """A JSON object in a plain-text answer: fenced, or the whole text."""
    fenced = _FENCED.search(text)
    candidate = fenced.group(1) if fenced else text.strip()
    if not candidate.startswith("{"):
        return None
    try:
        json.loads(candidate)
    except ValueError:
        return None
    return candidate


def react(chat: ChatClient, session: Session, toolbox: Toolbox, system: str, user: str, *, label: str,
          max_steps: int, final_from_text: str | None = None) -> ReactResult:
    """Run one conversation. ``final_from_text`` names the final tool that a plain JSON answer is
    handed to (models that answer in text instead of calling it)."""
    messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    usage, exchanges, drifted = Usage(), [], False
    finals = [t.name for t in toolbox.tools if t.final]

    def result(error: str = "", steps: int = 0) -> ReactResult:
        return ReactResult(session.final if session.finished else None, session.finished, usage, tuple(exchanges),
                           steps, tuple(messages), error, drifted)

    for step in range(1, max_steps + 1):
        try:
            completion = chat.complete(ChatRequest(tuple(messages), toolbox.schemas(), label))
        except (EndpointError, BudgetExhausted) as exc:
            return result(str(exc), step - 1)
        usage = usage + completion.usage
        drifted = drifted or completion.drifted
        if completion.exchange:
            exchanges.append(completion.exchange)
        messages.append(completion.message())
        for call in completion.tool_calls:
            content = ("ignored: the conversation already finished" if session.finished
                       else toolbox.call(session, call.name, call.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if session.finished:
            return result(steps=step)
        if completion.tool_calls:
            continue
        text = completion.content or ""
        as_json = _json_in(text) if final_from_text else None
        if as_json is not None and final_from_text is not None:
            answer = toolbox.call(session, final_from_text, as_json)
            if session.finished:
                return result(steps=step)
            messages.append({"role": "user", "content": f"{answer}\nFix it and call {final_from_text}."})
        else:
            messages.append({"role": "user", "content": "Use the tools; when you are done, call "
                             + " or ".join(finals) + "."})
    return result(f"step limit of {max_steps} model calls reached without a final answer", max_steps)
