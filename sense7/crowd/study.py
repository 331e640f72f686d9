"""The crowd study file: a YAML file next to the study's taxonomy, validated into a `CrowdStudy`.

```yaml
study: empathy-pilot                 # [a-z0-9-], the URL's /s/<study>
platform:                            # the entry URL's parameter names (Prolific's by default)
  participant_param: PROLIFIC_PID
  study_param: STUDY_ID
  session_param: SESSION_ID
  study_id: 65aa11bb22cc33dd44ee55ff  # optional, recommended: the study's id on the platform; an entry whose
                                     # study parameter differs is refused, and the Prolific API check asks
                                     # about this study, not about whichever one the URL names
consent: consent.md                  # Markdown in this file's folder; its SHA-256 is the consent version
comprehension:                       # at least one; two attempts to answer all of them right
  - question: What does "Continuity" mean here?
    choices: [The reply follows on from what was said, The reply is long]
    answer: 1                        # 1-based index into choices
raters_per_conversation: 3           # K
conversations_per_participant: 3     # N (or turns_per_participant: a budget of assistant turns, whole
                                     # conversations least covered first: sense7.crowd.assignment)
check_minutes: 10                    # optional (default 10): an entry's reservation to read the consent and pass
                                     # the check; it holds nothing (no seat, slot, link or task) and ends unpassed
lease_minutes: 60                    # the rating lease: starts when the check is passed, never restarted
participant_cap: 200                 # participants inside the study (passed the check) and completed
codes:                               # each a code, a URL, or both (the URL wins for the redirect)
  completion: C1A2B3
  completion_url: https://app.prolific.com/submissions/complete?cc=C1A2B3
  no_consent: NOCONSENT
  screen_out: SCREENOUT
  full: FULL42                       # optional: shown to a participant turned away (no seat or no slot left);
                                     # without it they are asked to return their submission
pool: pool.jsonl                     # conversations (any format `sense7 import` reads), in this file's folder
assignment: least_covered            # optional (default least_covered): who rates what (sense7.crowd.policies):
                                     # least_covered, random, learn_rater or settle_items; or a mapping
                                     # {policy: settle_items, floor: 2, settled_sd: 0.3}: `floor` (default 1,
                                     # 0 to K) raters every conversation gets before any gets more, and the
                                     # policy's own parameters (random: seed; learn_rater: anchors (its
                                     # first picks per participant exempt from the floor, default 1),
                                     # leniency_sd, slope_sd; settle_items: settled_sd, leniency_sd)
```

Every problem is reported as file:line: field: reason (sense7.readers.formats.FormatError), all at once.
The consent and pool files must lie in the study file's folder (or below it): no absolute path, no `..`,
no link pointing out of it. The YAML is read with its aliases, size and nesting bounded (sense7.files).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from sense7.crowd.policies import DEFAULT_POLICY, PARAMETERS, POLICIES, make_policy
from sense7.files import YAMLInputError, forbidden_character, load_yaml
from sense7.readers.formats import FormatError, Problem

STUDY_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")
CODE = re.compile(r"[A-Za-z0-9_-]{1,64}")
PROLIFIC = {"participant_param": "PROLIFIC_PID", "study_param": "STUDY_ID", "session_param": "SESSION_ID"}
PLATFORM_STUDY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # `platform.study_id`: a value, not a parameter name
KNOWN_KEYS = {"study", "platform", "consent", "comprehension", "raters_per_conversation",
              "conversations_per_participant", "turns_per_participant", "lease_minutes", "check_minutes",
              "participant_cap", "codes", "pool", "assignment"}
CODE_KEYS = ("completion", "completion_url", "no_consent", "no_consent_url", "screen_out", "screen_out_url",
             "full", "full_url")
CHECK_MINUTES = 10  # Prolific reserves a place for 10 minutes too


@dataclass(frozen=True)
class Question:
    question: str
    choices: list[str]
    answer: int  # 1-based


@dataclass(frozen=True)
class CrowdStudy:
    study_id: str
    consent_text: str
    consent_version: str
    questions: list[Question]
    raters_per_conversation: int
    conversations_per_participant: int | None  # None: a turn budget instead
    lease_minutes: int
    participant_cap: int
    codes: dict = field(default_factory=dict)
    platform: dict = field(default_factory=lambda: dict(PROLIFIC))
    pool_path: str | None = None  # only while initializing; the pool itself is stored apart
    turns_per_participant: int | None = None  # a budget of assistant turns instead of N conversations
    check_minutes: int = CHECK_MINUTES  # an entry's reservation until the check is passed (holds nothing)
    # the assignment policy: {"policy": name, "floor": n, ...its parameters} (sense7.crowd.policies)
    assignment: dict = field(default_factory=lambda: {"policy": DEFAULT_POLICY, "floor": 1})

    def to_config(self) -> dict:
        config = asdict(self)
        config.pop("pool_path")
        return config

    @classmethod
    def from_config(cls, config: dict) -> "CrowdStudy":
        return cls(**{**config, "questions": [Question(**q) for q in config["questions"]]})

    def policy(self):
        """The study's assignment policy object, with its caps (K max, N or the turn budget, the floor)."""
        params = {key: value for key, value in self.assignment.items() if key not in ("policy", "floor")}
        return make_policy(self.assignment.get("policy", DEFAULT_POLICY), self.raters_per_conversation,
                           self.conversations_per_participant, self.turns_per_participant,
                           int(self.assignment.get("floor", 1)), **params)

    def entry_from_elsewhere(self, platform_study: str | None) -> bool:
        """Whether an entry's study parameter names another platform study than the one this study file pins
        (`platform.study_id`); never, when none is pinned."""
        pinned = self.platform.get("study_id")
        return pinned is not None and platform_study != pinned

    def redirect_for(self, outcome: str) -> tuple[str | None, str | None]:
        """(code, URL) of an outcome: completion, no_consent, screen_out or full (optional)."""
        return self.codes.get(outcome) or None, self.codes.get(f"{outcome}_url") or None


