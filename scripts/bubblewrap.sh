# Sourced by scripts/test.sh and scripts/demo.sh: the sandbox (bubblewrap) that every build and run
# of a candidate goes through. Where the system has none, Debian's package is unpacked into the
# virtual environment (no root needed to unpack) and put on PATH.
if ! command -v bwrap >/dev/null && [[ ! -x .venv/bubblewrap/usr/bin/bwrap ]]; then
    download=$(mktemp -d)
    (cd "$download" && { apt-get download bubblewrap >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && apt-get download bubblewrap >/dev/null 2>&1; }; }) || true
    if compgen -G "$download/bubblewrap_*.deb" >/dev/null; then
        dpkg -x "$download"/bubblewrap_*.deb .venv/bubblewrap
    fi
    rm -rf "$download"
fi
if [[ -x .venv/bubblewrap/usr/bin/bwrap ]]; then
    export PATH="$PWD/.venv/bubblewrap/usr/bin:$PATH"
fi
