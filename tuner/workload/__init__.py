"""The built-in decode workload: a DeepSeek-V4-Flash-shaped decode step with random weights, real kernels."""

from tuner.workload.presets import PRESETS, Preset, get_preset

__all__ = ["PRESETS", "Preset", "get_preset"]
