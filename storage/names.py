"""The one rule for study names, checked wherever a study is created (``tuner search``, ``POST /api/searches``,
``Repo.create_run``): a name is one URL path segment and one file name, so every per-study route and the export
folder can hold it as it is."""

from __future__ import annotations

import re

STUDY_NAME_MAX = 200
STUDY_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.,=+-]{{0,{STUDY_NAME_MAX - 1}}}$"
"""A letter or digit, then letters, digits and ``_ . , = + -`` (kernel sub-studies are named
``<study>.kernels.<kernel>.<dim>=<n>,...``); at most :data:`STUDY_NAME_MAX` characters."""
_RULE = re.compile(STUDY_NAME_PATTERN)


class StudyNameError(ValueError):
    """A study name breaks the rule of :data:`STUDY_NAME_PATTERN`."""


def check_study_name(name: str) -> str:
    """Return ``name`` when it follows the rule; raise :class:`StudyNameError` with the fix otherwise."""
    if _RULE.fullmatch(name):
        return name
    if not name:
        why = "it is empty"
    elif len(name) > STUDY_NAME_MAX:
        why = f"it has {len(name)} characters, more than {STUDY_NAME_MAX}"
    elif not name[0].isascii() or not name[0].isalnum():
        why = f"it starts with {name[0]!r}"
    else:
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "_.,=+-"))})
        why = "it holds " + " ".join(repr(c) for c in bad)
    suggestion = re.sub(r"[^A-Za-z0-9_.,=+-]+", "-", name).strip("-._,=+")[:40] or "study1"
    raise StudyNameError(
        f"study name {name[:80]!r} is not allowed: {why}; use a letter or digit, then letters, digits and "
        f"_ . , = + - (at most {STUDY_NAME_MAX} characters), e.g. --study {suggestion}"
    )
