"""Every relative link in the repository's Markdown files leads somewhere: the file exists and, when the
link names a heading (`guide.md#some-heading`, `#some-heading`), the target file has that heading under
GitHub's anchor rule. Guides are moved and sections renamed; a reader who follows a link should never land
on nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def markdown_files(root: Path) -> list[Path]:
    """The repository's own Markdown: no hidden folders (.git, .sense7, virtualenvs), no installed packages or
    build output (copies whose relative links need not hold)."""
    skip = {"node_modules", "site-packages", "build", "dist"}
    return sorted(p for p in root.rglob("*.md")
                  if not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                             for part in p.relative_to(root).parts[:-1]))


def prose(text: str) -> str:
    """The text without code blocks and inline code, where brackets and parentheses are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces become hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        slug = anchor(heading)
        count = seen.get(slug, 0)
        result.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return result


def broken_links(path: Path, root: Path) -> list[str]:
    """The relative links of one file that lead nowhere, as 'file: target (why)'."""
    problems = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not ours to check
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: {target}"
        if not linked.exists():
            problems.append(f"{where} (no such file)")
        elif root.resolve() not in linked.parents and linked != root.resolve():
            problems.append(f"{where} (outside the repository)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            problems.append(f"{where} (no heading with that anchor)")
    return problems


def test_the_anchor_rule_is_githubs():
    assert anchor("Participants' rights: choosing conversations, withdrawal and erasure") == \
        "participants-rights-choosing-conversations-withdrawal-and-erasure"
    assert anchor("The `sense7` command, step 1") == "the-sense7-command-step-1"
    assert anchor("Label Studio's write ceiling: SQLite vs PostgreSQL") == \
        "label-studios-write-ceiling-sqlite-vs-postgresql"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "guide.md").write_text("# Guide\n\n## Step one\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[ok](guide.md) [ok](guide.md#step-one) [ok](#top) [web](https://example.org/x)\n\n# Top\n\n"
        "[gone](guides/missing.md) [bad anchor](guide.md#step-two) `[code](nowhere.md)`\n\n"
        "```\n[fenced](nowhere.md)\n```\n", encoding="utf-8")
    assert broken_links(tmp_path / "README.md", tmp_path) == [
        "README.md: guides/missing.md (no such file)",
        "README.md: guide.md#step-two (no heading with that anchor)",
    ]


@pytest.mark.parametrize("path", markdown_files(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    assert broken_links(path, REPO) == []
