"""The repository's root, for every test and helper, wherever its file sits in tests/: the nearest folder
above this file that holds the project's pyproject.toml. A test file never counts `parents[n]` itself, so
that moving it to another folder changes nothing it reads."""

from __future__ import annotations

from pathlib import Path


def find_repo(start: Path) -> Path:
    """The nearest folder at or above `start` holding a pyproject.toml that names decodebench."""
    for folder in (start, *start.parents):
        project = folder / "pyproject.toml"
        if project.is_file() and 'name = "decodebench"' in project.read_text():
            return folder
    raise RuntimeError(f"no decodebench pyproject.toml at or above {start}")


REPO = find_repo(Path(__file__).resolve().parent)
