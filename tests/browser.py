"""Debian's headless Chromium, driven through Playwright (``apt-get install chromium``; the
test extra brings Playwright): the MLflow UI's and the documentation site's tests open their
pages in it."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# No sandbox (tests run as root in containers), no GPU, and none of Chromium's own traffic
# (updates, sync, background fetches): the machines that run the suite may be offline.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]  # fmt: skip
