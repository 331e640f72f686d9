"""Simulated crowd participants over HTTP, as a browser would drive the rater page (the crowd benchmark's
participants, moved here so that `sense7 demo --crowd N` runs the same ones; scripts import this module,
never the other way).

Each participant has its own platform id and session: it opens the study URL, agrees (or declines), answers
the comprehension check (right, or wrong twice: screened out), waits on "preparing" while its tasks are made
(they are asked for when the check is passed), answers the questionnaire and rates its assigned turns at the given pace, or walks away after
its first turn (abandons: its lease ends later). Conversations come as it goes (issue 41): after an answer it
follows the page to the next turn, waiting on "preparing" when the next conversation's tasks are not made yet
(`next_turn`: the answer's POST to the next turn's page). Human waits are given already compressed by the caller;
server times are measured as they are.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sense7.files import write_private

CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
HIDDEN = re.compile(r'name="(csrf_token|revision|rendered_at)" value="([^"]*)"')
ACTION = re.compile(r'<form method="post" action="(/task/\d+)"')
SERVER_TIMING = re.compile(r"\bapp;dur=([0-9.]+)")
KINDS = ("complete", "decline", "screen", "abandon")


@dataclass
class Tally:
    """What the participants measured and how they ended (outcome -> count)."""

    first_turn: list = field(default_factory=list)
    entry_server: list = field(default_factory=list)
    preparing: list = field(default_factory=list)
    first_turn_with_reading: list = field(default_factory=list)
    page: list = field(default_factory=list)
    # Of each `page`: the app's own time (its Server-Timing, summed over the redirects followed) and the
    # requests it took; `loop_lag`: how late the clients' event loop woke a 50 ms sleep (the clients' own delay
    # in every time they measure).
    page_server: list = field(default_factory=list)
    page_requests: list = field(default_factory=list)
    loop_lag: list = field(default_factory=list)
    next_turn: list = field(default_factory=list)  # an answer's POST -> the next turn's page (waits included)
    waited_next: list = field(default_factory=list)  # of those, time on "preparing" (0: the turn was there)
    ack: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)
    submitted: dict = field(default_factory=dict)  # task id -> wall time the POST was acknowledged

    def outcome(self, name: str) -> None:
        self.outcomes[name] = self.outcomes.get(name, 0) + 1


@dataclass(frozen=True)
class Pace:
    """Human times (s, already compressed): per turn, reading the consent, per check attempt, answering the
    questionnaire."""

    think: tuple[float, float] = (0.0, 0.0)
    consent_read: tuple[float, float] = (0.0, 0.0)
    check_answer: tuple[float, float] = (0.0, 0.0)
    questionnaire: tuple[float, float] = (0.0, 0.0)


def write_study(folder: Path, pool: list, *, study_id: str, participants: int, k: int, n: int, lease_minutes: int,
                codes: dict[str, str], check_minutes: int | None = None) -> Path:
    """A simulated study's file, consent text and pool (`pool`: the given conversations) under `folder`:
    one comprehension question, K raters per conversation, N conversations each, a cap of `participants`,
    the platform `codes` (completion, no_consent, screen_out), the reservation at the check (`check_minutes`,
    the study file's default when None). Returns the study file's path."""
    # The pool is conversation data and the study file names the codes that get participants paid: owner only.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(folder / "consent.md", "# Consent\n\nYou will rate replies of an AI assistant. Your answers are "
                                         "kept under a pseudonym.\n")
    write_private(folder / "pool.jsonl", "".join(
        json.dumps({"conversation_id": c.conversation_id, "rater_id": c.rater_id, "context": dict(c.context),
                    "messages": [{"role": m.role, "content": m.content} for m in c.messages]}) + "\n"
        for c in pool))
    path = folder / "study.yaml"
    write_private(path, f"""study: {study_id}
consent: consent.md
comprehension:
  - question: What does "Continuity" mean here?
    choices: ["The reply follows on from what was said", "The reply is long"]
    answer: 1
raters_per_conversation: {k}
conversations_per_participant: {n}
lease_minutes: {lease_minutes}
{f"check_minutes: {check_minutes}" if check_minutes is not None else ""}
participant_cap: {max(participants, 1)}
codes:
  completion: {codes["completion"]}
  no_consent: {codes["no_consent"]}
  screen_out: {codes["screen_out"]}
pool: pool.jsonl
""")
    return path


def mix(n: int, decline: float = 0.05, screen: float = 0.05, abandon: float = 0.10, at_least_one: bool = False,
        rng: random.Random | None = None) -> list[str]:
    """n participants' kinds in these shares (rounded; `at_least_one`: one of each when n >= 4, so a small
    demo shows every ending), shuffled by `rng` when given."""
    def count(share: float) -> int:
        return max(round(share * n), 1 if at_least_one and n >= 4 else 0)

    kinds = ["decline"] * count(decline) + ["screen"] * count(screen) + ["abandon"] * count(abandon)
    kinds = kinds[:n] + ["complete"] * (n - len(kinds[:n]))
    if rng is not None:
        rng.shuffle(kinds)
    return kinds


def check_answers(study, right: bool) -> dict[str, str]:
    """The comprehension check's form: every answer right, or every answer wrong."""
    return {f"q{i}": str(q.answer if right else (q.answer % len(q.choices)) + 1)
            for i, q in enumerate(study.questions, start=1)}


