"""What a search hands the user: the launch script with its recorded figures, the best parameters and the tuned
kernel configs (``script``), and ``tuner verify``, which runs an exported script once and compares (``verify``).
"""

from tuner.export.script import LOAD_KEYS, export_run, recorded_figures, render_script
from tuner.export.verify import verify
from tuner.figures.verification import RECORD_MARK, VerifyResult, read_recorded

__all__ = [
    "LOAD_KEYS",
    "RECORD_MARK",
    "VerifyResult",
    "export_run",
    "read_recorded",
    "recorded_figures",
    "render_script",
    "verify",
]
