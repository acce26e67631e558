"""The core value types: a source bundle's hash, read many times an iteration of the driver's loop."""

from __future__ import annotations

import hashlib
import pickle

import pytest

from cluster.core.types import SourceBundle


def test_a_bundles_hash_is_computed_once_and_travels_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = SourceBundle((("work.c", b"int main() { return 0; }\n"), ("data/in.bin", b"\0" * 4096)))
    first = bundle.hash
    assert len(first) == 16 and first == SourceBundle(tuple(reversed(bundle.files))).hash  # the order is not part
    assert first != SourceBundle((("work.c", b"int main() { return 1; }\n"),)).hash
    calls = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: calls.append(a) or real(*a))
    assert bundle.hash == first and calls == []  # not read again from the files
    copy = pickle.loads(pickle.dumps(bundle))  # as Ray carries it to a worker
    assert copy == bundle and copy.hash == first and calls == []