def outcome_after(answer, step: str, stops_here: tuple[str, str, str] | None) -> str | None:
    """How a participant's visit ends with the page's `answer` at `step` (consent, check), or None when it goes
    on. `stops_here`, for a participant meant to stop at this step: (the outcome, the code the page must then
    show, the outcome when it does not)."""
    if stops_here:
        outcome, code, failed = stops_here
        return outcome if code in answer.text else failed
    if answer.status_code != 303:
        return "full" if "full" in answer.text else f"{step} {answer.status_code}"
    return None


async def participant(http, study, pid: str, kind: str, arrive: float, pace: Pace, tally: Tally,
                      rng: random.Random, form_values: dict, profile_values: dict) -> None:
    """One participant through the study on `http` (an httpx.AsyncClient on the rater page's URL)."""
    await asyncio.sleep(arrive)
    server = [0.0]  # the entry pages' server time (request -> response), summed
    sid = study.study_id
    codes = {outcome: study.redirect_for(outcome)[0] or "" for outcome in ("completion", "no_consent", "screen_out")}

    async def timed(request):
        t0 = time.perf_counter()
        response = await request
        server[0] += time.perf_counter() - t0
        return response

    names = study.platform
    try:
        started = time.perf_counter()
        page = await timed(http.get(f"/s/{sid}?{names['participant_param']}={pid}&{names['study_param']}={names.get('study_id', 'sim')}"
                                    f"&{names['session_param']}=s{pid[-6:]}"))
        if page.status_code != 200 or "I agree" not in page.text:
            tally.outcome(f"entry {page.status_code}")
            return
        choice = "decline" if kind == "decline" else "agree"
        reading = rng.uniform(*pace.consent_read)
        await asyncio.sleep(reading)
        answer = await timed(http.post(f"/s/{sid}/consent", data={"csrf_token": CSRF.search(page.text).group(1),
                                                                  "consent": choice}))
        declined = ("declined", codes["no_consent"], "decline failed") if kind == "decline" else None
        ended = outcome_after(answer, "consent", declined)
        if ended:
            tally.outcome(ended)
            return
        page = await timed(http.get(f"/s/{sid}/check"))
        token = CSRF.search(page.text).group(1)
        attempts = 2 if kind == "screen" else 1
        for _ in range(attempts):
            await asyncio.sleep(rng.uniform(*pace.check_answer))
            answer = await timed(http.post(f"/s/{sid}/check", data={"csrf_token": token,
                                                                    **check_answers(study, kind != "screen")}))
        screened = ("screened_out", codes["screen_out"], "screen failed") if kind == "screen" else None
        ended = outcome_after(answer, "check", screened)
        if ended:
            tally.outcome(ended)
            return
        deadline = time.monotonic() + 300

        async def preparing(wait) -> float:
            """Seconds on the "preparing" page (it refreshes itself) until it sends the participant on."""
            shown, waited = time.perf_counter(), 0.0
            while wait.status_code != 303:
                if wait.status_code != 200 or time.monotonic() > deadline:
                    raise RuntimeError(f"preparing answered HTTP {wait.status_code}")
                await asyncio.sleep(0.5)
                wait = await http.get(f"/s/{sid}/wait")
                waited = time.perf_counter() - shown
            return waited

        waited = await preparing(await timed(http.get(f"/s/{sid}/wait")))  # an entry page once something is there
        page = await timed(http.get("/", follow_redirects=True))
        if "/profile" in str(page.url):
            form = {**dict(HIDDEN.findall(page.text)), **profile_values}
            await asyncio.sleep(rng.uniform(*pace.questionnaire))
            page = await timed(http.post("/profile", data=form))
            if page.status_code != 303:
                raise RuntimeError(f"questionnaire answered HTTP {page.status_code}")
            page = await timed(http.get(page.headers["location"], follow_redirects=True))
            if page.url.path.endswith(f"/s/{sid}/wait"):  # the turns' tasks are still being made
                waited += await preparing(await timed(http.get(f"/s/{sid}/wait")))
                page = await timed(http.get("/", follow_redirects=True))
        tally.first_turn_with_reading.append(time.perf_counter() - started)
        tally.first_turn.append(server[0] + waited)
        tally.entry_server.append(server[0])
        tally.preparing.append(waited)
        turns_done = 0
        while True:
            action = ACTION.search(page.text)
            if action is None:
                break
            if kind == "abandon" and turns_done >= 1:
                tally.outcome("abandoned")
                return
            await asyncio.sleep(rng.uniform(*pace.think))
            form = {**dict(HIDDEN.findall(page.text)), **form_values}
            t0 = time.perf_counter()
            saved = await http.post(action.group(1), data=form)
            tally.ack.append(time.perf_counter() - t0)
            if saved.status_code != 303:
                raise RuntimeError(f"submit answered HTTP {saved.status_code}")
            tally.submitted[int(action.group(1).rsplit("/", 1)[1])] = time.time()
            turns_done += 1
            t1 = time.perf_counter()
            page = await http.get(saved.headers["location"], follow_redirects=True)
            tally.page.append(time.perf_counter() - t1)
            tally.page_server.append(sum(map(app_seconds, [*page.history, page])))
            tally.page_requests.append(len(page.history) + 1)
            waited = 0.0
            while page.url.path.endswith(f"/s/{sid}/wait") and page.status_code == 200:
                # the next conversation's tasks are still being made: the page refreshes itself
                if time.perf_counter() - t1 > 300:
                    raise RuntimeError("the next conversation was never prepared")
                await asyncio.sleep(0.5)
                page = await http.get(f"/s/{sid}/wait", follow_redirects=True)
                waited = time.perf_counter() - t1
            if ACTION.search(page.text):
                tally.next_turn.append(time.perf_counter() - t0)
                tally.waited_next.append(waited)
        tally.outcome("completed" if codes["completion"] in page.text else "finish failed")
    except Exception as exc:
        tally.errors.append(f"{type(exc).__name__}: {exc}")