def _lines(node, path=()) -> dict[tuple, int]:
    """key path -> 1-based line of every mapping key and sequence item in the YAML node tree."""
    found = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            found.update(_lines(value, path + (key.value,)))
            found[path + (key.value,)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found.update(_lines(item, path + (index,)))
    return found


def file_beside(study_file: Path, key: str, named, what: str, problem, must_exist: bool = True) -> Path | None:
    """The file the study's `key` names, in the study file's folder; None after `problem(where, field,
    reason)` says why not (not named, outside the folder, or with `must_exist` not there)."""
    if not isinstance(named, str) or not named:
        problem((key,), key, f"must name {what}")
    elif (why := outside_folder(study_file, named)) is not None:
        problem((key,), key, why)
    elif must_exist and not (study_file.parent / named).is_file():
        problem((key,), key, f"{named} does not exist")
    else:
        return study_file.parent / named
    return None


def outside_folder(study_file: Path, name: str) -> str | None:
    """Why the file `name` that a study file names is not in that file's folder (or below it), or None: an
    absolute path, a `..` step or a link pointing out of the folder would make any readable file the
    consent page or the pool."""
    named = Path(name)
    if named.is_absolute():
        return f"{name} must be a file in the study file's folder (a relative name), not an absolute path"
    if ".." in named.parts:
        return f"{name} must be a file in the study file's folder: '..' leads out of it"
    folder = study_file.parent.resolve()
    if not (folder / named).resolve().is_relative_to(folder):
        return f"{name} must be a file in the study file's folder: it links to a file outside it"
    return None


def load_study(path: str | Path) -> CrowdStudy:
    """Read and validate a study file; raises FormatError listing every problem (file:line: field: reason)."""
    path = Path(path)
    problems: list[Problem] = []

    def problem(where: tuple, name: str, reason: str) -> None:
        line = None
        for end in range(len(where), -1, -1):  # the nearest enclosing key that has a line
            if where[:end] in lines:
                line = lines[where[:end]]
                break
        problems.append(Problem(str(path), line, name, reason))

    try:
        raw, node = load_yaml(path.read_text(encoding="utf-8"), path)
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError([Problem(str(path), None, "file", f"cannot be read ({type(exc).__name__})")]) from None
    except YAMLInputError as exc:
        raise FormatError([Problem(exc.path, exc.line, exc.field, exc.reason)]) from None
    if not isinstance(raw, dict):
        raise FormatError([Problem(str(path), 1, "file", "must be a mapping of the study's settings")])
    lines = _lines(node)
    for key in sorted(set(raw) - KNOWN_KEYS, key=str):
        problem((key,), str(key), "unknown setting")

    study_id = raw.get("study")
    if not isinstance(study_id, str) or not STUDY_ID.fullmatch(study_id):
        problem(("study",), "study", "must be lowercase letters, digits and '-' (at most 63)")

    platform = dict(PROLIFIC)
    given = raw.get("platform") or {}
    if not isinstance(given, dict):
        problem(("platform",), "platform", "must be a mapping of parameter names")
        given = {}
    for key, value in given.items():
        if key == "study_id":
            if not isinstance(value, str) or not PLATFORM_STUDY_ID.fullmatch(value):
                problem(("platform", key), f"platform.{key}", "must be the platform's study id (letters, digits, "
                        "'_' or '-', at most 64)")
            else:
                platform[key] = value
        elif key not in PROLIFIC:
            problem(("platform", key), f"platform.{key}", "unknown setting")
        elif not isinstance(value, str) or not PARAM_NAME.fullmatch(value):
            problem(("platform", key), f"platform.{key}", "must be a URL parameter name")
        else:
            platform[key] = value

    consent_text, consent_version = "", ""
    consent = raw.get("consent")
    consent_path = file_beside(path, "consent", consent, "the consent Markdown file", problem, must_exist=False)
    if consent_path is not None:
        try:
            consent_text = consent_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problem(("consent",), "consent", f"{consent} cannot be read ({type(exc).__name__})")
        else:
            if not consent_text.strip():
                problem(("consent",), "consent", f"{consent} is empty")
            elif (why := forbidden_character(consent_text)) is not None:
                problem(("consent",), "consent", f"{consent} {why}")
            consent_version = hashlib.sha256(consent_text.encode()).hexdigest()

    questions = []
    raw_questions = raw.get("comprehension")
    if not isinstance(raw_questions, list) or not raw_questions:
        problem(("comprehension",), "comprehension", "must list at least one question")
        raw_questions = []
    for i, q in enumerate(raw_questions):
        where, name = ("comprehension", i), f"comprehension[{i + 1}]"
        if not isinstance(q, dict) or set(q) - {"question", "choices", "answer"}:
            problem(where, name, "must have question, choices and answer only")
            continue
        choices = q.get("choices")
        if not isinstance(q.get("question"), str) or not q["question"].strip():
            problem(where + ("question",), f"{name}.question", "must be a text")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            problem(where + ("choices",), f"{name}.choices", "must list at least two texts")
            continue
        answer = q.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, int) or not 1 <= answer <= len(choices):
            problem(where + ("answer",), f"{name}.answer", f"must be the number of the right choice (1-{len(choices)})")
            continue
        questions.append(Question(q["question"].strip(), list(choices), answer))

    def whole(key: str, lowest: int, highest: int) -> int:
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
            problem((key,), key, f"must be a whole number from {lowest} to {highest}")
            return lowest
        return value

    k = whole("raters_per_conversation", 1, 100)
    n, budget = None, None
    if "turns_per_participant" in raw:
        budget = whole("turns_per_participant", 1, 100_000)
        if "conversations_per_participant" in raw:
            problem(("turns_per_participant",), "turns_per_participant",
                    "give conversations_per_participant or turns_per_participant, not both")
    else:
        n = whole("conversations_per_participant", 1, 1000)
    lease = whole("lease_minutes", 1, 24 * 60)
    check = whole("check_minutes", 1, 24 * 60) if "check_minutes" in raw else CHECK_MINUTES
    cap = whole("participant_cap", 1, 1_000_000)

    codes = {}
    raw_codes = raw.get("codes")
    if not isinstance(raw_codes, dict):
        problem(("codes",), "codes", "must give completion, no_consent and screen_out codes or URLs")
        raw_codes = {}
    for key, value in raw_codes.items():
        where, name = ("codes", key), f"codes.{key}"
        if key not in CODE_KEYS:
            problem(where, name, "unknown setting")
        elif key.endswith("_url"):
            if not isinstance(value, str) or not re.fullmatch(r"https?://[^\s<>\"']{1,500}", value):
                problem(where, name, "must be an http(s) URL")
            else:
                codes[key] = value
        elif not isinstance(value, str) or not CODE.fullmatch(value):
            problem(where, name, "must be letters, digits, '-' or '_' (at most 64)")
        else:
            codes[key] = value
    for outcome in ("completion", "no_consent", "screen_out"):
        if raw_codes is not None and outcome not in codes and f"{outcome}_url" not in codes \
                and not any(p.field.startswith(f"codes.{outcome}") for p in problems):
            problem(("codes",), f"codes.{outcome}", "missing: give a code, a URL or both")

    pool_file = file_beside(path, "pool", raw.get("pool"), "the pool's conversations file", problem)
    pool_path = None if pool_file is None else str(pool_file)

    assignment = _assignment(raw.get("assignment", DEFAULT_POLICY), k, problem)

    if problems:
        raise FormatError(sorted(problems, key=lambda p: p.line or 0))
    return CrowdStudy(study_id, consent_text, consent_version, questions, k, n, lease, cap, codes, platform,
                      pool_path, budget, check, assignment)


