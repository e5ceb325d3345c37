#!/usr/bin/env bash
# What the browser test (tests/frontend/test_browser.py, marked `browser`) needs beyond `pip install -e ".[dev]"`:
# Debian's chromium package. The playwright Python package drives it through executable_path
# (/usr/bin/chromium); no browser is ever downloaded. Without chromium the test skips.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    /usr/bin/chromium --version
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
/usr/bin/chromium --version
