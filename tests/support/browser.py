"""Chromium for the browser tests (Debian's build, driven by Playwright): where it is, how it starts, where
screenshots go, and the skip mark when it is absent."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


NEEDS_CHROMIUM = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason="Debian's chromium is not installed (./run test and .ci/run install it)")
