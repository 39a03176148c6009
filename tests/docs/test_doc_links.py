"""Every relative link in the README and docs/ reaches a file of the repository, and every ``#anchor`` a heading of
the page it names (slugged as GitHub does), so moving a section breaks a test, not a reader's click."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks import DOCS, FENCE, ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} names no file"
        if anchor:
            assert linked.suffix == ".md" and anchor in anchors(linked), f"{page.name}: {target} names no heading"


def test_the_slug_is_githubs() -> None:
    assert slug("Many machines and infrastructure faults") == "many-machines-and-infrastructure-faults"
    assert slug("Code, templates and URLs from request bodies") == "code-templates-and-urls-from-request-bodies"
    assert slug("The `polar` CLI: status") == "the-polar-cli-status"
