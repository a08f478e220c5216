"""The save directory's tree as ``octo_dist/savelayout.py`` draws it, checked against ``RunLayout`` (every path the
picture names by a ``RunLayout`` member is where that member points, for smoke's layout and finetune's) and against
what a real job writes: the script ``octo-dist launch pbs`` renders, run with PBS's variables and the venv's Open MPI
5 ``mpirun`` (2 ranks of ``smoke --model tiny``, real orbax checkpoints), stopped as ``qdel`` stops it; and the lock
the engine takes for a fine-tune run's layout (no Octo needed)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest

from helpers import wait_until
from helpers import COMPILE_FAST, HANG_S

import test_qdel_stops as pbsjob  # the PBS job the qdel tests run: rendered by octo-dist launch, run with bash

from octo_dist import savelayout
from octo_dist.apps.finetune import config as fc
from octo_dist.engine import checkpoint as ck
from octo_dist.engine import savedir

JOB = "12345.pbs1"  # the picture's job id: the real job runs under it, so its names are the picture's own


class Entry(NamedTuple):
    path: str  # under the save directory, with the picture's placeholders: "<run>/<state>/.octo-dist.lock"
    # what names it: a RunLayout member ('.run_dir', '.checkpoint(step)'), a savelayout function
    # ('exit_file(save_dir, job)') or name ('JOB_MARK'); None where none does
    member: Optional[str]
    is_dir: bool
    has_children: bool


def documented_tree() -> List[Entry]:
    """The picture in savelayout's docstring, one entry per drawn line (descriptions' continuation lines skipped)."""
    doc = savelayout.__doc__
    lines = doc[doc.index("::\n\n") + 4 :].split("\n\n")[0].splitlines()
    root_indent = len(lines[0]) - len(lines[0].lstrip())
    desc_col = lines[0].index("RunLayout.save_dir")
    stack: List[tuple] = []  # (indent, name)
    entries: List[Entry] = []
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip())
        if indent >= desc_col:
            continue  # a description's next line
        name, _, desc = line.strip().partition("  ")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        assert indent > root_indent, line
        path = "/".join([n.rstrip("/") for _, n in stack] + [name.rstrip("/")])
        if entries and stack and entries[-1].path == "/".join(n.rstrip("/") for _, n in stack):
            entries[-1] = entries[-1]._replace(has_children=True)
        member = re.match(r"\.?\w+(?:\([^)]*\))?", desc.strip())
        if member and not (member.group(0).startswith(".") or member.group(0) in _NAMERS):
            member = None  # a description's first word
        entries.append(Entry(path, member.group(0) if member else None, name.endswith("/"), False))
        stack.append((indent, name))
    return entries


# savelayout's functions and names the picture may name a path by (the rest of a description is prose)
_NAMERS = {
    "exit_file(save_dir, job)",
    "job_dir(save_dir, job)",
    "rank_note(job_dir_path, False, n)",
    "rank_note(job_dir_path, True, n)",
    "stop_note(job_dir_path)",
    "lock_file(train_state)",
    "JOB_MARK",
    "NODE_LIST",
    "RUNTIME_COPY",
    "CHECKSUMS",
}


def named_path(member: str, layout: savelayout.RunLayout, path: str) -> str:
    """Where what the picture names a path by points: a layout's member, a savelayout function of the layout's
    save directory, train_state and the picture's job, or a name (the entry's own name: beside its parent)."""
    if member.isupper():
        return os.path.join(os.path.dirname(path), getattr(savelayout, member))
    job_dir_path = savelayout.job_dir(layout.save_dir, JOB)
    names = {
        "save_dir": layout.save_dir,
        "train_state": layout.train_state,
        "job_dir_path": job_dir_path,
    }
    where = {**vars(savelayout), "layout": layout, "job": JOB, "step": 5, "n": "3", **names}
    return eval(f"layout{member}" if member.startswith(".") else member, where)


def concrete(path: str, run: str, state: str, step: str = "5") -> str:
    """A picture's path for one layout: ``<run>``/``<state>`` replaced (smoke's are empty: the level goes)."""
    parts = []
    for part in path.split("/"):
        part = part.replace("<run>", run).replace("<state>", state).replace("<step>", step)
        part = part.replace("<n>", "3" if step != "\0" else step)
        if part:
            parts.append(part)
    return "/".join(parts)


def pattern(path: str, run: str, state: str) -> "re.Pattern":
    """A picture's path as a pattern over real names: ``<step>`` a number, ``<host>``/``<pid>``/``*`` any name."""
    text = re.escape(concrete(path, run, state, step="\0"))
    text = text.replace("\0", r"[0-9]+").replace(r"\*", r"[^/]*")
    text = text.replace(re.escape("<host>"), r"[^/]+").replace(re.escape("<pid>"), r"[0-9]+")
    return re.compile(text)


