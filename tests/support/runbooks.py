"""The shell commands and the PromQL of docs/runbooks, read as an operator copies them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tests.support.repo import REPO

RUNBOOKS = REPO / "docs" / "runbooks"
_BLOCK = re.compile(r"^( *)```bash\n(.*?)^\1```", re.M | re.S)
_HEREDOC = re.compile(r"<<'(\w+)'")
# An inline code span that names a metric: PromQL an operator pastes into Prometheus.
_PROMQL = re.compile(r"(?<!`)`([^`\n]*(?:\blakehouse_ingest_\w+|\bup\{)[^`\n]*)`(?!`)")
# The verbs that start a Spark JVM (`service.streaming.session.build_spark`): in the
# driver's pod they would be a second JVM beside the driver's.
SPARK_VERBS = ("run", "replay-quarantine", "migrate", "promote")


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

    @property
    def exec_target(self) -> str | None:
        """The Deployment ``kubectl … exec`` runs in (``$DEPLOY``, ``$TOOLBOX``), else None."""
        if self.in_container is None:
            return None
        options = self.words[self.words.index("exec") + 1 : self.words.index("--")]
        targets = [word for word in options if not word.startswith("-")]
        return targets[0] if targets else None

    @property
    def starts_spark(self) -> bool:
        """Whether it runs a `SPARK_VERBS` command in the service's container."""
        ran = self.in_container or ()
        return ran[:1] == ("lakehouse-ingest",) and ran[1:2] != () and ran[1] in SPARK_VERBS


@dataclass(frozen=True)
class PromQL:
    """One PromQL expression of a runbook page (an inline code span naming a metric)."""

    page: str
    expr: str


def runbook_promql() -> list[PromQL]:
    """Every PromQL expression of every runbook, in page order."""
    return [
        PromQL(page.name, match.group(1))
        for page in sorted(RUNBOOKS.glob("*.md"))
        for match in _PROMQL.finditer(_BLOCK.sub("", page.read_text()))
    ]


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
