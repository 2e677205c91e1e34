"""The SGLang plug-in ``tuner export`` wrote: Triton kernels measured faster than SGLang's own, each behind a hook.

SGLang (0.5.11 and later) calls :func:`register` at start in every scheduler process through the entry point in
the group ``sglang.srt.plugins`` (``SGLANG_PLUGINS``, when set, must name it). ``TUNER_PLUGIN_DISABLE=1`` turns it
off without uninstalling; ``pip uninstall`` removes it. ``MANIFEST.json`` beside this file says what ships, per hook
and batch bucket, with the measured figures and the file they came from, and what was left out and why.

A hook target that cannot be resolved in the installed SGLang (renamed in another release), or whose arguments
changed, gets one warning line naming it and the release; SGLang's own function then runs. Nothing here raises.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import pkgutil
from pathlib import Path

logger = logging.getLogger("tuner_sglang_plugin")
HERE = Path(__file__).resolve().parent
DISABLE_ENV = "TUNER_PLUGIN_DISABLE"


def manifest() -> dict:
    return json.loads((HERE / "MANIFEST.json").read_text())


def _release() -> str:
    try:
        import sglang

        return str(getattr(sglang, "__version__", "?"))
    except Exception:  # noqa: BLE001 - only named in a log line
        return "?"


def _resolves(hook: dict, release: str, built_for: str) -> bool:
    """Whether ``hook``'s target exists in this SGLang with the arguments it was measured with; one line if not."""
    target = hook["target"]
    try:
        fn = pkgutil.resolve_name(target)
    except Exception as exc:  # noqa: BLE001 - a renamed target is expected across releases
        logger.warning(
            "tuner plug-in: hook target %s cannot be resolved in SGLang %s (%s: %s); SGLang's own "
            "function runs (the plug-in was measured on SGLang %s)",
            target,
            release,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
            built_for,
        )
        return False
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = None
    if names is not None and names != hook["args"]:
        logger.warning(
            "tuner plug-in: hook target %s in SGLang %s takes (%s), not (%s) as measured on SGLang %s; "
            "SGLang's own function runs",
            target,
            release,
            ", ".join(names),
            ", ".join(hook["args"]),
            built_for,
        )
        return False
    return True


def register() -> None:
    """The entry point: registers one hook per replaced function with SGLang's ``HookRegistry``."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        logger.debug("tuner plug-in disabled by %s", DISABLE_ENV)
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from . import hooks

        man = manifest()
        release = _release()
        done = []
        for hook in man["hooks"]:
            if not _resolves(hook, release, man["sglang"]):
                continue
            make = getattr(hooks, hook["hook"], None)
            if make is None:
                logger.warning(
                    "tuner plug-in: no hook %r in this package for %s; SGLang's own function runs",
                    hook["hook"],
                    hook["target"],
                )
                continue
            HookRegistry.register(hook["target"], make(hook, HERE), HookType[hook["hook_type"]])
            done.append(hook["target"])
        logger.info(
            "tuner plug-in %s (study %s, tuner %s) on SGLang %s: %d hook(s): %s",
            man["version"],
            man["study"],
            man["tuner_commit"],
            release,
            len(done),
            ", ".join(done) or "none",
        )
    except Exception as exc:  # noqa: BLE001 - never a crash at serve time
        logger.warning("tuner plug-in: not applied (%s: %s); SGLang runs unchanged", type(exc).__name__, exc)
