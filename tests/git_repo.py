"""A throwaway git repository for tests that need a project with a commit of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path


def commit_all(folder: Path, message: str = "project") -> str:
    """``git init`` (if needed) and commit everything in ``folder``; returns the commit id."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(folder)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    done = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return done.stdout.strip()
