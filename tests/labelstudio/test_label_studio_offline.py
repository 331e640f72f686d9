"""Label Studio as sense7 starts it calls nothing outside this machine: `label-studio start` otherwise asks
pypi.org for its latest version (a call out at run time, which waits up to 10 s where there is no network)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.labelstudio


def test_label_studio_started_by_sense7_never_asks_pypi_for_its_version(label_studio):
    log = label_studio.settings.home / "logs" / "label-studio.log"
    assert label_studio.client.projects.list() is not None  # started and answering
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "/health" in text  # Label Studio's own log, with the requests it served
    assert "pypi.org" not in text
