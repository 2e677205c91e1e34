"""The server targets: a real server process per trial, launched from flags checked against the server's own parser
(``flags``), watched and torn down (``launch``), loaded over HTTP (``loadgen``), with goodput, the greedy check and
the failed-flag memory. ``command`` (:class:`CommandTarget`, in ``target``) is any OpenAI-compatible server started
from a command; ``sglang`` (:class:`SGLangTarget`, in ``sglang_server``) is SGLang's own server."""

from tuner.targets.server.sglang_server import SGLangTarget
from tuner.targets.server.target import CommandTarget

__all__ = ["CommandTarget", "SGLangTarget"]
