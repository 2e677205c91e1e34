"""The environment fingerprint's commit: read only from the git checkout the ``tuner`` package itself is in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tuner.fingerprint import git_sha


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip


def _repo(path: Path, package: str) -> str:
    """A git repository at ``path`` with a package folder at ``package`` (relative), committed; its HEAD."""
    pkg = path / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    _git(path, "init", "-q")
    _git(path, "add", ".")
    _git(path, "commit", "-qm", "one")
    return _git(path, "rev-parse", "HEAD")


def test_commit_of_the_checkout_the_package_is_in_and_dirty_when_changed(tmp_path) -> None:
    head = _repo(tmp_path / "checkout", "tuner")
    assert git_sha(tmp_path / "checkout" / "tuner") == head
    (tmp_path / "checkout" / "tuner" / "__init__.py").write_text("x = 1\n")
    assert git_sha(tmp_path / "checkout" / "tuner") == head + "-dirty"


def test_an_install_copied_into_another_repository_records_no_commit(tmp_path) -> None:
    _repo(tmp_path / "other", "vendor/site-packages/tuner")  # the enclosing repository is not tuner's
    assert git_sha(tmp_path / "other" / "vendor" / "site-packages" / "tuner") is None


def test_a_package_outside_any_repository_records_no_commit(tmp_path) -> None:
    (tmp_path / "plain" / "tuner").mkdir(parents=True)
    assert git_sha(tmp_path / "plain" / "tuner") is None


def test_the_commit_a_runner_names_wins_over_a_copied_trees_stale_git(monkeypatch):
    from tuner.fingerprint import fingerprint

    monkeypatch.setenv("TUNER_COMMIT", "0819ad9")
    fp = fingerprint()
    assert fp["git_sha"] == "0819ad9" and fp["git_sha_from"] == "TUNER_COMMIT"
    monkeypatch.delenv("TUNER_COMMIT")
    assert fingerprint()["git_sha_from"] == "git"
