"""Every LLM exchange of a run, stored content-addressed (``agents.llm.replay`` answers from them).

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

# The run directory's llm/ folder: cluster.store.rundir.RunDir.LLM names the same (a test checks), but
# the agents sit below the store and cannot import it.
LLM_DIR = "llm"


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