LAYOUTS = {
    # the layout each program builds, and what the picture's <run> and <state> are for it
    "smoke": (savelayout.RunLayout("/s"), "", ""),
    "finetune": (
        fc.layout({"save_dir": "/s", "wandb": {"project": "octo_finetune"}}, "ft_256"),
        "octo_finetune/ft_256",
        "train_state",
    ),
}


@pytest.mark.parametrize("program", list(LAYOUTS))
def test_every_path_the_picture_names_is_where_run_layout_puts_it(program):
    """Broken by hand: the picture's lock drawn at the save directory's top (as it was) fails for finetune; a
    RunLayout.lock beside the run's directory instead of in train_state fails for both."""
    layout, run, state = LAYOUTS[program]
    named = [e for e in documented_tree() if e.member]
    assert {e.member.split("(")[0] for e in named} >= {
        "exit_file",
        "job_dir",
        "JOB_MARK",
        "NODE_LIST",
        "rank_note",
        "stop_note",
        ".run_dir",
        ".train_state",
        "lock_file",
        ".checkpoint",
        ".summary",
        ".loss_plot",
    }
    for e in named:
        where = concrete(e.path, run, state) or "."
        got = named_path(e.member, layout, os.path.join("/s", where))
        assert os.path.relpath(got, "/s") == where, e


def test_a_fine_tune_runs_lock_is_where_the_picture_draws_it(tmp_path):
    """The engine's real lock on the train_state finetune hands it. Broken by hand: finetune handing the engine its
    run directory (the lock then lands beside finetune_config.json, not in train_state) fails here."""
    cfg = {"save_dir": str(tmp_path), "wandb": {"project": "p", "group": "g"}}
    job = fc.FinetuneJob(config={}, name="ft", layout=fc.layout(cfg, "ft"))
    _LINKED.clear()
    lock = savedir.RunLock(job.local_layout.train_state).acquire()
    try:
        written = sorted(
            os.path.relpath(os.path.join(d, f), tmp_path)
            for d, _, files in os.walk(tmp_path)
            for f in files
        )
    finally:
        lock.release()
    drawn = [e for e in documented_tree() if e.member == "lock_file(train_state)"]
    assert written == [concrete(drawn[0].path, "p/g/ft", "train_state")]
    assert written == [os.path.relpath(savelayout.lock_file(job.layout.train_state), tmp_path)]
    # The file the lock is written to before it is linked into place lives only for a moment: a real job's listing
    # catches it by chance, so its name is checked here, as the engine made it. Broken by hand: the picture drawing
    # it as ".octo-dist.lock.<host>.<pid>.tmp" while mkstemp names it ".octo-dist.lock.vm.goziatme.tmp" fails here.
    linked = [
        os.path.relpath(src, tmp_path)
        for src, dst in _LINKED
        if dst == savelayout.lock_file(job.layout.train_state)
    ]
    assert len(linked) == 1 and os.path.dirname(linked[0]) == os.path.dirname(written[0]), linked
    assert undocumented(set(linked) | set(written), "p/g/ft", "train_state") == [], linked


# (src, dst) of every os.link this process makes: the engine's lock is taken through one
_LINKED: List[tuple] = []


def _record_links(event: str, args: tuple) -> None:
    if event == "os.link":
        _LINKED.append((os.fsdecode(args[0]), os.fsdecode(args[1])))


sys.addaudithook(_record_links)  # audit hooks cannot be removed; this one only appends to a list


def undocumented(seen: set, run: str, state: str) -> list:
    """The paths in ``seen`` the picture does not draw: not an entry, not a parent of one, not inside a directory
    drawn without children (an orbax checkpoint's own files)."""
    tree = documented_tree()
    drawn = [pattern(e.path, run, state) for e in tree]
    opaque = [pattern(e.path, run, state) for e in tree if e.is_dir and not e.has_children]
    parents = {p for e in tree for p in _parents(e.path)}
    drawn += [pattern(p, run, state) for p in parents]
    out = []
    for path in sorted(seen):
        if any(d.fullmatch(path) for d in drawn):
            continue
        if any(o.fullmatch(p) for o in opaque for p in _parents(path)):
            continue
        out.append(path)
    return out


