"""Every `servesim ...` command shown in README.md and docs/*.md names a real subcommand and
only flags that subcommand accepts (checked against the declared options, not by running
100 simulations); a few cheap README commands are also run end to end.

A command is a line of a fenced code block that starts with `servesim` (or
`.venv/bin/servesim`, after an optional `$ ` prompt), with backslash continuations joined.
Lines with placeholders (`FOLDER`, `PATH`, `N`, `…`, `<...>`, `path/to/`, `[flags]`) are
usage patterns, not commands, and are skipped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from simulator.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HELP_OPTIONS = {"-h", "--help"}

FENCE = re.compile(r"^\s*(```|~~~)")
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:\S*/)?servesim(?:\s+(?P<args>.*))?$")
# A word in capitals only (FOLDER, PATH, N, SCENARIO.yaml's SCENARIO) is a placeholder.
PLACEHOLDER_WORD = re.compile(r"(?<![\w-])[A-Z][A-Z_]*(?![\w-])")
PLACEHOLDER_TEXT = ("…", "...", "path/to/", "[", "]", "{", "}")
ANGLED = re.compile(r"<[^<>\s][^<>]*>")  # <model>, <path to file>: not a redirection
COMMENT = re.compile(r"\s#.*$")


@dataclass(frozen=True)
class DocCommand:
    source: str  # file:line
    text: str  # everything after `servesim`

    def __str__(self) -> str:
        return f"{self.source}: servesim {self.text}"


def fenced_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line inside a fenced code block, continuations joined."""
    out: list[tuple[int, str]] = []
    inside = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            pending = None
            continue
        if not inside:
            continue
        if pending is not None:
            start, text = pending
            line = text + " " + line.strip()
            number = start
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1].rstrip())
            continue
        pending = None
        out.append((number, line))
    return out


