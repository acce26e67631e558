"""The sandboxes a candidate's command may run in, for the tests that run one in each."""

from __future__ import annotations

import pytest

from cluster.config import SandboxSpec
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.sandbox import SandboxError, Unsandboxed


@pytest.fixture(params=["bwrap", "bare"])
def sandbox(request):
    """bubblewrap with small limits (skipped where it cannot start), and no sandbox at all."""
    if request.param == "bare":
        return Unsandboxed()
    try:
        return start_bubblewrap(SandboxSpec(pids=64, memory_mb=1024))
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
