"""``tuner verify SCRIPT``: run an exported launch script once and compare with the figures it recorded.

The script's recorded line names the target that exported it; that target re-runs it
(:meth:`tuner.targets.Target.verify_export`: a server script is launched, loaded at the recorded levels and torn down;
a workload script re-measures itself) and the result says, per level, the new figure, the recorded one and their
ratio (:class:`tuner.figures.verification.VerifyResult`). :func:`verify_stored` verifies the script a study's storage keeps
(its export's artifacts) and stores the result there (artifact ``verify.json``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tuner.errors import ExportError, TargetError
from tuner.export.script import REMEASURE_NAME, SCRIPT_NAME
from tuner.figures.verification import VerifyResult, read_recorded
from tuner.targets import get_target_class


def verify(
    path: str | Path, *, tolerance: float = 0.15, timeout_s: float = 3600.0, settings: dict[str, Any] | None = None
) -> VerifyResult:
    """Re-run ``path`` with the target it was exported by, and compare with its recorded figures."""
    rec = read_recorded(path)
    name = str(rec.get("target") or "command")  # scripts recorded before the line named their target: a server's
    try:
        cls = get_target_class(name)
    except TargetError as exc:
        raise ExportError(f"{path}: exported by target {name!r}, which cannot verify it here ({exc})") from None
    return cls.verify_export(Path(path), rec, tolerance=tolerance, timeout_s=timeout_s, settings=settings)


VERIFY_NAME = "verify.json"
"""The artifact a verification of a stored export leaves in the study's storage."""


def verify_stored(
    repo: Any,
    study: str | None,
    *,
    script: str | Path | None = None,
    tolerance: float = 0.15,
    timeout_s: float = 3600.0,
    settings: dict[str, Any] | None = None,
):
    """Verify study ``study``'s exported launch script (``script``, else the one its storage keeps from its last
    export), and store the result in that storage as the artifact :data:`VERIFY_NAME`. A study without an export:
    ``ExportError`` naming the command that makes one."""
    import tempfile

    run = repo.get_run(study) if study else next(iter(repo.list_runs()), None)
    if run is None:
        raise ExportError(f"no study {study!r} in this storage; `tuner status` lists the studies")
    with tempfile.TemporaryDirectory(prefix="tuner-verify-") as tmp:
        if script is None:
            art = repo.get_artifact(run.id, SCRIPT_NAME)
            if art is None:
                raise ExportError(
                    f"study {run.study_name!r} has no exported launch script in this storage; run "
                    f"`tuner export --study {run.study_name}` first, or give the script's path"
                )
            script = Path(tmp) / SCRIPT_NAME
            script.write_bytes(art.content)
            extra = repo.get_artifact(run.id, REMEASURE_NAME)
            if extra is not None:
                (Path(tmp) / REMEASURE_NAME).write_bytes(extra.content)
        res = verify(script, tolerance=tolerance, timeout_s=timeout_s, settings=settings)
    doc = {
        "ok": res.ok,
        "outcome": res.outcome.value,
        "metric": res.metric,
        "value": res.value,
        "recorded_value": res.recorded_value,
        "tolerance": tolerance,
        "reason": res.reason,
        "lines": res.lines(),
        "at": time.time(),
    }
    repo.add_artifacts(run.id, [("verify", VERIFY_NAME, str(script), json.dumps(doc).encode())])
    return res
