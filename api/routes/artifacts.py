"""Exported files of a study (launch script, best params, kernel configs, report): list and download."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Path, Response, status

from api.deps import RepoDep, RunDep
from api.schemas import NOT_FOUND, UNAVAILABLE, ArtifactOut

router = APIRouter(prefix="/api/studies", tags=["artifacts"], responses=UNAVAILABLE)

_TYPES = {
    ".sh": "text/x-shellscript",
    ".json": "application/json",
    ".md": "text/markdown",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".txt": "text/plain",
    ".py": "text/x-python",
    ".html": "text/html",
}


MEDIA_TYPES = sorted({*_TYPES.values(), "application/octet-stream"})
"""Every media type a download can have (what the OpenAPI description lists)."""


def content_type(name: str) -> str:
    suffix = name[name.rfind(".") :].lower() if "." in name else ""
    ctype = _TYPES.get(suffix, "application/octet-stream")
    return f"{ctype}; charset=utf-8" if ctype.startswith("text/") or ctype.endswith("json") else ctype


@router.get("/{name}/artifacts", responses=NOT_FOUND, response_model=list[ArtifactOut])
def list_artifacts(run: RunDep, repo: RepoDep) -> list[ArtifactOut]:
    return [
        ArtifactOut(
            name=a.name,
            kind=a.kind,
            path=a.path,
            size=len(a.content or b""),
            created_at=a.created_at,
            url=f"/api/studies/{quote(run.study_name, safe='')}/artifacts/{quote(a.name, safe='')}",
        )
        for a in repo.list_artifacts(run.id)
    ]


@router.get(
    "/{name}/artifacts/{artifact_name:path}",
    response_class=Response,
    responses={200: {"content": {t: {} for t in MEDIA_TYPES}, "description": "the file itself"}, **NOT_FOUND},
)
def download_artifact(
    run: RunDep,
    repo: RepoDep,
    artifact_name: Annotated[
        str, Path(min_length=1, max_length=255, description="the name as listed; it may hold `/`")
    ],
) -> Response:
    art = repo.get_artifact(run.id, artifact_name)
    if art is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"artifact {artifact_name!r} of study {run.study_name!r} not found"
        )
    filename = art.name.rsplit("/", 1)[-1] or "artifact"
    ascii_name = filename.encode("ascii", "replace").decode().replace('"', "_").replace("\\", "_")
    disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"
    return Response(
        content=art.content or b"",
        media_type=content_type(filename),
        headers={"Content-Disposition": disposition},
    )
