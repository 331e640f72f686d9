"""Croissant 1.1 metadata (MLCommons' JSON-LD description of an ML data set) with its Responsible-AI fields,
for what a study releases (`sense7 release`) and exports (`sense7 export`).

NeurIPS' datasets track asks for Croissant with the RAI vocabulary's annotation fields
(http://mlcommons.org/croissant/RAI/): `rai:dataAnnotationProtocol`, `rai:dataAnnotationPlatform`,
`rai:annotationsPerItem`, `rai:annotatorDemographics`, `rai:machineAnnotationTools`, ... Every one of them
is filled here from the study itself: the taxonomy (what was rated and asked), the ratings written (how many
raters per turn), the store (the pre-fill policy each task drew, the model versions whose predictions were
recorded, a crowd study's platform and K). `study_facts(store, taxonomy, design)` gathers what the store
knows; `annotation_counts` counts the table actually written; `rai_fields` turns both into the RAI fields
and `datasheet_lines` into the same facts for the datasheet README, so the two say the same.

`croissant_document(...)` describes the files of a folder: each data file a `cr:FileObject` with its
SHA-256 (mlcroissant requires a checksum), each table a `cr:RecordSet` read from one CSV or Parquet file.
`croissant_problems(folder)` is the check a written folder passes: the document parses, conforms to 1.1,
names files inside the folder only, and every checksum matches its file.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

CROISSANT_FILE = "croissant.json"
CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
RAI_PREFIX = "rai:"

# The standard @context of a Croissant 1.1 document (what mlcroissant writes for 1.1: a document with
# another context loads with a warning).
CONTEXT = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "arrayShape": "cr:arrayShape",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "containedIn": "cr:containedIn",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "description": {"@container": "@language"},
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isArray": "cr:isArray",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "name": {"@container": "@language"},
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
DATA_TYPES = {"text": "sc:Text", "integer": "sc:Integer", "float": "sc:Float", "boolean": "sc:Boolean",
              "datetime": "sc:DateTime"}
ENCODINGS = {".csv": "text/csv", ".parquet": "application/x-parquet", ".jsonl": "application/jsonlines",
             ".json": "application/json"}
PLATFORMS = {"PROLIFIC_PID": "Prolific"}  # a crowd study's participant parameter -> its platform


# -- what the study says about itself ----------------------------------------------------------------------
@dataclass(frozen=True)
class StudyFacts:
    """What the store knows about how the ratings were made (the RAI fields' sources besides the taxonomy)."""

    prefill_policies: tuple[tuple[str, float, int], ...] = ()  # (policy, shown share, tasks drawn under it)
    arms: tuple[tuple[str, int], ...] = ()                     # (arm, tasks): shown | hidden, repeats included
    repeats: int = 0                                           # test-retest repeat tasks
    prefill_rule: str | None = None                            # which level of a prediction is pre-filled
    versions: tuple[tuple[str, tuple[str, ...]], ...] = ()     # (model version, kinds recorded for it)
    crowd: tuple[tuple[str, str, int], ...] = ()               # (study id, platform, raters per conversation)


def study_facts(store, taxonomy=None, design=None) -> StudyFacts:
    """The pre-fill policies tasks drew, the model versions whose predictions were recorded, the crowd
    studies' platforms and K (sense7.store.study_design, sense7.crowd), from the store. `design`: the
    study's StudyDesign (settings.study), for the pre-fill rule (the store does not keep it)."""
    from sqlalchemy import func, select

    from sense7.store.tables import crowd_studies, recorded_predictions, task_arms

    with store.engine.connect() as conn:
        policies = conn.execute(select(task_arms.c.policy, task_arms.c.shown_share, func.count())
                                .where(task_arms.c.repeat_of.is_(None))
                                .group_by(task_arms.c.policy, task_arms.c.shown_share)).all()
        arms = conn.execute(select(task_arms.c.arm, func.count()).group_by(task_arms.c.arm)).all()
        repeats = conn.scalar(select(func.count()).select_from(task_arms).where(task_arms.c.repeat_of.is_not(None)))
        kinds = conn.execute(select(recorded_predictions.c.version, recorded_predictions.c.kind).distinct()).all()
        studies = conn.execute(select(crowd_studies.c.study_id, crowd_studies.c.config)).all()
    versions: dict[str, set] = {}
    for version, kind in kinds:
        versions.setdefault(version, set()).add(kind)
    crowd = []
    for study_id, config in studies:
        param = ((config or {}).get("platform") or {}).get("participant_param", "")
        crowd.append((study_id, PLATFORMS.get(param, f"a crowd platform (participant parameter {param})"),
                      int((config or {}).get("raters_per_conversation") or 0)))
    return StudyFacts(
        prefill_policies=tuple(sorted((p, float(s), int(n)) for p, s, n in policies)),
        arms=tuple(sorted((a, int(n)) for a, n in arms)), repeats=int(repeats or 0),
        prefill_rule=getattr(design, "prefill_rule", None),
        versions=tuple(sorted((v, tuple(sorted(k))) for v, k in versions.items())), crowd=tuple(sorted(crowd)))


@dataclass(frozen=True)
class AnnotationCounts:
    """Raters per item (a rated turn, or a conversation rated as a whole) in the ratings a folder holds."""

    items: int
    raters: int
    ratings: int
    per_item: dict = field(default_factory=dict)  # raters per item -> items with that many

    @property
    def summary(self) -> str:
        if not self.items:
            return "no rated items"
        sizes = sorted(n for n, items in self.per_item.items() for _ in range(items))
        mean = sum(sizes) / len(sizes)
        median = sizes[len(sizes) // 2] if len(sizes) % 2 else (sizes[len(sizes) // 2 - 1] + sizes[len(sizes) // 2]) / 2
        spread = f"{sizes[0]} to {sizes[-1]} raters" if sizes[0] != sizes[-1] else \
            f"{sizes[0]} rater{'s' if sizes[0] != 1 else ''}"
        return f"{spread} per rated turn (mean {mean:.2f}, median {median:g}) over {self.items} turns"



def annotation_counts(rows) -> AnnotationCounts:
    """Counts of (item key, rater id) pairs: one per rating of a control (several controls of one turn by one
    rater count as one annotation of that turn)."""
    raters_of: dict = {}
    ratings = 0
    for item, rater in rows:
        raters_of.setdefault(item, set()).add(rater)
        ratings += 1
    return AnnotationCounts(items=len(raters_of), raters=len(set().union(*raters_of.values())) if raters_of else 0,
                            ratings=ratings, per_item=dict(Counter(len(r) for r in raters_of.values())))


def _field_values(fld) -> str:
    return f"{fld.min}-{fld.max}" if fld.type == "int" else ", ".join(fld.choices)


def rai_fields(taxonomy, facts: StudyFacts | None, counts: AnnotationCounts, period: tuple[str, str] | None = None,
               traits: str = "as answered") -> dict:
    """The Croissant RAI fields of a study's data (keys `rai:...`). `traits`: how the raters' traits appear
    (e.g. "generalized to 5-anonymous bands")."""
    facts = facts or StudyFacts()
    scale = ", ".join(f"{i} = {label}" for i, label in enumerate(taxonomy.scale, start=1))
    dims = [f"{d.key} ({d.title}): {d.definition}" for d in taxonomy.dimensions]
    dims.append(f"{taxonomy.overall.key} ({taxonomy.overall.title}): {taxonomy.overall.definition}")
    expectation = ", ".join(label for _, label in taxonomy.expectation_choices)
    protocol = [
        f"Each participant rated assistant turns of conversations on {len(taxonomy.controls)} controls, each on a "
        f"{taxonomy.levels}-point scale ({scale}); one rating per rater, turn and control, never aggregated.",
        *[f"Control {line}" for line in dims],
        f"{taxonomy.expectation_key}: {taxonomy.expectation_title} ({expectation}).",
        "Workforce: the study's own participants (their own donated conversations, or assigned ones); a profile "
        "questionnaire before rating.",
    ]
    if facts.repeats:
        protocol.append(f"{facts.repeats} turns were shown a second time at the end of a rater's queue (test-retest).")
    platforms = ["Label Studio (the study's tasks and annotations)",
                 "sense7 rater page (private per-rater links; raters never have a Label Studio account)"]
    platforms += [f"{platform} (recruitment of crowd study {study})" for study, platform, _ in facts.crowd]
    per_item = counts.summary
    designed = [f"{k} raters per conversation by design in crowd study {study}" for study, _, k in facts.crowd if k]
    demographics = [f"{f.key}: {f.title} ({_field_values(f)}); {traits}" for f in taxonomy.profile_fields]
    tools = _machine_tools(facts)
    timeframe = [f"{period[0]}-01", f"{period[1]}-01"] if period else None
    rai = {
        "rai:dataCollection": (
            "Participants donated conversations with AI assistants (their assistants' data exports) or were "
            "assigned conversations, then rated the assistant's turns on sense7's rater page."),
        "rai:dataCollectionType": ["Self-reporting", "Experiments", "User-generated content data"],
        "rai:dataCollectionRawData": ("Conversations between participants and AI assistants (ChatGPT, Claude, "
                                      "ShareGPT exports or the study's own files), scrubbed of personal details."),
        "rai:dataPreprocessingProtocol": [
            "Personal details in texts (e-mail addresses, phone numbers, URLs, IP addresses, card numbers, IBANs, "
            "listed names and terms) replaced by typed placeholders such as [EMAIL_1] at import and again on export.",
            "Raters and conversations carry new pseudonymous ids; e-mail addresses, platform ids, link secrets and "
            "free-text comments are not included."],
        "rai:dataAnnotationProtocol": protocol,
        "rai:dataAnnotationPlatform": platforms,
        "rai:dataAnnotationAnalysis": [
            "No aggregation: every rater's own rating is kept (perspectivist data); disagreement is signal.",
            "Rater quality is judged against each rater's own answers (speed, straight-lining, test-retest, "
            "instructed items), never against a majority."],
        "rai:annotationsPerItem": "; ".join([per_item, *designed]),
        "rai:annotatorDemographics": demographics,
        "rai:machineAnnotationTools": tools,
        "rai:personalSensitiveInformation": [
            "Raters' traits: " + ", ".join(f.title for f in taxonomy.profile_fields) + f" ({traits}).",
            "Per conversation: " + ", ".join(f.title for f in taxonomy.context_fields) + ".",
            "Conversation texts may hold personal matters; detected personal details are replaced by placeholders."],
        "rai:dataUseCases": ["Modelling individual raters' perception of empathy (personalized and trait-based "
                             "models) and comparing them with generic ones; studying disagreement."],
        "rai:dataLimitations": [
            "Raters are the study's participants, not a representative sample; small studies have few raters per turn.",
            "Pre-filled ratings may anchor raters: use the arm column (shown / hidden) to separate them."],
        "rai:dataBiases": ["Donated conversations over-represent people who use AI assistants and chose to share."],
        "rai:dataSocialImpact": ("Helps assistants adapt to how different people perceive empathy; misuse could "
                                 "profile individuals from their ratings."),
        "rai:dataReleaseMaintenancePlan": ["Written once by sense7 from the study's store; a new export or release "
                                           "replaces it (ids are not stable across them)."],
    }
    if timeframe:
        rai["rai:dataCollectionTimeframe"] = timeframe
    return rai


def _machine_tools(facts: StudyFacts) -> list[str]:
    if not facts.versions and not facts.prefill_policies:
        return ["None recorded: no model prediction was recorded or pre-filled in this study's store."]
    out = []
    for policy, share, tasks in facts.prefill_policies:
        how = {"shown": "every task pre-filled with the model's predicted level",
               "hidden": "predictions recorded, never shown",
               "randomized": f"each task drew an arm: shown (pre-filled) with probability {share:g}, else hidden "
                             "(recorded, never shown)"}.get(policy, policy)
        out.append(f"Pre-fill policy {policy} for {tasks} tasks: {how}.")
    if facts.prefill_rule:
        out.append(f"The pre-filled level is the {facts.prefill_rule} of the model's predicted distribution.")
    for version, kinds in facts.versions:
        out.append(f"sense7 rater model version {version} (kinds recorded: {', '.join(kinds)}; personalized = "
                   "fitted to the rater's own ratings, traits = from the profile only, generic = no rater, "
                   "live = updated with answers newer than the version).")
    return out


def datasheet_lines(rai: dict) -> list[str]:
    """The RAI fields as Markdown list lines for a datasheet README (the same text the Croissant file holds)."""
    lines = []
    for key, value in rai.items():
        name = key.removeprefix(RAI_PREFIX)
        values = value if isinstance(value, list) else [value]
        lines.append(f"- **{name}**: " + " ".join(str(v) for v in values))
    return lines


# -- the document ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    name: str
    data_type: str  # a key of DATA_TYPES
    description: str
    json_path: str | None = None  # read from a JSON file with this JSONPath instead of a table's column


@dataclass(frozen=True)
class RecordTable:
    """One table of the folder: a record set read from `path` (CSV or Parquet; JSON with JSONPath columns)."""

    name: str
    path: str
    description: str
    columns: tuple[Column, ...]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_object(folder: Path, path: str, description: str) -> dict:
    file = folder / path
    return {"@type": "cr:FileObject", "@id": path, "name": path, "description": description, "contentUrl": path,
            "encodingFormat": ENCODINGS.get(PurePosixPath(path).suffix, "application/octet-stream"),
            "contentSize": f"{file.stat().st_size} B", "sha256": sha256_of(file)}


def _record_set(table: RecordTable) -> dict:
    return {"@type": "cr:RecordSet", "@id": table.name, "name": table.name, "description": table.description,
            "field": [{"@type": "cr:Field", "@id": f"{table.name}/{c.name}", "name": c.name,
                       "description": c.description, "dataType": DATA_TYPES[c.data_type],
                       "source": {"fileObject": {"@id": table.path},
                                  "extract": {"jsonPath": c.json_path} if c.json_path else {"column": c.name}}}
                      for c in table.columns]}


def croissant_document(folder: Path, name: str, description: str, files: dict[str, str],
                       tables: list[RecordTable], rai: dict, license_text: str, keywords=()) -> dict:
    """The Croissant 1.1 document of `folder`: `files` maps each data file (relative path) to its description
    (checksums are computed now: call it once the files are written), `tables` are the record sets."""
    today = datetime.now(timezone.utc).date()
    return {
        "@context": CONTEXT, "@type": "sc:Dataset", "conformsTo": CONFORMS_TO, "name": name,
        "description": description, "license": license_text, "version": f"{today.year}.{today.month}.{today.day}",
        "datePublished": today.isoformat(), "keywords": list(keywords),
        "citeAs": f"@misc{{sense7study{today:%Y%m%d}, title={{{name}}}, note={{written by sense7 on {today}}}}}",
        "creator": {"@type": "sc:Organization", "name": "the study's team (sense7)"},
        **rai,
        "distribution": [_file_object(folder, path, text) for path, text in files.items()],
        "recordSet": [_record_set(t) for t in tables],
    }


def write_croissant(folder: Path, document: dict) -> Path:
    path = Path(folder) / CROISSANT_FILE
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def croissant_problems(folder: str | Path) -> list[str]:
    """What is wrong with `folder`'s croissant.json (empty when nothing): it must parse, conform to Croissant
    1.1, carry the RAI annotation fields, name only files inside the folder, and every file's SHA-256 must
    match. Messages name the file and field, never a value found."""
    folder = Path(folder)
    path = folder / CROISSANT_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path}: missing or unreadable ({type(exc).__name__})"]
    except json.JSONDecodeError as exc:
        return [f"{path}: malformed JSON (line {exc.lineno})"]
    if not isinstance(document, dict):
        return [f"{path}: not a JSON object"]
    problems = []
    if document.get("conformsTo") != CONFORMS_TO:
        problems.append(f"{path}: conformsTo: not {CONFORMS_TO}")
    for key in ("rai:dataAnnotationProtocol", "rai:dataAnnotationPlatform", "rai:annotationsPerItem",
                "rai:annotatorDemographics", "rai:machineAnnotationTools"):
        if not document.get(key):
            problems.append(f"{path}: {key}: missing")
    named = set()
    for number, entry in enumerate(document.get("distribution") or [], start=1):
        where = f"{path}: distribution[{number}]"
        url = entry.get("contentUrl") if isinstance(entry, dict) else None
        relative = PurePosixPath(url) if isinstance(url, str) else None
        if relative is None or relative.is_absolute() or ".." in relative.parts or ":" in url:
            problems.append(f"{where}: contentUrl: not a file inside the folder")
            continue
        named.add(url)
        file = folder / relative
        if not file.is_file():
            problems.append(f"{where}: contentUrl: no such file in the folder")
        elif entry.get("sha256") != sha256_of(file):
            problems.append(f"{where}: sha256: does not match {url}")
    for record_set in document.get("recordSet") or []:
        for fld in (record_set.get("field") or []) if isinstance(record_set, dict) else []:
            source = ((fld.get("source") or {}).get("fileObject") or {}).get("@id") if isinstance(fld, dict) else None
            if source not in named:
                problems.append(f"{path}: recordSet {record_set.get('@id')}: field {fld.get('@id')}: "
                                "source is not a file of the distribution")
                break
    return problems



# -- the release's document --------------------------------------------------------------------------------
def _schema_type(declared: str) -> str:
    """A release schema's column type ("integer|null", "string", ...) as a Croissant data type key."""
    return "integer" if declared.split("|")[0] == "integer" else "text"


def release_document(release, folder: Path, schema: dict) -> dict:
    """The Croissant document of a release written into `folder` (sense7.privacy.release.write_release): its
    JSONL and CSV files with their checksums, one record set per table read from its CSV, and the RAI
    fields from the release's taxonomy, its ratings and the study's facts (`release.study`, when known)."""
    tax = release.taxonomy
    controls = set(tax.controls)
    counts = annotation_counts(((r["conversation_id"], r["turn_index"]), r["rater_id"])
                               for r in release.tables["ratings"] if r["dimension"] in controls)
    rai = rai_fields(tax, getattr(release, "study", None), counts, release.period,
                     traits=f"generalized until every combination is shared by at least {release.k} raters; "
                            "'*' = suppressed")
    files, tables = {}, []
    for name, entry in schema["files"].items():
        files[entry["jsonl"]] = f"the {name} table, one JSON object a line"
        files[entry["csv"]] = f"the {name} table as CSV"
        columns = entry.get("csv_columns") or list(entry["columns"])
        described = {c: (_schema_type(v["type"]), v["description"]) for c, v in entry["columns"].items()}
        described.update({"message_index": ("integer", "the message's index in the conversation (turn_index)"),
                          "role": ("text", "user or assistant"),
                          "content": ("text", "the message, personal details replaced by [TYPE_n]")})
        tables.append(RecordTable(name, entry["csv"], f"the release's {name} ({entry['rows']} rows)",
                                  tuple(Column(c, *described[c]) for c in columns)))
    return croissant_document(folder, "sense7 study release", "Per-turn empathy ratings of assistant conversations, "
                              "anonymized: scrubbed texts, k-anonymous rater traits, new random ids.", files, tables,
                              rai, "Other: the study's licence and terms of use (see README.md)",
                              keywords=["empathy", "perspectivism", "human-AI conversation", "ratings"])


def croissant_texts(document: dict):
    """Every string of a Croissant document a release's scan must read: all but its `@context` and
    `conformsTo` (the vocabulary's URLs) and the files' `sha256` (checked against the files themselves)."""
    def walk(value, key=None):
        if key in ("@context", "conformsTo", "sha256"):
            return
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, k)
        elif isinstance(value, list):
            for v in value:
                yield from walk(v, key)
    yield from walk(document)
