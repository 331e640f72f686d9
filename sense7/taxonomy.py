"""The empathy taxonomy (labeling_config/taxonomy.yaml) and the Label Studio configs rendered from it.

Everything that names a rating control -- the labeling XML, the importer's context checks, the rater
models' targets and the ML backend's predictions -- reads it from here, so editing the YAML file is the
only step needed to change the interface.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import sense7.labeling_config as labeling_config
from sense7.files import YAMLInputError, load_yaml

DEFAULT_TAXONOMY_PATH = Path(labeling_config.__file__).with_name("taxonomy.yaml")
RATING_CONFIG_PATH = DEFAULT_TAXONOMY_PATH.with_name("rating.xml")
PROFILE_CONFIG_PATH = DEFAULT_TAXONOMY_PATH.with_name("profile.xml")

# Names of the object tags in the rating template; predictions and annotations point at TURN_TAG.
HISTORY_TAG = "history"
TURN_TAG = "turn"
PROFILE_OBJECT_TAG = "profile_intro"


class TaxonomyError(ValueError):
    """The taxonomy file is malformed."""


@dataclass(frozen=True)
class Dimension:
    key: str
    title: str
    definition: str
    low: str = ""
    high: str = ""


@dataclass(frozen=True)
class InstructedItem:
    """An instructed-response item ("to show you are reading, choose 2 here"): shown on a share of the rater
    page's turns under the rating form, answered like a rating, checked against `expected`. Never sent to
    Label Studio and never trained on: it checks attention, not empathy."""

    key: str
    prompt: str
    expected: int


@dataclass(frozen=True)
class Field:
    """A questionnaire or context field: an int in [min, max] or one of `choices`."""

    key: str
    title: str
    type: str  # "int" | "choice"
    choices: tuple[str, ...] = ()
    min: int | None = None
    max: int | None = None

    def validate(self, value) -> object:
        """Return the normalised value or raise ValueError with a reason a person can act on."""
        if self.type == "int":
            if isinstance(value, bool):
                raise ValueError(f"expected an integer {self.min}-{self.max}, got {value!r}")
            try:
                number = int(str(value).strip())
            except ValueError:
                raise ValueError(f"expected an integer {self.min}-{self.max}, got {value!r}") from None
            if str(value).strip() != str(number) and not (isinstance(value, float) and value == number):
                raise ValueError(f"expected an integer {self.min}-{self.max}, got {value!r}")
            if not self.min <= number <= self.max:
                raise ValueError(f"{number} is outside {self.min}-{self.max}")
            return number
        text = str(value).strip()
        if text not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
        return text


@dataclass(frozen=True)
class Taxonomy:
    scale: tuple[str, ...]
    dimensions: tuple[Dimension, ...]
    overall: Dimension
    expectation_key: str
    expectation_title: str
    expectation_choices: tuple[tuple[str, str], ...]  # (value, label), scored 1..n in this order
    comment_key: str
    comment_title: str
    context_fields: tuple[Field, ...]
    profile_fields: tuple[Field, ...]
    source: Path = field(default=DEFAULT_TAXONOMY_PATH, compare=False)
    instructed_items: tuple[InstructedItem, ...] = ()  # optional attention checks (`instructed:` in the YAML)
    instructed_share: float = 0.0                      # share of a rater's turns that carry one

    def instructed_item(self, key: str | None) -> InstructedItem | None:
        return next((i for i in self.instructed_items if i.key == key), None) if key else None

    @property
    def levels(self) -> int:
        return len(self.scale)

    @property
    def controls(self) -> list[str]:
        """The rating controls, in interface order: the seven dimensions, then the overall rating."""
        return [d.key for d in self.dimensions] + [self.overall.key]

    @property
    def expectation_values(self) -> list[str]:
        return [value for value, _ in self.expectation_choices]

    def expectation_score(self, value: str) -> int:
        """'no' -> 1, 'partly' -> 2, 'yes' -> 3 (the order of the YAML file)."""
        return self.expectation_values.index(value) + 1


def _field(raw: dict, where: str) -> Field:
    try:
        kind = raw["type"]
        if kind == "int":
            return Field(raw["key"], raw["title"], "int", min=int(raw["min"]), max=int(raw["max"]))
        if kind == "choice":
            return Field(raw["key"], raw["title"], "choice", choices=tuple(str(c) for c in raw["choices"]))
    except KeyError as missing:
        raise TaxonomyError(f"{where}: missing {missing}") from None
    raise TaxonomyError(f"{where}: type must be int or choice, got {kind!r}")


def _instructed(raw, path: Path, levels: int) -> dict:
    """The optional `instructed:` block: {share: 0.05, items: [{key, prompt, expected}, ...]}."""
    if not raw:
        return {}
    where = f"{path}: instructed"
    try:
        share = float(raw.get("share", 0.05))
        items = tuple(InstructedItem(str(i["key"]), str(i["prompt"]), int(i["expected"])) for i in raw["items"])
    except KeyError as missing:
        raise TaxonomyError(f"{where}: missing {missing}") from None
    except (TypeError, ValueError, AttributeError):
        raise TaxonomyError(f"{where}: expected share (a number) and items (key, prompt, expected level)") from None
    if not 0 < share <= 1:
        raise TaxonomyError(f"{where}.share: expected a share in (0, 1], got {share}")
    for item in items:
        if not 1 <= item.expected <= levels:
            raise TaxonomyError(f"{where}: item {item.key!r}: expected must be a level 1-{levels}, got {item.expected}")
    if not items:
        raise TaxonomyError(f"{where}: items is empty (remove the block to ask none)")
    return {"instructed_items": items, "instructed_share": share}


def load_taxonomy(path: str | Path | None = None) -> Taxonomy:
    """The taxonomy in `path` (default: the packaged labeling_config/taxonomy.yaml), cached until the file
    changes. A missing or unreadable file is a TaxonomyError naming it."""
    path = Path(path) if path else DEFAULT_TAXONOMY_PATH
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise TaxonomyError(f"{path}: cannot read the taxonomy ({exc.strerror})") from None
    return _load_cached(path.resolve(), mtime)


def study_taxonomy(settings=None, path: str | Path | None = None) -> Taxonomy:
    """The running study's taxonomy: `path` when given (a command's --taxonomy), else settings.taxonomy_path
    (SENSE7_TAXONOMY; read from the environment when no settings are given), else the packaged default.
    Every part of a stack (Label Studio projects, import, sync, retrain, ML backend, evaluation) reads its
    taxonomy through this, so one setting changes them all."""
    if path:
        return load_taxonomy(path)
    if settings is None:
        from sense7.settings import taxonomy_path_from_env

        return load_taxonomy(taxonomy_path_from_env())
    return load_taxonomy(settings.taxonomy_path)


@lru_cache(maxsize=8)
def _load_cached(path: Path, _mtime: int) -> Taxonomy:
    try:
        raw, _ = load_yaml(path.read_text(encoding="utf-8"), path)
    except YAMLInputError as exc:
        raise TaxonomyError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaxonomyError(f"{path}: cannot read the taxonomy ({type(exc).__name__})") from None
    try:
        dims = tuple(
            Dimension(d["key"], d["title"], d["definition"], d.get("low", ""), d.get("high", ""))
            for d in raw["dimensions"]
        )
        overall = raw["overall"]
        tax = Taxonomy(
            scale=tuple(raw["scale"]),
            dimensions=dims,
            overall=Dimension(overall["key"], overall["title"], overall["definition"]),
            expectation_key=raw["expectation"]["key"],
            expectation_title=raw["expectation"]["title"],
            expectation_choices=tuple((str(c["value"]), c["label"]) for c in raw["expectation"]["choices"]),
            comment_key=raw["comment"]["key"],
            comment_title=raw["comment"]["title"],
            context_fields=tuple(_field(f, f"{path}: context_fields") for f in raw["context_fields"]),
            profile_fields=tuple(_field(f, f"{path}: profile") for f in raw["profile"]),
            source=path,
            **_instructed(raw.get("instructed"), path, len(raw["scale"])),
        )
    except (KeyError, TypeError) as exc:
        raise TaxonomyError(f"{path}: missing or malformed entry {exc}") from None
    keys = tax.controls + [tax.expectation_key, tax.comment_key, HISTORY_TAG, TURN_TAG] + \
        [i.key for i in tax.instructed_items]
    if len(set(keys)) != len(keys):
        raise TaxonomyError(f"{path}: control keys must be unique, got {keys}")
    if len(tax.scale) < 2:
        raise TaxonomyError(f"{path}: scale needs at least two labels")
    return tax


# ---------------------------------------------------------------------------------------------------
# Rendering. ElementTree does the XML escaping, so a definition may contain quotes or ampersands.


def _sub(parent: ET.Element, tag: str, **attrs) -> ET.Element:
    return ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})


def _to_xml(root: ET.Element, what: str) -> str:
    ET.indent(root, space="  ")
    header = f"<!-- {what}: generated by `sense7 config render` from labeling_config/taxonomy.yaml. Do not edit. -->\n"
    return header + ET.tostring(root, encoding="unicode") + "\n"


def render_rating_config(tax: Taxonomy) -> str:
    """One task per assistant turn: the conversation so far, the turn, then one Rating per control."""
    n = tax.levels
    root = ET.Element("View")
    style = _sub(root, "Style")
    style.text = (
        ".s7-turn { border-left: 4px solid #4a7bd0; padding-left: 8px; }"
        " .s7-def { color: #555; font-size: 90%; margin-bottom: 2px; }"
        " .s7-dim { margin: 6px 0 10px 0; }"
    )
    _sub(root, "Header", value="The conversation so far", size=4)
    _sub(root, "Paragraphs", name=HISTORY_TAG, value=f"${HISTORY_TAG}", layout="dialogue",
         nameKey="role", textKey="content")
    _sub(root, "Header", value="The response to rate", size=4)
    turn_view = _sub(root, "View", className="s7-turn")
    _sub(turn_view, "Paragraphs", name=TURN_TAG, value=f"${TURN_TAG}", layout="dialogue",
         nameKey="role", textKey="content")
    scale_text = "   ".join(f"{i} = {label}" for i, label in enumerate(tax.scale, start=1))
    _sub(root, "Header", value=f"Rate the response on each dimension ({scale_text})", size=5)
    for dim in tax.dimensions:
        box = _sub(root, "View", className="s7-dim")
        _sub(box, "Header", value=dim.title, size=5)
        _sub(box, "View", className="s7-def").append(
            ET.Element("Header", {"value": f"{dim.definition}  1: {dim.low}  {n}: {dim.high}", "size": "6",
                                  "underline": "false"}))
        _sub(box, "Rating", name=dim.key, toName=TURN_TAG, maxRating=n, required="true")
    box = _sub(root, "View", className="s7-dim")
    _sub(box, "Header", value=tax.overall.title, size=4)
    _sub(box, "View", className="s7-def").append(
        ET.Element("Header", {"value": tax.overall.definition, "size": "6", "underline": "false"}))
    _sub(box, "Rating", name=tax.overall.key, toName=TURN_TAG, maxRating=n, required="true")
    _sub(root, "Header", value=tax.expectation_title, size=5)
    choices = _sub(root, "Choices", name=tax.expectation_key, toName=TURN_TAG, choice="single-radio",
                   showInline="true", required="true")
    for value, label in tax.expectation_choices:
        _sub(choices, "Choice", value=value, alias=value, hint=label)
    _sub(root, "Header", value=tax.comment_title, size=5)
    _sub(root, "TextArea", name=tax.comment_key, toName=TURN_TAG, rows=2, maxSubmissions=1,
         editable="true", required="false")
    return _to_xml(root, "SENSE-7 per-turn rating interface")


def render_profile_config(tax: Taxonomy) -> str:
    """The rater-profile questionnaire: one task per rater; the answers become the rater's traits."""
    root = ET.Element("View")
    _sub(root, "Header", value="About you (used only to model how you perceive empathy; never shown to others)",
         size=4)
    _sub(root, "Text", name=PROFILE_OBJECT_TAG, value="$intro")
    for fld in tax.profile_fields:
        _sub(root, "Header", value=fld.title, size=6)
        values = fld.choices if fld.type == "choice" else tuple(str(v) for v in range(fld.min, fld.max + 1))
        choices = _sub(root, "Choices", name=fld.key, toName=PROFILE_OBJECT_TAG, choice="single-radio",
                       showInline="true", required="true")
        for value in values:
            _sub(choices, "Choice", value=value)
    return _to_xml(root, "SENSE-7 rater-profile questionnaire")


def render_all(tax: Taxonomy, out_dir: Path | None = None) -> dict[Path, str]:
    """The files `sense7 config render` writes (path -> content)."""
    out_dir = Path(out_dir) if out_dir else DEFAULT_TAXONOMY_PATH.parent
    return {
        out_dir / RATING_CONFIG_PATH.name: render_rating_config(tax),
        out_dir / PROFILE_CONFIG_PATH.name: render_profile_config(tax),
    }
