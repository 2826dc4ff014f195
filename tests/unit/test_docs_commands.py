"""Every shell command shown in README.md and docs/operator-guide.md (fenced ```sh blocks) still works:

- `vlfleet TASK ...` names a real task and only real flags, with every required positional argument, as the CLI's
  own parser (invoke) reads them; the tasks named are all in the real `vlfleet --list` output;
- `make X` names a real target, `make -n X` resolves it, and the vlfleet tasks its recipe calls exist;
- other programs exist, and files of the repository named in a command exist;
- the cheap ones (no placeholder like ARTIFACT_DIR, no ~/ path, nothing slow or networked) are run for real, in
  order, in a scratch directory holding a copy of inventory.example: copy the inventory, render the monitoring
  kit, promtool.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.paths import repo_root

ROOT = repo_root()
DOCS = ("README.md", "docs/operator-guide.md", "docs/monitoring.md")
BIN = Path(sys.executable).parent
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|^[A-Z]{3,}$")
# Commands cheap enough to run for real, by program (vlfleet: by task). Anything else is checked, not run.
RUNNABLE_PROGRAMS = {"cp", "ansible-inventory", "promtool"}
RUNNABLE_TASKS = {"--list", "monitoring.render"}


def shell_commands(text: str) -> list[list[str]]:
    """argv of every command in the ```sh blocks of ``text``: continuation lines joined, comments dropped,
    `a && b`, `a; b` and `a | b` split."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            argv: list[str] = []
            for token in lexer:
                if token in (";", "&&", "|", "||"):
                    if argv:
                        commands.append(argv)
                    argv = []
                else:
                    argv.append(token)
            if argv:
                commands.append(argv)
    return commands


def _all_commands() -> list[tuple[str, list[str]]]:
    out = []
    for doc in DOCS:
        path = ROOT / doc
        if path.is_file():
            out += [(doc, argv) for argv in shell_commands(path.read_text())]
    return out


COMMANDS = _all_commands()


def _id(item: tuple[str, list[str]]) -> str:
    return f"{item[0]}: {' '.join(item[1])[:70]}"


@pytest.fixture(scope="module")
def cli():
    from invoke.parser import Parser, ParserContext

    from ops.cli import make_program

    program = make_program()
    parser = Parser(initial=ParserContext(args=program.core_args()), contexts=program.namespace.to_contexts(),
                    ignore_unknown=False)
    return program, parser


def check_vlfleet(parser, argv: list[str]) -> list[str]:
    """Problems with one `vlfleet ...` argv (empty: fine); the task names it runs are appended to ``argv``'s check."""
    from invoke.parser import ParseError

    try:
        result = parser.parse_argv(argv[1:])
    except ParseError as e:
        return [f"`{' '.join(argv)}`: {e}"]
    problems = []
    for ctx in result[1:]:
        missing = [a.name for a in ctx.missing_positional_args]
        if missing:
            problems.append(f"`{' '.join(argv)}`: task {ctx.name} needs {', '.join(missing)}")
    if len(result) == 1 and not any(a.got_value for a in result[0].args.values()):
        problems.append(f"`{' '.join(argv)}`: names no task")
    return problems


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+):(?!=)", text, re.M)} - {".PHONY"}


def test_docs_have_commands():
    assert {doc for doc, _ in COMMANDS} == set(DOCS), "README.md or docs/operator-guide.md lost its ```sh blocks"
    assert any(argv[0] == "vlfleet" for _, argv in COMMANDS)


def test_extraction_handles_continuations_comments_and_chains():
    text = "```sh\nvlfleet site \\\n  --check   # dry\n# comment\na && b | c; d\n```\n```\nnot sh\n```\n"
    assert shell_commands(text) == [["vlfleet", "site", "--check"], ["a"], ["b"], ["c"], ["d"]]


@pytest.mark.parametrize("item", [c for c in COMMANDS if c[1][0] == "vlfleet"], ids=_id)
def test_vlfleet_command_parses(item, cli):
    _program, parser = cli
    assert check_vlfleet(parser, item[1]) == []


def test_parser_check_catches_rot(cli):
    _program, parser = cli
    assert check_vlfleet(parser, ["vlfleet", "site", "--no-such-flag"])
    assert check_vlfleet(parser, ["vlfleet", "no.such.task"])
    assert check_vlfleet(parser, ["vlfleet", "model.verify"])  # a required positional missing
    assert check_vlfleet(parser, ["vlfleet", "model.verify", "DIR"]) == []


def test_every_documented_task_is_listed_by_the_real_cli():
    done = subprocess.run([str(BIN / "vlfleet"), "--list"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = {ln.split()[0] for ln in done.stdout.splitlines()[1:] if ln.strip() and ln.startswith("  ")
              and not ln.startswith("    ")}
    named = {argv[1] for _, argv in COMMANDS if argv[0] == "vlfleet" and not argv[1].startswith("-")}
    assert named - listed == set()


@pytest.mark.parametrize("item", [c for c in COMMANDS if c[1][0] == "make"], ids=_id)
def test_make_target_exists_and_resolves(item, cli):
    _program, parser = cli
    targets = [a for a in item[1][1:] if not a.startswith("-") and "=" not in a]
    assert targets, item
    for target in targets:
        assert target in make_targets(), f"make {target}: no such target in the Makefile"
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        for line in dry.stdout.splitlines():
            words = shlex.split(line)
            if words and words[0].endswith("/vlfleet"):
                assert check_vlfleet(parser, ["vlfleet", *words[1:]]) == [], f"make {target} runs `{line}`"


@pytest.mark.parametrize("item", [c for c in COMMANDS if c[1][0] not in ("vlfleet", "make")], ids=_id)
def test_other_programs_and_repo_files_exist(item):
    argv = item[1]
    program = argv[0]
    if program in (".", "source"):
        assert argv[1].startswith(".venv/"), f"sourcing {argv[1]}: only the venv's activate script is expected"
    else:
        found = shutil.which(program) or (BIN / program).exists()
        assert found, f"`{' '.join(argv)}`: {program} not installed (controller extra or .ci/apt-packages/)"
    for arg in argv[1:]:
        if re.match(r"^(ops|roles|docs|templates|service|tests|\.ci)/", arg) and not PLACEHOLDER.search(arg):
            assert (ROOT / arg).exists(), f"`{' '.join(argv)}`: {arg} does not exist"


def test_cheap_commands_run_for_real(tmp_path):
    """The guide's inventory -> monitoring -> promtool steps, executed as written, in a scratch directory."""
    shutil.copyfile(ROOT / "inventory.example", tmp_path / "inventory.example")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for doc, argv in COMMANDS:
        if any(PLACEHOLDER.search(a) or a.startswith("~") for a in argv):
            continue  # placeholders and the reader's own files (a staging fleet's inventory) are checked, not run
        if tuple(argv) in seen:
            continue  # the same command in two documents runs once
        seen.add(tuple(argv))
        task = argv[1] if argv[0] == "vlfleet" and len(argv) > 1 else None
        if argv[0] in RUNNABLE_PROGRAMS or task in RUNNABLE_TASKS:
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                                  stdin=subprocess.DEVNULL)
            assert done.returncode == 0, f"{doc}: `{' '.join(argv)}` failed:\n{done.stdout}\n{done.stderr}"
            ran.append(" ".join(argv[:2]))
    assert {"cp inventory.example", "vlfleet monitoring.render", "promtool check", "vlfleet --list"} <= set(ran), ran
    assert (tmp_path / "monitoring" / "prometheus.yml").is_file()
