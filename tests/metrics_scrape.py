"""Reading a Prometheus endpoint in tests: GET /metrics and parse it with prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Scraped = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Scraped:
    """``{(sample name, sorted labels): value}`` of the text at ``url`` (which must answer 200)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
