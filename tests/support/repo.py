"""Where the repository is: tests read its files and start processes in it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
