"""An exported SGLang plug-in loaded into the twin as SGLang loads it, so the twin measures the command "with this
plug-in": its hooks in place of SGLang's functions where the plug-in ships a kernel, SGLang's own elsewhere.

SGLang's ``load_plugins()`` (``srt/plugins/__init__.py``) imports each plug-in's entry point, calls it (our
``register()`` registers its hooks with ``HookRegistry``) and then applies every registered hook
(``HookRegistry.apply_hooks()``, which rebinds the target and the ``from X import Y`` copies of it). The twin does the
same with the package in an export's ``sglang_plugin/`` folder, without installing it, before it builds its model:
the twin's ``glue=sglang`` then calls the hooked ``fused_q_norm_rope``. A plug-in whose hooks were not applied (a target
missing in this SGLang, ``TUNER_PLUGIN_DISABLE`` set) is refused with the reason, so that a figure "with this plug-in"
is never SGLang's own under another name.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path

from tuner.errors import KnobError


def _package(folder: Path) -> str:
    pkgs = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file() and (p / "MANIFEST.json").is_file())
    if len(pkgs) != 1:
        raise KnobError(
            f"SGLang plug-in folder {folder}: expected one package with a MANIFEST.json in it, found "
            f"{pkgs or 'none'}; give the sglang_plugin/ folder of a `tuner export`"
        )
    return pkgs[0]


def load_sglang_plugin(folder: str | Path) -> list[str]:
    """Register and apply the hooks of the plug-in in ``folder`` (an export's ``sglang_plugin/``) in this process;
    return the SGLang functions it replaced. Raises ``KnobError`` naming what is wrong when any hook did not apply."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise KnobError(f"SGLang plug-in folder {folder} does not exist; give the sglang_plugin/ folder of an export")
    name = _package(folder)
    manifest = json.loads((folder / name / "MANIFEST.json").read_text())
    targets = [h["target"] for h in manifest.get("hooks", [])]
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry

        before = {t: pkgutil.resolve_name(t) for t in targets}
    except Exception as exc:  # noqa: BLE001 - an SGLang without the plug-in system, or a renamed target
        raise KnobError(
            f"SGLang plug-in {folder}: its hook targets do not resolve in the installed SGLang ({type(exc).__name__}: "
            f"{exc}); it was built for SGLang {manifest.get('sglang')}"
        ) from None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    importlib.import_module(name).register()
    HookRegistry.apply_hooks()
    missing = [t for t in targets if pkgutil.resolve_name(t) is before[t]]
    if missing:
        raise KnobError(
            f"SGLang plug-in {folder}: its hook on {', '.join(missing)} was not applied (its log line says why; "
            "TUNER_PLUGIN_DISABLE unset?); nothing is measured with it"
        )
    return targets
