"""Which Rating controls a Label Studio label config has, read from the XML Label Studio sends.

Predictions must name the controls of the project's *current* config (from_name/to_name), so they are
parsed from every request's `label_config` instead of being hard-coded; parsing is cached per config text.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache


class LabelConfigError(ValueError):
    """The label config is not XML or has no Rating control."""


@dataclass(frozen=True)
class RatingControl:
    from_name: str
    to_name: str
    max_rating: int


@lru_cache(maxsize=64)
def rating_controls(label_config: str) -> tuple[RatingControl, ...]:
    """The `<Rating>` tags of a config, in document order."""
    if not isinstance(label_config, str) or not label_config.strip():
        raise LabelConfigError("label_config is empty")
    try:
        root = ET.fromstring(label_config)
    except ET.ParseError as exc:
        raise LabelConfigError(f"label_config is not valid XML: {exc}") from None
    controls = []
    for tag in root.iter("Rating"):
        name, to_name = tag.get("name"), tag.get("toName")
        if not name or not to_name:
            raise LabelConfigError(f"<Rating> without name/toName in label_config: {ET.tostring(tag)[:120]!r}")
        try:
            max_rating = int(tag.get("maxRating", "5"))
        except ValueError:
            raise LabelConfigError(f"<Rating name={name!r}> has a non-integer maxRating") from None
        controls.append(RatingControl(name, to_name, max_rating))
    if not controls:
        raise LabelConfigError("label_config has no <Rating> control to predict")
    return tuple(controls)
