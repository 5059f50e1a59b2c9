"""Worked examples of mq, run from the repository root (``python -m examples.<name>``); see docs/examples.md."""
