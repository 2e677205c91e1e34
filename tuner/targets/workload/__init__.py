"""The built-in decode workload: a DeepSeek-V4-Flash-shaped decode step with random weights and real kernels
(``model``, ``ops``, ``gpu_ops``), its presets, its timing (``bench``, ``profile``), the re-measure entry point
(``run``) and the target that runs it as a trial (``target``)."""

from tuner.targets.workload.presets import PRESETS, Preset, get_preset
from tuner.targets.workload.target import WorkloadTarget

__all__ = ["PRESETS", "Preset", "WorkloadTarget", "get_preset"]
