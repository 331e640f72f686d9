"""The rater page shows the study's taxonomy in the same order and words as the Label Studio template
(both are rendered from the one taxonomy file), for the packaged taxonomy and a custom 7-point one."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from sense7.rater_page.app import create_app
from sense7.settings import Settings
from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.taxonomy import load_taxonomy, render_profile_config, render_rating_config


class Visible(HTMLParser):
    """Headings, legends, definitions and the comment label in document order; radio names and values."""

    WANTED = {"h2", "legend", "p", "label"}

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []
        self.radios: list[tuple[str, str]] = []
        self._open: str | None = None
        self._buffer: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and attrs.get("type") == "radio":
            self.radios.append((attrs["name"], attrs["value"]))
        classes = (attrs.get("class") or "").split()
        if tag in ("h2", "legend") or (tag == "p" and "definition" in classes) or \
                (tag == "label" and "comment" in classes):
            self._open, self._buffer = tag, []

    def handle_data(self, data):
        if self._open:
            self._buffer.append(data)

    def handle_endtag(self, tag):
        if self._open == tag:
            self.texts.append("".join(self._buffer).strip())
            self._open = None


def _page(tmp_path, tax, kind: str) -> Visible:
    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home")})
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    RaterQueue(store).replace("r1", [
        {"task_id": 11, "kind": "profile", "position": -1, "conversation_id": None, "turn_index": None,
         "data": {}, "prediction": None, "answer": None},
        {"task_id": 12, "kind": "rating", "position": 0, "conversation_id": "c1", "turn_index": 1,
         "data": {"history": [{"role": "user", "content": "hello"}],
                  "turn": [{"role": "assistant", "content": "hi there"}]}, "prediction": None, "answer": None}])
    token = LinkBook(store).issue("r1")
    app = create_app(settings, taxonomy=tax, store=store)
    client = app.test_client()
    assert client.get(f"/r/{token}").status_code == 303
    html = client.get("/task/12" if kind == "rating" else "/profile").get_data(as_text=True)
    parser = Visible()
    parser.feed(html)
    return parser


@pytest.fixture(params=["packaged", "seven-point"])
def taxonomy(request, tmp_path):
    if request.param == "packaged":
        return load_taxonomy()
    return load_taxonomy(request.getfixturevalue("seven_point_taxonomy"))


def test_rating_page_matches_the_label_studio_template(tmp_path, taxonomy):
    root = ET.fromstring(render_rating_config(taxonomy).split("-->", 1)[1])
    headers = [h.get("value") for h in root.iter("Header")]
    # The template's definition header is "definition  1: low  N: high" (the overall one: the definition).
    page = _page(tmp_path, taxonomy, "rating")
    assert page.texts == headers
    ratings = [(r.get("name"), str(level)) for r in root.iter("Rating")
               for level in range(1, int(r.get("maxRating")) + 1)]
    choices = [(c.get("name"), ch.get("value")) for c in root.iter("Choices") for ch in c.iter("Choice")]
    assert page.radios == ratings + choices


def test_profile_page_matches_the_questionnaire_template(tmp_path, taxonomy):
    root = ET.fromstring(render_profile_config(taxonomy).split("-->", 1)[1])
    questions = [h.get("value") for h in root.iter("Header")][1:]  # the first is the page's title
    page = _page(tmp_path, taxonomy, "profile")
    assert page.texts == questions
    assert page.radios == [(c.get("name"), ch.get("value")) for c in root.iter("Choices") for ch in c.iter("Choice")]
