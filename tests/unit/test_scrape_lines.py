"""daemons._scrape.Lines writes what prometheus-client's encoders write, byte for byte, for any label value."""

from __future__ import annotations

import pytest
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from daemons._scrape import Lines

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# Plain queue names and "_other" take the template; the others (a quote, a backslash, a newline, the template's
# own marker) must still come out as the encoder escapes them.
LABELS = ["orders", "queue-00042", "_other", 'say "hi"', "back\\slash", "two\nlines", "@mq@", "a@mq@b", ""]


class _One:
    def __init__(self, family: GaugeMetricFamily | CounterMetricFamily) -> None:
        self.family = family

    def collect(self):  # type: ignore[no-untyped-def]
        yield self.family


@pytest.mark.parametrize("accept", ["", OPENMETRICS], ids=["text", "openmetrics"])
@pytest.mark.parametrize("counter", [False, True], ids=["gauge", "counter"])
def test_lines_are_the_encoders_own(accept: str, counter: bool) -> None:
    encoder, content_type = choose_encoder(accept)
    lines = Lines(encoder, openmetrics=content_type.startswith("application/openmetrics"))
    for round_, labels in enumerate([LABELS[:3], LABELS, LABELS[::-1]]):  # new labels arrive over several scrapes
        values = {label: float(i * 7 + round_) / 3 for i, label in enumerate(labels)}
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        family = kind("mq_queue_thing", "A thing per queue.", labels=["queue"])
        for label in labels:
            family.add_metric([label], values[label])
        want = encoder(_One(family)).decode()
        if lines.openmetrics:
            want = want[: -len("# EOF\n")]
        assert lines.family("mq_queue_thing", "A thing per queue.", values, labels, counter=counter) == want
