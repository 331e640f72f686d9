"""A study taxonomy unlike the packaged one (3 controls, 7 points), for the tests that a study's own taxonomy is
used everywhere."""

from __future__ import annotations

from pathlib import Path

SEVEN_POINT_CONTROLS = ("acknowledgement", "continuity", "overall")


def write_seven_point_taxonomy(directory: Path) -> Path:
    """A study taxonomy unlike the packaged one: the packaged YAML with only two dimensions (so three
    controls with the overall rating: SEVEN_POINT_CONTROLS) on a 7-point scale."""
    import yaml

    from sense7.taxonomy import DEFAULT_TAXONOMY_PATH

    raw = yaml.safe_load(DEFAULT_TAXONOMY_PATH.read_text(encoding="utf-8"))
    raw["dimensions"] = [d for d in raw["dimensions"] if d["key"] in SEVEN_POINT_CONTROLS]
    raw["scale"] = ["Not at all", "Barely", "Slightly", "Moderately", "Clearly", "Very clearly", "Exceptionally"]
    path = Path(directory) / "study-taxonomy.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path
