# Sourced by scripts/test.sh and scripts/demo.sh: the sandbox (bubblewrap) that every build and run
# of a candidate goes through. Where the system has none, Debian's package is unpacked into the
# virtual environment (no root needed to unpack) and put on PATH.
# Paths are the repository's, found from this file, so that it may be sourced from any folder.
_wf_bubblewrap=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bubblewrap
if ! command -v bwrap >/dev/null && [[ ! -x $_wf_bubblewrap/usr/bin/bwrap ]]; then
    download=$(mktemp -d)
    (cd "$download" && { apt-get download bubblewrap >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && apt-get download bubblewrap >/dev/null 2>&1; }; }) || true
    if compgen -G "$download/bubblewrap_*.deb" >/dev/null; then
        mkdir -p "$_wf_bubblewrap" && dpkg -x "$download"/bubblewrap_*.deb "$_wf_bubblewrap"
    fi
    rm -rf "$download"
fi
if [[ -x $_wf_bubblewrap/usr/bin/bwrap ]]; then
    export PATH="$_wf_bubblewrap/usr/bin:$PATH"
fi
unset _wf_bubblewrap
