"""Typed settings: what a space's ``settings:`` and ``--set KEY=VALUE`` may say, with each default in one place.

Every target declares its settings as a :class:`Settings` model (``Target.Settings``); the search's own keys are in
:class:`CommonSettings`, which every target's model extends. :meth:`Settings.parse` refuses a key no field
declares with one line naming the key and the closest valid one, and a value of the wrong type naming the key, the
value and the type, so a misspelt setting is never silently ignored.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import SettingsError

S = TypeVar("S", bound="Settings")

RUN_KEYS = ("run_pid", "run_host", "hardware", "out_dir", "space_path")
"""What a search records about itself beside the target's settings in the stored run (never a target setting)."""
LEGACY_RUN_KEYS = ("pid", "host")
"""The same record as written before 2026-11-30, when ``host`` was the machine's name (not a bind address)."""


class Settings(BaseModel):
    """A typed settings model: unknown keys are refused, values are checked and converted (``"true"`` -> True)."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    @classmethod
    def parse(cls: type[S], raw: Mapping[str, Any] | None, *, owner: str) -> S:
        """The settings in ``raw`` for ``owner`` (e.g. "target `workload`"); :class:`SettingsError` when a key is
        unknown (naming the closest valid one) or a value does not fit its field."""
        raw = dict(raw or {})
        known = sorted(cls.model_fields)
        for key in raw:
            if key not in cls.model_fields:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                hint = f"did you mean `{close[0]}`?" if close else "its settings are: " + ", ".join(known)
                raise SettingsError(f"setting `{key}` is not a setting of {owner}; {hint}")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "?"
            raise SettingsError(
                f"setting `{where}` of {owner}: {err['msg'].lower()}, but got "
                f"{err.get('input')!r}; fix it in the space's settings or with --set {where}=..."
            ) from None


class CommonSettings(Settings):
    """The keys the search itself reads; every target accepts them."""

    trial_timeout_s: float = Field(0.0, ge=0)
    """Seconds one trial may run (0: a share of the budget, more for the baseline)."""
    kernel_phase: bool = False
    """Tune the kernels at the shapes this space's configurations produce before the first trial (GPU only)."""
    kernel_phase_share: float = Field(0.2, gt=0, lt=1)
    """Share of the time for trials the kernel phase may take."""
    kernel_phase_settings: dict[str, Any] = Field(default_factory=dict)
    """Settings of the kernels target for the kernel phase (e.g. ``{compile_ahead: 2, retune: true}``)."""
    kernel_config_dir: str | None = None
    """Folder of tuned kernel config files the trials (and the export) use (``$TUNER_KERNEL_CONFIG_DIR``)."""
    seed: int = 0
    """Seed of the trials' random inputs."""
    baseline_runs: int | None = Field(None, ge=1)
    """Times the baseline (the space's defaults) is timed before any other trial, so its spread is known before any
    "x baseline" is shown (default: the target's ``baseline_runs``)."""
    noise_tolerance: float = Field(0.10, ge=0)
    """How far (max - min, over the median) the winner's runs may differ before it is run again (at the end)."""
    fail_fast_after: int = Field(8, ge=0)
    """End the search after this many trials in a row failed the same way (same outcome and reason); 0: never."""
    deployable_only: bool = False
    """Explore only the knob values the exported SGLang command can set on this GPU (a space's ``server:`` marks the
    others ``not_deployable`` or names what SGLang runs with ``deploys_as``), so the best is the command."""


def target_settings(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored run's settings without the search's record of itself (:data:`RUN_KEYS`, and in runs written before
    the record had its own keys, ``pid`` and the machine's name stored as ``host``)."""
    out = {k: v for k, v in (stored or {}).items() if k not in RUN_KEYS}
    if "pid" in out:  # the old layout: its `host` is the search's machine, not the server's bind address
        for k in LEGACY_RUN_KEYS:
            out.pop(k, None)
    return out


__all__ = ["CommonSettings", "RUN_KEYS", "Settings", "target_settings"]
