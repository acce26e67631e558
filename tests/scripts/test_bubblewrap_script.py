"""scripts/bubblewrap.sh sourced from another folder: it unpacks into the repository's .venv and puts
that bwrap on PATH, whatever the caller's working directory. apt-get and dpkg are stand-ins that
make a package and unpack it the way dpkg-deb does (the target's parent must exist)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bubblewrap.sh"

APT_GET = """#!/usr/bin/env bash
[[ "$1" == download ]] && touch bubblewrap_0.4.deb
"""
DPKG = """#!/usr/bin/env bash
# dpkg -x DEB DIR: creates DIR but not its parents, as dpkg-deb does
[[ -d "$3" ]] || mkdir "$3" || { echo "dpkg-deb: failed to create directory" >&2; exit 2; }
mkdir -p "$3/usr/bin" && printf '#!/bin/sh\\n' >"$3/usr/bin/bwrap" && chmod +x "$3/usr/bin/bwrap"
"""


@pytest.mark.skipif(shutil.which("bwrap", path="/usr/bin:/bin") is not None,
                    reason="the system's bwrap is used; nothing is unpacked")
def test_sourced_from_another_folder_unpacks_into_the_repository(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".venv").mkdir()
    shutil.copy(SCRIPT, repo / "scripts" / "bubblewrap.sh")
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name, body in {"apt-get": APT_GET, "dpkg": DPKG}.items():
        (fakes / name).write_text(body)
        (fakes / name).chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        ["bash", "-c", f"source {repo}/scripts/bubblewrap.sh && command -v bwrap"],
        capture_output=True, text=True, cwd=elsewhere, timeout=60, check=False,
        env={"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.stderr == ""
    assert done.stdout.strip() == str(repo / ".venv" / "bubblewrap" / "usr" / "bin" / "bwrap")
    assert not (elsewhere / ".venv").exists()
