"""The shell commands of docs/runbooks, read as an operator copies them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tests.support.repo import REPO

RUNBOOKS = REPO / "docs" / "runbooks"
_BLOCK = re.compile(r"^( *)```bash\n(.*?)^\1```", re.M | re.S)
_HEREDOC = re.compile(r"<<'(\w+)'")


@dataclass(frozen=True)
class Command:
    """One simple command of a runbook line: its words and the here-document it reads."""

    page: str
    line: str
    words: tuple[str, ...]
    stdin: str | None

    @property
    def in_container(self) -> tuple[str, ...] | None:
        """What ``kubectl … exec … -- CMD`` runs in the service's container, else None."""
        if self.words[:1] != ("kubectl",) or "exec" not in self.words or "--" not in self.words:
            return None
        return self.words[self.words.index("--") + 1 :]


def runbook_commands() -> list[Command]:
    """Every simple command of every ``bash`` block of the runbooks, in page order."""
    found = []
    for page in sorted(RUNBOOKS.glob("*.md")):
        for block in _BLOCK.finditer(page.read_text()):
            indent = len(block.group(1))
            lines = [line[indent:] for line in block.group(2).splitlines()]
            found += _commands(page.name, lines)
    return found


def _commands(page: str, lines: list[str]) -> list[Command]:
    found: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        i += 1
        stdin = None
        heredoc = _HEREDOC.search(line)
        if heredoc:
            end = lines.index(heredoc.group(1), i)
            stdin, i = "\n".join(lines[i:end]) + "\n", end + 1
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, "|"]:
            if token and set(token) <= set("|&;<>()"):
                if words:
                    found.append(Command(page, line, tuple(words), stdin if "<" in token else None))
                words = []
            else:
                words.append(token)
    return found
