"""Every LLM exchange of a run, stored content-addressed, and the client that replays them.

    <run_dir>/llm/
        exchanges/<hash>.json   request body + response + label, turn, latency, attempts
        index.jsonl             one line per exchange, in the order they happened

``<hash>`` is the SHA-256 of the canonical JSON of the request body: the same request is stored
once, and a replay finds its answer by hashing the request it is about to send. Only the body is
stored, never headers: the API key travels in the ``Authorization`` header and so never reaches
the disk. A replayed request that is not byte-identical (a tool's output that changed between
runs, such as a measured time) is answered by its conversation's label and turn instead, and
marked ``drifted``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agents.llm.accounting import TokenBudget
from agents.llm.client import ChatClient, ChatRequest, Completion, EndpointError
from cluster.config.agents import LLMSpec
from cluster.store.rundir import RunDir

LLM_DIR = RunDir.LLM  # the run directory's layout is cluster.store.rundir's


def request_hash(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ExchangeStore:
    """The exchanges under ``root`` (a run directory's ``llm/``); safe to share between threads."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

    @classmethod
    def of_run(cls, run_dir: str | Path) -> ExchangeStore:
        return cls(Path(run_dir) / LLM_DIR)

    def path(self, key: str) -> Path:
        return self.root / "exchanges" / f"{key}.json"

    def put(self, body: dict[str, Any], response: dict[str, Any], *, label: str = "", turn: int = 0,
            latency_s: float = 0.0, attempts: int = 1) -> str:
        """Store one exchange; returns its hash. A request stored before keeps its first answer."""
        key = request_hash(body)
        record = {"hash": key, "label": label, "turn": turn, "latency_s": latency_s, "attempts": attempts,
                  "stored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "request": body, "response": response}
        usage = response.get("usage") or {}
        line = {"hash": key, "label": label, "turn": turn, "latency_s": round(latency_s, 6),
                "tokens_in": usage.get("prompt_tokens"), "tokens_out": usage.get("completion_tokens")}
        with self._lock:
            target = self.path(key)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_atomic(target, json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False))
            with (self.root / "index.jsonl").open("a") as index:
                index.write(json.dumps(line, sort_keys=True) + "\n")
        return key

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(key).read_text())
        except FileNotFoundError:
            return None

    def index(self) -> list[dict[str, Any]]:
        """The index lines, oldest first."""
        try:
            text = (self.root / "index.jsonl").read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def by_label(self) -> dict[tuple[str, int], str]:
        """(label, turn) -> the hash of the first exchange stored for them."""
        out: dict[tuple[str, int], str] = {}
        for line in self.index():
            if line.get("label"):
                out.setdefault((line["label"], int(line["turn"])), line["hash"])
        return out


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class ReplayChat(ChatClient):
    """Answers from a store, never from an endpoint: a sweep replayed offline, for an audit or to
    rerun the verification and measurement of the same proposals."""

    def __init__(self, spec: LLMSpec, store: ExchangeStore, budget: TokenBudget | None = None) -> None:
        self.spec, self.store, self.budget = spec, store, budget
        self._labels = store.by_label()
        self.replayed = 0
        self.drifted = 0  # answered by label and turn: the request was not the stored one

    def complete(self, request: ChatRequest) -> Completion:
        if self.budget is not None:
            self.budget.check()
        body = request.body(self.spec)
        key = request_hash(body)
        record = self.store.get(key)
        drifted = False
        if record is None and (fallback := self._labels.get((request.label, request.turn))):
            record, drifted = self.store.get(fallback), True
        if record is None:
            raise EndpointError(f"replay: no stored exchange for request {key[:16]} "
                                f"(conversation {request.label!r}, turn {request.turn})")
        completion = Completion.from_response(record["response"], float(record.get("latency_s", 0.0)), self.spec,
                                              record["hash"], replayed=True, drifted=drifted)
        self.replayed += 1
        self.drifted += drifted
        if self.budget is not None:
            self.budget.charge(completion.usage)
        return completion
