"""Every fenced block of README.md and docs/*.md is checked, by the marker comment on the line before it, so an
example cannot drift from the code:

    <!-- check: run -->                  run by bash (-e, pipefail) in a temporary directory, the venv on PATH
    <!-- check: static (why) -->         every `octo-dist ...` (or `python3 -m octo_dist ...`) accepted by the real
                                         argument parser, parsed only; every `make X` a target of the Makefile
    <!-- check: output FILE -->          an excerpt of FILE (scripts/jobs/* re-rendered by `octo-dist launch`)
    <!-- check: rendered FILE -->        the whole FILE as the run block just before it writes it (`-o FILE`)
    <!-- check: recorded (why) -->       output of a cluster, a GPU or a timing that cannot be reproduced here
    <!-- check: code -->                 source code shown, not a command

A block without one fails. The run blocks take seconds (renders, check-env, detect): the JAX jobs are static, and
`make smoke` itself runs in tests/test_smoke.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import HANG_S, REPO, clean_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
KINDS = ("run", "static", "output", "rendered", "recorded", "code")
# "<!-- check: recorded (a 20 s run of 3 processes) -->" -> kind "recorded", argument "(a 20 s run of 3 processes)"
MARKER = re.compile(r"^<!-- check: (\S+)\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    kind: str | None  # None: no marker
    arg: str
    text: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list:
    """The fenced blocks of one Markdown file, each with the marker on the last non-blank line before it."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARKER.match(before.strip())
        found.append(
            Block(
                path,
                i + 1,
                m.group(1) if m else None,
                m.group(2) if m else "",
                "\n".join(lines[i + 1 : end]) + "\n",
            )
        )
        i = end + 1
    return found


ALL = [b for p in DOCS for b in blocks(p)]


def of_kind(kind: str) -> list:
    return [pytest.param(b, id=str(b)) for b in ALL if b.kind == kind]


def test_every_block_has_a_known_marker():
    bad = [f"{b}: {b.kind or 'no marker'}" for b in ALL if b.kind not in KINDS]
    assert not bad, f"blocks without a <!-- check: {'|'.join(KINDS)} --> marker: {bad}"
    unexplained = [str(b) for b in ALL if b.kind in ("static", "recorded") and not b.arg]
    assert not unexplained, f"static and recorded blocks say why they are not run: {unexplained}"


# ---- static: the commands a block shows, parsed ---------------------------------------------------------------------


def commands(text: str) -> list:
    """A block's shell commands as token lists, one per simple command: continuation lines joined, comments dropped,
    `"$(octo-dist completion bash)"` opened up. ``"a | b && c"`` -> [["a"], ["b"], ["c"]]."""
    out = []
    for line in text.replace("\\\n", " ").split("\n"):
        line = line.replace('"$(', " ( ").replace(')"', " ) ")
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        command = []
        for tok in lex:
            if set(tok) <= set("();<>|&"):
                out.append(command)
                command = []
            else:
                command.append(tok)
        out.append(command)
    return [c for c in out if c]


def octo_dist_argv(command: list) -> list | None:
    """The arguments of the octo-dist invocation in a command, or None: ``mpirun -np 2 octo-dist smoke`` ->
    ["smoke"]; ``python3 -m octo_dist launch pbs`` -> ["launch", "pbs"]; ``cd octo-dist`` -> None."""
    for i, tok in enumerate(command):
        if tok == "octo-dist" and (i == 0 or command[i - 1] != "cd"):
            return command[i + 1 :]
        if tok == "octo_dist" and i >= 1 and command[i - 1] == "-m":
            return command[i + 1 :]
    return None


