"""Every internal link of README.md and docs/*.md resolves: to a file or folder in the repository and, with a
``#anchor``, to a heading of the page it names, slugged as GitHub slugs headings."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) or ![alt](target), the target up to the first space or closing parenthesis
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links reduced to their text, lowercased, every character that is not a
    letter, digit, underscore, hyphen or space removed, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings; a repeated slug gets ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in _prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """``line: target (why)`` for every internal link of ``page`` that does not resolve."""
    problems = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if EXTERNAL.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            if root.resolve() not in (resolved, *resolved.parents):
                problems.append(f"{page.name}:{number}: {target} (outside the repository)")
            elif not resolved.exists():
                problems.append(f"{page.name}:{number}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{page.name}:{number}: {target} (no heading #{anchor} in {resolved.name})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_internal_link_resolves(page):
    assert broken_links(page) == []


def test_slugs_follow_github():
    assert slug("The `--full` schedule") == "the---full-schedule"
    assert slug("PreTTR e = 128, the shipped PreTTR") == "prettr-e--128-the-shipped-prettr"
    assert slug("MORES 2×IB: how it's trained (Reuse-S1)") == "mores-2ib-how-its-trained-reuse-s1"
    assert slug("On a [GPU](search.md)") == "on-a-gpu"
    assert anchors("# Results\n## Results\n```\n## Not a heading\n```\n## Results\n") == {
        "results", "results-1", "results-2"}


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#a-section) [self](#page) [web](https://example.com/x#y) `[code](missing.md)`\n"
        "[gone](missing.md) [bad anchor](other.md#no-section) [bad self](#nowhere)\n"
        "```\n[in a code block](missing.md)\n```\n"
        "[outside](../../elsewhere.md)\n")
    assert broken_links(page, root=tmp_path) == [
        "page.md:4: missing.md (no such file)",
        "page.md:4: other.md#no-section (no heading #no-section in other.md)",
        "page.md:4: #nowhere (no heading #nowhere in page.md)",
        "page.md:8: ../../elsewhere.md (outside the repository)",
    ]
