"""tuner: find the fastest way to serve a large model on a GPU box, by measuring."""

__version__ = "0.1.0"
