"""Webhook payloads as sense7.labelstudio.protocol reads them (the jobs' on_event only notes what they name)."""

from __future__ import annotations

import pytest

from sense7.labelstudio.protocol import WEBHOOK_ACTIONS, MalformedEvent, parse_annotation_event, user_id


def test_every_listened_action_is_parsed_with_its_project_and_tasks():
    single = {"project": {"id": 4}, "annotation": {"id": "12", "task": {"id": 7}}}
    many = {"project": 4, "annotations": [{"id": 12, "task": 7}, {"id": 13}]}
    for action in WEBHOOK_ACTIONS:
        event = parse_annotation_event(action, single if action.startswith("ANNOTATION_") else many)
        assert event.project == 4
        assert event.annotations == ([(12, 7)] if action.startswith("ANNOTATION_") else [(12, 7), (13, None)])
        assert event.deletes == (action == "ANNOTATIONS_DELETED")


@pytest.mark.parametrize("action,payload", [
    ("ANNOTATION_CREATED", {}), ("ANNOTATION_UPDATED", {"annotation": {"id": "x"}}),
    ("ANNOTATIONS_CREATED", {"annotations": []}), ("ANNOTATIONS_DELETED", {"annotations": [5]}),
    ("ANNOTATIONS_DELETED", None), ("ANNOTATION_CREATED", {"annotation": {"id": 1, "task": True}}),
])
def test_an_event_that_names_no_annotation_is_malformed(action, payload):
    with pytest.raises(MalformedEvent):
        parse_annotation_event(action, payload)


def test_an_event_without_a_usable_project_keeps_its_annotations():
    event = parse_annotation_event("ANNOTATION_CREATED", {"project": "nope", "annotation": {"id": 3, "task": 9}})
    assert (event.project, event.annotations) == (None, [(3, 9)])


def test_other_actions_are_not_annotation_events():
    with pytest.raises(ValueError):
        parse_annotation_event("START_TRAINING", {})


@pytest.mark.parametrize("value,expected", [(5, 5), ("5", 5), ({"id": 5}, 5), ({"id": "5"}, 5), (None, None),
                                            ({}, None), ("x", None), (True, None), (-1, None), (2.0, None)])
def test_user_id_reads_a_label_studio_user_reference(value, expected):
    assert user_id(value) == expected
