"""stenograph: record an agent run to a durable log, replay it bit for bit."""

__version__ = "0.1.0"