def _assignment(given, k: int, problem) -> dict:
    """The `assignment:` setting: a policy name, or a mapping {policy, floor, ...the policy's parameters}."""
    names = ", ".join(POLICIES)
    named_only = isinstance(given, str)  # `assignment: learn_rater`: the name is the setting itself
    if named_only:
        given = {"policy": given}
    if not isinstance(given, dict):
        problem(("assignment",), "assignment", f"must be a policy name ({names}) or a mapping with `policy:`")
        return {"policy": DEFAULT_POLICY, "floor": 1}
    name = given.get("policy", DEFAULT_POLICY)
    where = ("assignment",) if named_only or "policy" not in given else ("assignment", "policy")
    if not isinstance(name, str) or name not in POLICIES:
        problem(where, "assignment.policy" if len(where) > 1 else "assignment",
                f"unknown policy {name!r}: one of {names}")
        return {"policy": DEFAULT_POLICY, "floor": 1}
    out = {"policy": name, "floor": 1}
    for key, value in given.items():
        field_name, place = f"assignment.{key}", ("assignment", key)
        if key == "policy":
            continue
        if key == "floor":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= k:
                problem(place, field_name, f"must be a whole number from 0 to raters_per_conversation ({k})")
            else:
                out["floor"] = value
        elif key not in PARAMETERS[name]:
            known = ", ".join(sorted(PARAMETERS[name] | {"floor"}))
            problem(place, field_name, f"unknown setting of {name} (it takes {known})")
        elif key == "anchors":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
                problem(place, field_name, "must be a whole number from 0 to 1000")
            else:
                out[key] = value
        elif key == "seed":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
                problem(place, field_name, "must be a whole number from 0 to 4294967295")
            else:
                out[key] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 100:
            problem(place, field_name, "must be a positive number (scale points) of at most 100")
        else:
            out[key] = float(value)
    return out
