"""piworkflows: the Pi Workflows durable workflow server."""

__version__ = "0.1.0"
