"""Serving-server plumbing for the ``sglang``/``command`` targets: flags, launch/watch/teardown, verify, export."""
