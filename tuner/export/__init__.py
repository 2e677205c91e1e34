"""What a search hands the user: the launch script with its recorded figures, the best parameters and the tuned
kernel configs (``script``), and ``tuner verify``, which runs an exported script once and compares (``verify``).
"""

from tuner.export.script import LOAD_KEYS, RECORD_MARK, export_run, read_recorded, recorded_figures, render_script
from tuner.export.verify import VerifyResult, verify, verify_script

__all__ = [
    "LOAD_KEYS",
    "RECORD_MARK",
    "VerifyResult",
    "export_run",
    "read_recorded",
    "recorded_figures",
    "render_script",
    "verify",
    "verify_script",
]
