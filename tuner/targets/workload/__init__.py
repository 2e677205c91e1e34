"""The built-in decode workload: a DeepSeek-V4-Flash-shaped decode step with random weights and real kernels
(``model``, ``ops``, ``gpu_ops``), its presets, its timing (``bench``, ``profile``), the re-measure entry point
(``run``) and the target that runs it as a trial (``target``).

``WorkloadTarget`` is imported on first use: the target imports torch, and what only reads the presets (the export,
the CLI's startup) should not pay for it."""

from typing import TYPE_CHECKING, Any

from tuner.targets.workload.presets import PRESETS, Preset, get_preset

if TYPE_CHECKING:
    from tuner.targets.workload.target import WorkloadTarget


def __getattr__(name: str) -> Any:
    if name == "WorkloadTarget":
        from tuner.targets.workload.target import WorkloadTarget

        return WorkloadTarget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PRESETS", "Preset", "WorkloadTarget", "get_preset"]
