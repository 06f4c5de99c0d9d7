"""GET /metrics: an authorized scrape and one sample of it."""

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "metrics-token-123"


def scrape(client=None) -> dict:
    """{(sample name, frozenset(labels)): value} of one authorized scrape."""
    response = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))
