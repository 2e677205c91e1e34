"""The server targets (``sglang``, ``command``): a real server process per trial, launched from flags checked
against the server's own parser (``flags``), watched and torn down (``launch``), loaded over HTTP (``loadgen``),
with the flag sets that failed to start remembered (``failed``)."""

from tuner.targets.sglang.target import CommandTarget, SGLangTarget

__all__ = ["CommandTarget", "SGLangTarget"]
