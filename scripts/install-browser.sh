#!/usr/bin/env bash
# Installs Debian's Chromium for the report/web-view browser tests (Playwright drives it via executable_path;
# `playwright install` would download its own browser build, which this environment cannot fetch).
# Idempotent: does nothing when /usr/bin/chromium is already there. Needs root (or sudo) for apt-get.
set -euo pipefail

CHROMIUM="${NNFORGE_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    echo "chromium: $("$CHROMIUM" --version 2>/dev/null || echo present) ($CHROMIUM)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install-browser.sh: need root to apt-get install chromium (browser tests will be skipped)" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium
echo "chromium: $("$CHROMIUM" --version)"