def app_seconds(response) -> float:
    """The app's own time of a response, from its `Server-Timing: app;dur=<ms>` (0 without one)."""
    match = SERVER_TIMING.search(response.headers.get("server-timing", ""))
    return float(match.group(1)) / 1000 if match else 0.0


async def watch_loop(tally: Tally, done: asyncio.Event, period: float = 0.05) -> None:
    """How late the event loop wakes a `period` sleep, until `done`: the clients' own queueing."""
    while not done.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        tally.loop_lag.append(time.perf_counter() - t0 - period)


def run_participants(base: str, study, kinds: list[str], arrivals: list[float], pace: Pace, form_values: list[dict],
                     profile_values: dict, seed: int = 0, pids: list[str] | None = None,
                     addresses: list[str] | None = None) -> Tally:
    """All participants at once (asyncio), each with its own session (and, given `addresses`, its own client
    address as X-Forwarded-For: a page behind a trusted proxy counts entries per address); the tally."""
    import httpx

    tally, rng = Tally(), random.Random(seed)
    pids = pids or [f"{seed:08x}{i:016x}" for i in range(len(kinds))]

    async def one(i: int):
        headers = {"X-Forwarded-For": addresses[i]} if addresses else None
        async with httpx.AsyncClient(base_url=base, timeout=120.0, headers=headers) as http:
            await participant(http, study, pids[i], kinds[i], arrivals[i], pace, tally,
                              random.Random(rng.random()), form_values[i], profile_values)

    async def run():
        done = asyncio.Event()
        watcher = asyncio.ensure_future(watch_loop(tally, done))
        await asyncio.gather(*[one(i) for i in range(len(kinds))])
        done.set()
        await watcher

    asyncio.run(run())
    return tally
