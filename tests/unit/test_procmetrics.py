"""daemons._procmetrics.combine: what ``GET /metrics`` of ``mq --processes N`` adds up (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from daemons._procmetrics import combine

OWN = """# HELP mq_messages_sent_total Messages stored.
# TYPE mq_messages_sent_total counter
mq_messages_sent_total{queue="a"} 3.0
# HELP mq_queue_messages_ready Messages ready.
# TYPE mq_queue_messages_ready gauge
mq_queue_messages_ready{queue="a"} 7.0
# HELP mq_http_request_duration_seconds Requests.
# TYPE mq_http_request_duration_seconds histogram
mq_http_request_duration_seconds_bucket{le="0.1",method="GET",route="/",status="200"} 1.0
mq_http_request_duration_seconds_bucket{le="+Inf",method="GET",route="/",status="200"} 2.0
mq_http_request_duration_seconds_count{method="GET",route="/",status="200"} 2.0
mq_http_request_duration_seconds_sum{method="GET",route="/",status="200"} 0.5
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 100.0
"""
SIBLING = """# HELP mq_messages_sent_total Messages stored.
# TYPE mq_messages_sent_total counter
mq_messages_sent_total{queue="a"} 4.0
mq_messages_sent_total{queue="b"} 1.0
# HELP mq_queue_messages_ready Messages ready.
# TYPE mq_queue_messages_ready gauge
mq_queue_messages_ready{queue="a"} 6.0
# HELP mq_http_request_duration_seconds Requests.
# TYPE mq_http_request_duration_seconds histogram
mq_http_request_duration_seconds_bucket{le="0.1",method="GET",route="/",status="200"} 5.0
mq_http_request_duration_seconds_bucket{le="+Inf",method="GET",route="/",status="200"} 5.0
mq_http_request_duration_seconds_count{method="GET",route="/",status="200"} 5.0
mq_http_request_duration_seconds_sum{method="GET",route="/",status="200"} 0.25
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 50.0
"""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_histograms_and_process_memory_add_up_and_the_roots_gauges_are_the_answering_workers() -> None:
    out = samples(generate_latest(combine(OWN, [SIBLING])).decode())  # a collector list, as the encoders read it
    assert out[("mq_messages_sent_total", (("queue", "a"),))] == 7
    assert out[("mq_messages_sent_total", (("queue", "b"),))] == 1  # a series only the sibling has
    assert out[("mq_queue_messages_ready", (("queue", "a"),))] == 7  # a view of the root: not summed
    labels = (("method", "GET"), ("route", "/"), ("status", "200"))
    assert out[("mq_http_request_duration_seconds_bucket", (("le", "0.1"), *labels))] == 6
    assert out[("mq_http_request_duration_seconds_count", labels)] == 7
    assert out[("mq_http_request_duration_seconds_sum", labels)] == 0.75
    assert out[("process_resident_memory_bytes", ())] == 150
    assert out[("mq_processes", ())] == 2


def test_without_siblings_the_answer_is_the_workers_own() -> None:
    out = samples(generate_latest(combine(OWN, [])).decode())  # a collector list, as the encoders read it
    assert out[("mq_messages_sent_total", (("queue", "a"),))] == 3
    assert out[("mq_processes", ())] == 1
