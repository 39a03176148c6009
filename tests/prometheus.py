"""Reading a Prometheus scrape in tests: parsed with ``prometheus_client``'s own parser (so a scrape that does not
parse fails the test), then looked up by sample name and labels."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    families: dict[str, str]  # family name → type
    samples: list[tuple[str, dict[str, str], float]]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels`` (0 when there are none)."""
        return sum(v for n, got, v in self.samples if n == name and labels.items() <= got.items())

    def has(self, name: str, **labels: str) -> bool:
        return any(n == name and labels.items() <= got.items() for n, got, _ in self.samples)

    def labels(self, name: str, label: str) -> set[str]:
        """The values ``label`` takes among the samples called ``name``."""
        return {got[label] for n, got, _ in self.samples if n == name and label in got}


def parse(text: str) -> Scrape:
    families = list(text_string_to_metric_families(text))
    return Scrape(
        {family.name: family.type for family in families},
        [(s.name, dict(s.labels), float(s.value)) for family in families for s in family.samples],
    )


def scrape(url: str, headers: dict[str, str] | None = None) -> Scrape:
    response = httpx.get(url, headers=headers or {}, timeout=120)  # a hang guard on a loaded machine, not a speed claim
    assert response.status_code == 200, (url, response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("text/plain"), response.headers["content-type"]
    return parse(response.text)
