"""The rater page's one parser of form numbers, in its own module: the rating and profile forms
(sense7.rater_page.answers) and the crowd study's pages (sense7.rater_page.crowd_pages) all read forms with it."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")  # ASCII only: no "³", "٣", "１", signs or spaces


def form_number(raw, lowest: float, highest: float, decimals: bool = False) -> int | float | None:
    """The one parser of every number a form sends: ASCII digits (a decimal point with `decimals`) within
    [lowest, highest], else None. str.isdigit() accepts "³", which int() rejects, and int() accepts "٣";
    neither reaches a stored answer."""
    if not isinstance(raw, str) or not _NUMBER.fullmatch(raw) or ("." in raw and not decimals):
        return None
    number = float(raw) if decimals else int(raw)
    return number if lowest <= number <= highest else None
