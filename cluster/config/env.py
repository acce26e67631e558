"""Every environment variable warpfleet reads, read here and only here.

- ``WARPFLEET_SCRATCH``: where a node's scratch directories (builds, runs) go; default: the system's
  temporary directory. A relative path is taken from the working directory of the process that
  reads it and made absolute, since builds and runs change their working directory.
- ``RAY_ADDRESS``: the Ray cluster to join when neither ``--address`` nor ``cluster.address`` names
  one, as Ray's own tools take it (``ray job submit`` sets it for the job it starts): ``ray_address``.
- ``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``: Ray's token authentication;
  ``token_auth_wanted`` says whether joining a cluster should turn it on.
- The variable an LLM spec's ``api_key_env`` names: ``api_key``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SCRATCH = "WARPFLEET_SCRATCH"
RAY_ADDRESS = "RAY_ADDRESS"
RAY_AUTH_MODE = "RAY_AUTH_MODE"
RAY_AUTH_TOKEN = "RAY_AUTH_TOKEN"
RAY_AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
RAY_TOKEN_FILE = Path("~/.ray/auth_token")  # where `ray start` keeps a generated token


def scratch_root(environ: Mapping[str, str] = os.environ) -> Path | None:
    """``WARPFLEET_SCRATCH`` as an absolute path, or None when unset or empty."""
    root = environ.get(SCRATCH, "").strip()
    return Path(root).expanduser().absolute() if root else None


def ray_address(environ: Mapping[str, str] = os.environ) -> str | None:
    """``RAY_ADDRESS``, or None when unset or empty (Ray too ignores an empty one)."""
    return environ.get(RAY_ADDRESS, "").strip() or None


def token_auth_wanted(address: str | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to set ``RAY_AUTH_MODE=token`` before joining ``address``: a cluster is named, the mode
    is not set, and a token is at hand (Ray 2.60 sends one to an explicit address only when told)."""
    if not address or RAY_AUTH_MODE in environ:
        return False
    return RAY_AUTH_TOKEN in environ or RAY_AUTH_TOKEN_PATH in environ or RAY_TOKEN_FILE.expanduser().is_file()


def api_key(variable: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The value of the variable that holds an API key; None when it is unset or empty."""
    return environ.get(variable) or None
