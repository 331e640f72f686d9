"""Prolific's API, optional: used only when SENSE7_PROLIFIC_TOKEN is set (sense7.settings.ProlificApi).

Two documented calls (https://docs.prolific.com/api-reference/submissions), each with the header
`Authorization: Token <token>` and a timeout:

- `GET /api/v1/submissions/{id}/`: one submission (`participant`, `study_id`, `status`); its id is what
  Prolific passes as %SESSION_ID%. The rater page asks it at a study's entry: an entry whose submission
  does not hold a place (RESERVED or ACTIVE) in the entry's Prolific study, for that participant, is refused
  before anything is stored (`entry_allowed`).
- `GET /api/v1/submissions/?study=..&status=..&page=..&page_size=..`: a study's submissions in one status
  (`results`: `participant_id`, `status`). Beat asks it for RETURNED and TIMED-OUT every minute
  (sense7.tasks.crowd_jobs): those participants' slots and seats are freed at once, not when the lease ends.

Fail-open: when Prolific cannot answer (a timeout, a refused connection, 5xx, 429, a rejected token), the
entry goes on as without a token, and lookups pause for `PAUSE` s so that entries do not each wait out a
timeout. An entry admitted that way still holds nothing until it passes the comprehension check (a
reservation of `check_minutes`), and the per-address entry limit still counts it, so an outage of
Prolific's never blocks real participants and never lets a flood hold the pool. Only a definite answer
(the submission is unknown, someone else's, another study's, or no longer holding a place) refuses.
Nothing here logs a platform id or the token.
"""

from __future__ import annotations

import logging
import time

import requests

log = logging.getLogger(__name__)

HOLDING = ("RESERVED", "ACTIVE")  # a submission that holds a place in the study
ENDED = ("RETURNED", "TIMED-OUT")  # places given back: the participant left without finishing
PAUSE = 30.0  # (s) after Prolific failed to answer, entries are not checked for this long (fail-open)
TIMEOUT = (2.0, 4.0)  # (s) connect, read
PAGE_SIZE = 200
MAX_PAGES = 200  # 40,000 submissions in one status: more than any study this runs


class ProlificUnavailable(Exception):
    """Prolific did not give a usable answer (down, slow, over its rate limit, the token refused)."""


class ProlificClient:
    """The two calls, through one `requests` session."""

    def __init__(self, token: str, url: str = "https://api.prolific.com", timeout=TIMEOUT, pause: float = PAUSE):
        self.url, self.timeout, self.pause = url.rstrip("/"), timeout, pause
        self.http = requests.Session()
        self.http.headers.update({"Authorization": f"Token {token}", "Accept": "application/json"})
        self.quiet_until = 0.0

    @classmethod
    def from_settings(cls, settings) -> "ProlificClient | None":
        """The client of these settings, or None without a token (the API is not used)."""
        api = settings.prolific
        return cls(api.token, api.url) if api.token else None

    def get(self, path: str, params: dict | None = None) -> dict | None:
        """The JSON of one GET; None for 404; ProlificUnavailable for anything else but 200."""
        try:
            response = self.http.get(f"{self.url}{path}", params=params, timeout=self.timeout)
        except requests.RequestException as exc:
            raise ProlificUnavailable(type(exc).__name__) from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ProlificUnavailable(f"HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise ProlificUnavailable("not JSON") from None
        if not isinstance(body, dict):
            raise ProlificUnavailable("unexpected JSON")
        return body

    def submission(self, submission_id: str) -> dict | None:
        return self.get(f"/api/v1/submissions/{requests.utils.quote(submission_id, safe='')}/")

    def submissions(self, study_id: str, status: str) -> list[dict]:
        """Every submission of the study in this status (all pages)."""
        found: list[dict] = []
        for page in range(1, MAX_PAGES + 1):
            body = self.get("/api/v1/submissions/", {"study": study_id, "status": status, "page": page,
                                                     "page_size": PAGE_SIZE}) or {}
            results = body.get("results")
            if not isinstance(results, list):
                raise ProlificUnavailable("no results list")
            found += [r for r in results if isinstance(r, dict)]
            following = (body.get("_links") or {}).get("next")
            if isinstance(following, dict) and not following.get("href"):
                break  # the API says this was the last page
            if not isinstance(following, dict) and len(results) < PAGE_SIZE:
                break
        return found

    def participants_left(self, study_id: str) -> set[str]:
        """Platform ids whose submission in this study was returned or timed out."""
        left: set[str] = set()
        for status in ENDED:
            left |= {str(s.get("participant_id") or s.get("participant")) for s in self.submissions(study_id, status)
                     if s.get("participant_id") or s.get("participant")}
        return left

    def entry_allowed(self, participant_id: str, study_id: str | None, submission_id: str | None) -> bool:
        """Whether an entry may go on: its submission (the entry's session id) holds a place in the entry's
        Prolific study for this participant. True as well when Prolific cannot answer (fail-open, above)."""
        if not study_id or not submission_id:
            return False  # an entry from Prolific's study URL carries both
        if time.monotonic() < self.quiet_until:
            return True
        try:
            found = self.submission(submission_id)
        except ProlificUnavailable as exc:
            self.quiet_until = time.monotonic() + self.pause
            log.warning("Prolific's API did not answer (%s): entries are not checked for %.0f s", exc, self.pause)
            return True
        if found is None:
            return False
        return (found.get("participant") == participant_id and found.get("study_id") == study_id
                and found.get("status") in HOLDING)