def _parents(path: str) -> list:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def listing(save: Path) -> set:
    found = set()
    for d, dirs, files in os.walk(save):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(d, name), save))
    return found


@pytest.mark.mpi
@pytest.mark.slow
def test_what_a_real_job_writes_is_the_picture(tmp_path, compile_cache):
    """While the job trains and after a qdel stops it, every file in its save directory is one the picture draws,
    where RunLayout names it. Broken by hand: a node list written under another name (mpirun.py's
    ``savelayout.NODE_LIST`` -> "hosts") fails here ("missing" and "undocumented"), and so does a smoke run whose
    checkpoints go into a train_state of its own while the picture says they are the run's directory."""
    pbsjob.render(tmp_path, compile_cache)
    # The ranks compile fast (pbs_env sets helpers.COMPILE_FAST; XLA_ variables reach every rank): the files are
    # the point.
    env = pbsjob.pbs_env(tmp_path, "openmpi5", JOB)
    assert env["XLA_FLAGS"] == COMPILE_FAST
    save = tmp_path / "runs" / "q"
    layout = savelayout.RunLayout(str(save))
    job = pbsjob.start(tmp_path, env)
    seen: set = set()
    try:
        # The first checkpoint's manifest, wherever the run puts it (a misplaced one fails below, not by waiting).
        def checkpointed() -> bool:
            assert job.poll() is None, f"the job exited early:\n{pbsjob.log_tail(tmp_path)}"
            seen.update(listing(save))
            return any(os.path.basename(p) == ck.MANIFEST for p in seen)

        wait_until(
            checkpointed,
            watch=[tmp_path],
            what="the first checkpoint's manifest",
            tail=lambda: pbsjob.log_tail(tmp_path),
            poll_s=0.05,
        )
        # Training now: the job's directory and the run's lock exist until the job ends.
        during = listing(save)
        seen |= during
        pbsjob.qdel(job.pid)
        job.wait(timeout=HANG_S)
    finally:
        pbsjob.end(job, env)
    after = listing(save)
    seen |= after
    rel = lambda p: os.path.relpath(p, save)  # noqa: E731
    job_dir = savelayout.job_dir(str(save), JOB)
    lock = savelayout.lock_file(layout.train_state)
    exit_file = savelayout.exit_file(str(save), JOB)
    missing = {
        rel(job_dir),
        rel(os.path.join(job_dir, savelayout.JOB_MARK)),
        rel(os.path.join(job_dir, savelayout.NODE_LIST)),
        rel(lock),
        rel(layout.checkpoint(pbsjob.SAVE_EVERY)),
    } - during
    assert not missing, (missing, sorted(during))
    assert rel(exit_file) in after, sorted(after)
    assert rel(job_dir) not in after and rel(lock) not in after, sorted(after)
    assert Path(exit_file).read_text().strip() == "0", pbsjob.log_tail(tmp_path)
    assert undocumented(seen, "", "") == [], sorted(seen)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compile-cache")


def test_a_save_directorys_room_is_said_alike_before_the_queue_and_in_the_run():
    """``launch``'s footprint (jobs/) and the run's own room check (engine/) say sizes through one function."""
    from octo_dist.engine import room
    from octo_dist.jobs import footprint

    said = [savelayout.size_text(n) for n in (512, 1536, 1181116006, 3 << 40, 5 << 50)]
    assert said == ["512 B", "1.5 KiB", "1.1 GiB", "3.0 TiB", "5120.0 TiB"]
    assert room.size_text is savelayout.size_text
    found, expected, _ = footprint.shortfall(
        "runs/ft", footprint.Footprint(3 << 40, "the run"), 1181116006
    )
    assert (found, expected) == (
        "--save-dir runs/ft: 1.1 GiB free on its file system",
        "at least 3.0 TiB for the run",
    )


def test_the_runs_own_files_are_named_in_its_directory():
    layout = savelayout.RunLayout(
        "/groups/gxx00000/runs/ft", "octo_finetune/ft_256", savelayout.TRAIN_STATE
    )
    run = "/groups/gxx00000/runs/ft/octo_finetune/ft_256"
    found = (layout.run_config, layout.run_id_file, layout.summary, layout.loss_plot)
    assert found == tuple(
        f"{run}/{n}" for n in ("finetune_config.json", "wandb_run_id", "summary.json", "loss.png")
    )
    assert (
        savelayout.RunLayout("/s").summary == "/s/summary.json"
    )  # smoke: the save directory is the run's