def strip_shell(args: str) -> str:
    """The servesim part of a shell line: before a comment, pipe, redirection or `&&`."""
    try:
        lexer = shlex.shlex(args, posix=True, punctuation_chars="|&;<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = []
        for word in lexer:
            if word and set(word) <= set("|&;<>"):
                break
            words.append(shlex.quote(word))
        return " ".join(words)
    except ValueError:  # unbalanced quotes: leave it to the checker's parse
        return args


def is_placeholder(text: str) -> bool:
    """Whether a command line (its comment removed) is a pattern rather than a command."""
    text = COMMENT.sub("", text)
    if any(p in text for p in PLACEHOLDER_TEXT) or ANGLED.search(text):
        return True
    return bool(PLACEHOLDER_WORD.search(text))


def doc_commands() -> list[DocCommand]:
    found = []
    for path in DOCS:
        for number, line in fenced_lines(path):
            match = COMMAND.match(line)
            if match is None:
                continue
            raw = match.group("args") or ""
            if is_placeholder(raw):
                continue
            args = strip_shell(raw)
            found.append(DocCommand(f"{path.relative_to(ROOT)}:{number}", args))
    return found


def command_tree() -> Any:
    return typer.main.get_command(app)


def check(command: DocCommand, root: Any) -> list[str]:
    """What is wrong with `command`: an unknown subcommand or flag, a missing value."""
    words = shlex.split(command.text)
    node, path = root, []
    while hasattr(node, "commands") and words and not words[0].startswith("-"):
        name = words.pop(0)
        if name not in node.commands:
            return [f"unknown subcommand {' '.join([*path, name])!r}"]
        node, path = node.commands[name], [*path, name]
    if hasattr(node, "commands") and not words:
        return []  # a bare group prints its help
    options = {}
    for param in node.params:
        if param.param_type_name == "option":
            for name in [*param.opts, *param.secondary_opts]:
                options[name] = param
    problems = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            continue  # an argument (scenario file, ...)
        name, has_value, _ = word.partition("=")
        if name in HELP_OPTIONS or (not path and name == "--version"):
            continue
        param = options.get(name)
        if param is None:
            problems.append(f"{' '.join(path) or 'servesim'}: unknown flag {name}")
            continue
        if param.is_flag:
            if has_value:
                problems.append(f"{name} is an on/off flag and takes no value")
        elif not has_value:
            if i >= len(words):
                problems.append(f"{name} needs a value")
            i += 1  # its value, even one that starts with '-'
    return problems


COMMANDS = doc_commands()


def test_the_docs_show_commands():
    sources = {c.source.split(":")[0] for c in COMMANDS}
    assert len(COMMANDS) >= 10 and "README.md" in sources, COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_doc_command_uses_real_subcommands_and_flags(command):
    assert check(command, command_tree()) == [], str(command)


def test_the_checker_finds_wrong_commands():
    root = command_tree()
    assert check(DocCommand("x", "run --num-instances 4 --quiet"), root) == []
    assert check(DocCommand("x", "run --loading-delay=5 --no-autoscaler"), root) == []
    assert check(DocCommand("x", "runn x.yaml"), root) == ["unknown subcommand 'runn'"]
    assert check(DocCommand("x", "run --set autoscaler=[]"), root) == ["run: unknown flag --set"]
    assert check(DocCommand("x", "convert preset --name chatbot --rte 3"), root) == [
        "convert preset: unknown flag --rte"
    ]
    assert check(DocCommand("x", "run --quiet=yes"), root) == [
        "--quiet is an on/off flag and takes no value"
    ]
    assert check(DocCommand("x", "run --rate"), root) == ["--rate needs a value"]


def test_extraction_joins_continuations_and_skips_placeholders(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text(
        "servesim run outside --a-fence\n"
        "```\n"
        "$ .venv/bin/servesim run x.yaml \\\n"
        "    --num-requests 5   # comment\n"
        "servesim validate FOLDER\n"
        "servesim run SCENARIO.yaml --seed 1\n"
        "servesim run --model <m>\n"
        "servesim replay --trace-data path/to/t.csv\n"
        "servesim run x.yaml | head -1\n"
        "```\n"
    )
    lines = [line for _, line in fenced_lines(doc)]
    found = [m.group("args") for m in map(COMMAND.match, lines) if m]
    kept = [strip_shell(f) for f in found if not is_placeholder(f)]
    assert kept == ["run x.yaml --num-requests 5", "run x.yaml"]


# A few cheap README commands, run for real (shortened with --num-requests where that is
# cheap to do): they must finish and print the summary.
END_TO_END = {
    "quickstart": "run scenarios/quickstart.yaml",
    "blis-flags": "run scenarios/quickstart.yaml --max-num-scheduled-tokens 4096",
    "scale-out": "run scenarios/quickstart.yaml --num-instances 4 --routing-policy weighted",
    "disaggregate": "run scenarios/quickstart.yaml --num-instances 4 --prefill-instances 2",
}


@pytest.mark.parametrize("name", sorted(END_TO_END))
def test_cheap_readme_commands_run(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # README's paths are relative to the repository
    prefix = END_TO_END[name]
    readme = [c for c in COMMANDS if c.source.startswith("README.md")]
    matching = [c for c in readme if c.text.startswith(prefix)]
    assert matching, f"README no longer shows `servesim {prefix} ...`"
    args = [*shlex.split(matching[0].text), "--num-requests", "50", "--quiet"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (args, res.stderr)
    assert res.stdout.startswith("=== Simulation Metrics ===\n"), res.stdout[:200]
    assert '"completed_requests": 50' in res.stdout


def test_the_repository_stands_alone() -> None:
    """Nothing a user reads or runs points outside the repository (issue 28): no sibling
    `../shared` folder, no external SPEC — servesim's own reference is docs/behaviour.md."""
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"\.\./shared|SPEC\.md|SPEC §")
    places = [root / "README.md"]
    for folder in ("docs", "notebooks", "simulator", "scenarios"):
        places += [p for p in (root / folder).rglob("*") if p.is_file()]
    offenders = [
        str(p.relative_to(root))
        for p in places
        if p.suffix in (".md", ".py", ".ipynb", ".yaml", ".yml", ".json", ".txt")
        and pattern.search(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert offenders == []
