"""Chromium for the browser tests (Debian's build, driven by Playwright): where it is, how it starts, where
screenshots go, and the skip mark when it is absent."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


NEEDS_CHROMIUM = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason="Debian's chromium is not installed (./run test and .ci/run install it)")


@contextmanager
def chromium():
    """A headless Chromium for one test (screenshots go to ARTIFACTS), closed when the block ends."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def answer_questionnaire(page, taxonomy, traits: dict | None = None) -> None:
    """Answer the rater page's questionnaire (each field's first choice, or the value `traits` gives it) and
    save it."""
    for field in taxonomy.profile_fields:
        radios = f"fieldset[data-control={field.key}] input"
        if traits is None:
            page.locator(f"{radios}[type=radio]").first.check()
        else:
            page.locator(f"{radios}[value='{traits[field.key]}']").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Save and continue").click()