def make_targets(command: list) -> list:
    """``VAR=1 make sif PROFILE=cuda12`` -> ["sif"]; a command that is not make -> []."""
    words = [t for t in command if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", t)]
    if not words or words[0] != "make":
        return []
    return [t for t in words[1:] if not t.startswith("-") and "=" not in t]


def makefile_targets() -> set:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set()
    for m in re.finditer(r"^([A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*) *:(?!=)", text, re.M):
        targets.update(m.group(1).split())
    return targets


def parse_problem(argv: list) -> str | None:
    """None when octo-dist's own parsers accept ``argv`` (nothing runs), else what they printed. The training
    command after ``launch ... --`` is parsed by its own parser, as launch does when it renders."""
    from octo_dist import cli
    from octo_dist.apps.finetune import arguments as finetune

    if argv[:1] == ["finetune"]:
        try:
            finetune.check_command([a for a in argv[1:] if a != "--help"])
        except ValueError as e:
            return str(e)
        return None
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            cli.build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code:
            return out.getvalue().strip().splitlines()[-1]
    if argv[:1] == ["launch"] and "--" in argv:
        return parse_problem(argv[argv.index("--") + 1 :])
    return None


def test_commands_are_read_as_a_shell_reads_them():
    text = (
        "OMPI_ALLOW_RUN_AS_ROOT=1 mpirun -np 2 octo-dist smoke --steps 5 | head -3  # a comment\n"
        "cd /groups/g && git clone https://x/octo-dist && cd octo-dist\n"
        'eval "$(octo-dist completion bash)"\n'
        "python3 -m octo_dist launch pbs --nodes 2 \\\n    -- smoke\n"
        "make sif PROFILE=cuda12\n"
    )
    cmds = commands(text)
    assert [octo_dist_argv(c) for c in cmds] == [
        ["smoke", "--steps", "5"],
        None,  # head
        None,  # cd /groups/g
        None,  # git clone
        None,  # cd octo-dist
        None,  # eval
        ["completion", "bash"],
        ["launch", "pbs", "--nodes", "2", "--", "smoke"],
        None,
    ]
    assert make_targets(cmds[-1]) == ["sif"]
    assert parse_problem(["smoke", "--steps", "5"]) is None
    # What the static check catches: a misspelled flag, in a subcommand and in the training command after `--`.
    assert "--profle" in parse_problem(["check-env", "--profle", "cpu"])
    assert "--stepz" in parse_problem(
        ["launch", "pbs", "--nodes", "2", "--", "smoke", "--stepz", "3"]
    )
    assert "batch_sise" in parse_problem(["finetune", "--config.batch_sise=3"])


@pytest.mark.parametrize("block", of_kind("static") + of_kind("run"))
def test_static_block_commands_parse(block):
    targets = makefile_targets()
    problems = []
    for command in commands(block.text):
        argv = octo_dist_argv(command)
        if argv is not None:
            problem = parse_problem(argv)
            if problem:
                problems.append(f"octo-dist {shlex.join(argv)}: {problem}")
        problems += [f"make {t}: no such target" for t in make_targets(command) if t not in targets]
    assert not problems, f"{block}: {problems}"


# ---- run: executed --------------------------------------------------------------------------------------------------


def run_block(block: Block, cwd: Path) -> None:
    """Runs a block's text as a script in ``cwd`` with the venv first on PATH; fails the test unless it exits 0.
    HOME is a fresh directory there: a launch.ini of whoever runs the tests never changes what a block renders."""
    script = cwd / "block.sh"
    script.write_text(block.text, encoding="utf-8")
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    bindir = os.path.dirname(sys.executable)  # the venv's octo-dist and mpirun
    env = clean_env(PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", HOME=str(home))
    env.pop("XDG_CONFIG_HOME", None)
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, (
        f"{block} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )


@pytest.mark.parametrize("block", of_kind("run"))
def test_run_block_runs(block, tmp_path):
    run_block(block, tmp_path)


# ---- output: an excerpt of a file the test regenerates --------------------------------------------------------------


def regenerated(name: str) -> str:
    """FILE of an output marker: a ready-made job script rendered now by `octo-dist launch` (scripts/jobs/*), else
    the committed file."""
    if name.startswith("scripts/jobs/"):
        from octo_dist.jobs import examples

        return examples.rendered()[Path(name).name]
    return (REPO / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("block", of_kind("output"))
def test_output_block_is_an_excerpt(block):
    assert block.arg, f"{block}: output needs the file it shows"
    assert _contiguous(block.text, regenerated(block.arg)), (
        f"{block}: not an excerpt of {block.arg} as rendered now"
    )


def _contiguous(excerpt: str, whole: str) -> bool:
    want, have = excerpt.rstrip("\n").split("\n"), whole.split("\n")
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


# ---- rendered: the whole file the command just above writes ---------------------------------------------------------


def block_before(block: Block) -> Block | None:
    """The fenced block before ``block`` in its file (the command whose output it shows), or None."""
    earlier = [b for b in ALL if b.path == block.path and b.line < block.line]
    return earlier[-1] if earlier else None


@pytest.mark.parametrize("block", of_kind("rendered"))
def test_rendered_block_is_what_the_command_above_writes(block, tmp_path):
    """A block that says "this is the whole script" is the file the run block above it writes, byte for byte: its
    command is run (the real `octo-dist launch`) and nothing is normalised, as nothing in a rendered script varies
    with the machine, the date or the checkout's commit."""
    command = block_before(block)
    assert command is not None and command.kind == "run", (
        f"{block}: a rendered block follows the run block that writes {block.arg}"
    )
    run_block(command, tmp_path)
    written = tmp_path / block.arg
    assert written.is_file(), f"{command} wrote no {block.arg}"
    assert block.text == written.read_text(encoding="utf-8"), (
        f"{block}: not the {block.arg} that {command} writes now; replace the block with it"
    )


def checkout_of(text: str) -> str:
    """Where a block's ``cd`` commands leave you, from /: ``cd /groups/g && git clone URL && cd octo-dist`` ->
    "/groups/g/octo-dist"."""
    cwd = "/"
    for command in commands(text):
        if command[:1] == ["cd"] and len(command) == 2:
            cwd = os.path.normpath(os.path.join(cwd, command[1]))
    return cwd


def abci_blocks() -> tuple:
    """README (b)'s checkout (step 1's cd) and its fine-tune: the submit command, the run block rendering it here
    and the script shown (the rendered block after them)."""
    readme = [b for b in ALL if b.path == REPO / "README.md"]
    shown = next(b for b in readme if b.kind == "rendered")
    render = block_before(shown)
    submit = block_before(render)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.count("\n", 0, text.index("## (b) ABCI 3.0")) + 1
    first = next(b for b in readme if b.line > section)
    return checkout_of(first.text), submit, render, shown


def test_the_abci_script_shown_is_what_the_submit_command_writes(tmp_path):
    """README (b) step 5's command, rendered without `--submit --chain N` from the checkout of step 1 (`$PWD`
    written out, the image skipped as it is not here), writes the script the README shows, which is the ready-made
    scripts/jobs/abci3-pbs-finetune.sh under the name -o gives it."""
    checkout, submit, _, shown = abci_blocks()
    assert checkout == "/groups/gxx00000/octo-dist", checkout
    argv = octo_dist_argv(commands(submit.text)[0])
    assert argv[:2] == ["launch", "pbs"] and "--submit" in argv and "--chain" in argv, submit
    chain = argv.index("--chain")
    argv = [
        a.replace("$PWD", checkout) for a in argv[:chain] + argv[chain + 2 :] if a != "--submit"
    ]
    argv.insert(argv.index("--"), "--skip-image-check")
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(HOME=str(home))
    env.pop("XDG_CONFIG_HOME", None)
    octo_dist = os.path.join(os.path.dirname(sys.executable), "octo-dist")
    proc = subprocess.run(
        [octo_dist, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.returncode == 0, proc.stderr
    name = argv[argv.index("-o") + 1]
    assert shown.arg == name and shown.text == (tmp_path / name).read_text(encoding="utf-8"), (
        f"{shown} is not the script {submit}'s command writes (octo-dist {shlex.join(argv)})"
    )
    ready = (REPO / "scripts/jobs/abci3-pbs-finetune.sh").read_text(encoding="utf-8")
    assert shown.text == ready.replace("abci3-pbs-finetune.sh", name), (
        f"{shown} is not scripts/jobs/abci3-pbs-finetune.sh under the name {name}"
    )


def test_one_checkout_location_for_abci():
    """The ABCI pages name README (b)'s checkout and no other: no `$HOME/octo-dist` beside `/groups/...`."""
    checkout, *_ = abci_blocks()
    abci = (REPO / "docs" / "abci.md").read_text(encoding="utf-8")
    assert f"PYTHONPATH={checkout}" in abci, f"docs/abci.md does not name the checkout {checkout}"
    elsewhere = [
        f"{p.relative_to(REPO)}: {m.group(0)}"
        for p in DOCS
        for m in re.finditer(r"(\$HOME|~)/octo-dist(?![.\w-])", p.read_text(encoding="utf-8"))
    ]
    assert not elsewhere, f"a checkout other than {checkout}: {elsewhere}"


# ---- the README's shape: a table of contents, the user paths before the internals, links that resolve ---------------


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: "(b) ABCI 3.0: a two-node fine-tune" -> "b-abci-30-a-two-node-fine-tune"."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        file, _, frag = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: links to nothing: {broken}"


def test_readme_starts_with_the_user_paths():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.split("\n")
    headings = [
        (i + 1, m.group(1)) for i, ln in enumerate(lines) if (m := re.match(r"^## (.*)$", ln))
    ]
    contents = text[text.index("## Contents") : text.index("\n## ", text.index("## Contents") + 1)]
    for _, h in headings[1:]:
        assert f"(#{anchor(h)})" in contents, f"README contents do not link '## {h}'"
    # setup commands near the top; the four paths in order, ABCI within the first screenful of sections
    assert (
        text.index("make smoke") < text.index("## Contents")
        and "make test" in text[: text.index("## Contents")]
    )
    paths = [n for n, h in headings if re.match(r"\([a-d]\) ", h)]
    assert len(paths) == 4 and paths == sorted(paths), headings
    assert paths[1] < 100, f"the ABCI 3.0 section starts at line {paths[1]}"


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="Open MPI's guard applies to root"
)
def test_the_root_section_quotes_what_mpirun_says(tmp_path):
    """The README's "mpirun as root" quotes the venv's mpirun, and its two variables are what lets it start."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## mpirun as root") :]
    section = section[: section.index("\n## ")]
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    env = {k: v for k, v in clean_env().items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    refused = subprocess.run(
        [mpirun, "-np", "1", "true"], env=env, capture_output=True, text=True, timeout=HANG_S
    )
    first = (
        (refused.stdout + refused.stderr).strip().splitlines()[0]
    )  # "prterun has detected an attempt ..."
    assert first.rstrip(".") in section, first
    allowed = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ran = subprocess.run(
        [mpirun, "-np", "1", "true"], env=allowed, capture_output=True, text=True, timeout=HANG_S
    )
    assert ran.returncode == 0, ran.stderr
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun" in section
