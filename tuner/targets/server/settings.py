"""Settings of the server targets (``command``, ``sglang``): the server, its launch, and the load it is measured
under. A load field left at ``None`` takes :class:`tuner.targets.server.loadgen.LoadConfig`'s default (the one
place those defaults live)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuner.settings import CommonSettings
from tuner.targets.server.goodput import GoodputSettings
from tuner.targets.server.greedy import GreedySettings
from tuner.targets.server.loadshape import LoadShapeSettings


class ServerSettings(CommonSettings, GoodputSettings, LoadShapeSettings, GreedySettings):  # the goodput search's,
    # the load shape's and the greedy check's (greedy_check)
    # the server
    model: str = ""
    """Model path or name (``--model-path``; the requests' ``model`` unless ``served_model_name``)."""
    served_model_name: str | None = None
    command: list[str] | None = None
    """``command`` target, required: an argv list with ``{port}``, ``{model}``, ``{host}`` placeholders."""
    help_command: list[str] | None = None
    """``command`` target: argv printing the flags (default: ``command + [--help]``); ``[]`` skips the check."""
    python: str | None = None
    """SGLang: the server's Python (default: this one)."""
    parser: str | None = None
    """SGLang: ``module:callable`` adding the server's options to an argparse parser."""
    host: str = "127.0.0.1"
    """The address the server binds, in trials and in the exported launch script."""
    port: int = Field(30000, ge=1, le=65535)
    """The port written into the exported launch script (``$PORT`` overrides it there)."""
    port_range: str = "30000-30999"
    """Ports a trial may pick from."""
    gpus: int | None = Field(None, ge=0)
    """GPUs one launch takes when no ``--tp-size`` says so (default: the target's)."""
    extra_args: list[str] = Field(default_factory=list)
    """Fixed flags of every launch."""
    env: dict[str, str] = Field(default_factory=dict)
    """Fixed environment of every launch."""
    moe_config_dir: str | None = None
    """Fused-MoE configs, exported as ``SGLANG_MOE_CONFIG_DIR``."""
    moe: dict[str, int] | None = None
    """SGLang's MoE dims (hidden, width, experts, topk), for a kernel phase."""
    torch_compile_supported: bool | None = None
    """False when the model or build is known to reject torch.compile."""
    # launch, readiness, teardown
    health_paths: list[str] = Field(default_factory=lambda: ["/health", "/v1/models"])
    ready_patterns: list[str] = Field(default_factory=lambda: ["The server is fired up"])
    ready_timeout_s: float = Field(1800.0, gt=0)
    """Readiness limit (never past the trial's deadline)."""
    fatal_grace_s: float = Field(2.0, ge=0)
    """Seconds a server may linger after a fatal log line."""
    teardown_reserve_s: float = Field(15.0, ge=0)
    """Seconds kept before the deadline for teardown."""
    trial_estimate_s: float | None = Field(None, gt=0)
    """What one trial takes (start-up, warm-up, levels, teardown), for the dry-run's plan; with a goodput objective
    the plan adds the boundary search's measurements to it."""
    load_format: str | None = None
    """SGLang: ``--load-format`` of the trials only (``dummy``: random weights of the right shapes, so a large model
    starts without reading its weights); the exported launch keeps the real weights."""
    probe_launch: bool = False
    """Dry-run: start the server once with the defaults and time it, for the plan (instead of the estimate)."""
    state_dir: str | None = None
    """No longer read: the failed-flag memory is kept in the study's storage (accepted so older spaces load)."""
    allow_retry: bool = False
    """Run a flag set whose launch failed before anyway."""
    failed_scope: Literal["study", "storage"] = "study"
    """Where the failed-flag memory refuses a launch: failures of this study only (``study``), or of every study in
    the storage (``storage``)."""
    # the load (None: LoadConfig's default)
    levels: list[int] | None = None
    """Concurrency levels (default: the objective's)."""
    api: str | None = None
    prompt_len: int | None = Field(None, ge=1)
    output_len: int | None = Field(None, ge=1)
    length_jitter: float | None = None
    dataset: str | None = None
    requests_per_level: int | None = Field(None, ge=1)
    rounds: int | None = Field(None, ge=1)
    min_requests: int | None = Field(None, ge=1)
    level_s: float | None = Field(None, ge=0)
    """Seconds each level is measured for at least (3) unless ``requests_per_level`` fixes the count."""
    warmup_requests: int | None = Field(None, ge=0)
    """Requests the warm-up sends at least (1); it goes on until the time to first token settles."""
    warmup_s: float | None = Field(None, ge=0)
    """The warm-up's limit in seconds (30)."""
    warmup_max_requests: int | None = Field(None, ge=1)
    """The warm-up's limit in requests (64)."""
    tokenizer: str | None = None
    """The tokenizer counting the streamed text of a server that sends no usage (default: ``model``)."""
    # max_error_rate, min_delivered: GoodputSettings's (the levels' rules and the boundary search's alike)
    request_timeout_s: float | None = Field(None, gt=0)
    ignore_eos: bool | None = None
    """Send ``ignore_eos``: true always, false never, unset when the server accepts it (the first request finds
    out)."""
    extra_body: dict[str, Any] | None = None
