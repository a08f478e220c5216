"""What the job runtime checks and builds before any rank starts: the job's directories, the chain's previous job,
how the ranks are run (the image or the venv), and the wandb key. Each refusal is a :class:`JobFailed`: one line,
exit 2, no rank started.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, List, Tuple

from octo_dist import savelayout
from octo_dist.jobs.schedulers.base import AFTER_ENV
from octo_dist.jobs.settings import JobSettings
from octo_dist.jobs.supervisor import exitfile, wandbkey
from octo_dist.problems import Problem


class JobFailed(Problem):
    """Ends the job before its ranks start, after one line (found; expected; fix): exit 2 unless told."""

    exit_status = 2


def make_directory(what: str, path: str, option: str) -> str:
    """Makes ``path`` (and its parents) and returns it absolute; one line naming it when it cannot be made:
    ``/etc/passwd/x`` (a file on the way), ``/proc/x``, a name longer than the file system takes."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.isdir(path):
            raise NotADirectoryError(20, "not a directory")
    except OSError as e:
        shown = path if len(path) <= 80 else path[:77] + "..."
        raise JobFailed(
            f"{what} directory {shown!r} cannot be made from {os.getcwd()} ({e.strerror or e}); expected a "
            f"directory this job can write. Fix: re-render with {option} PATH"
        ) from None
    return os.path.abspath(path)


def previous_job(save_dir: str, after: str, note: Callable[[str], None]) -> None:
    """A chained job trains only when the job before it (``after``: "12345.pbs1") finished or stopped, or was
    ended during a stop or by its launcher's death with its checkpoints intact (its exit file, ``exitfile``); one
    that left no exit file was ended by the scheduler: resume all the same."""
    try:
        # It names a file to read: "12345.pbs1", never "../../etc/x".
        after = savelayout.checked_job_id(AFTER_ENV, after)
    except savelayout.JobIdError as e:
        raise JobFailed(str(e)) from None
    previous = savelayout.exit_file(save_dir, after)
    try:
        found = exitfile.load(previous)
    except OSError as e:
        found = exitfile.ExitLine(exitfile.FOREIGN, None, f"unreadable ({e.strerror or e})")
    if found is None:
        note(
            f"the previous job of this chain ({after}) left no exit status (ended by the scheduler?): "
            "resuming from the last checkpoint"
        )
        return
    train, said = found.trains_next, found.said
    if train:
        if said != "0":
            note(f"the previous job of this chain ({after}) left: {said}")
        return
    if train is False:
        raise JobFailed(
            f"the previous job of this chain ({after}) failed with exit {said}: not training; expected it "
            "to finish or to stop for the wall time. Fix: read its log, then submit again (octo-dist "
            "launch ... --submit)"
        )
    if said == "empty":
        raise JobFailed(
            f"the previous job of this chain ({after}) left an empty exit status ({previous}): it could not write "
            "it (its file system was full?); expected 0 or a status. Fix: read its log, make room in the save "
            "directory (df -h), then submit again (octo-dist launch ... --submit)"
        )
    raise JobFailed(
        f"the previous job of this chain ({after}) left {previous}, {said}; expected the one line octo-dist "
        "writes there (0, a status, 'stopping ...'). Fix: remove that file if another program wrote it, then "
        "submit again (octo-dist launch ... --submit)"
    )


def data_directory(path: str) -> str:
    """The dataset directory, absolute; "" for none. It must exist where the job starts."""
    if not path:
        return ""
    if not os.path.isdir(path):
        raise JobFailed(
            f"data directory {path} not found from {os.getcwd()}; expected the dataset directory. "
            "Fix: re-render with --data-dir PATH"
        )
    return os.path.abspath(path)


def rank_runner(
    s: JobSettings, env: dict, mounts: List[str], note: Callable[[str], None]
) -> Tuple[List[str], str]:
    """(what every rank's command runs inside, the directory its program is found in): ``singularity exec
    --nv --bind ... IMAGE`` and "" (the image's PATH), or ``[]`` and ``"/abs/venv/bin/"``. ``mounts``: the job's
    absolute directories every rank needs (save, data, cache), bound into the image."""
    if not s.software.image:
        venv = s.software.venv
        if not os.access(os.path.join(venv, "bin", "python"), os.X_OK):
            raise JobFailed(
                f"no {venv}/bin/python; expected the octo-dist environment (make env PROFILE=cuda12 for ABCI "
                "3.0's H200, PROFILE=cuda11 for CUDA 11 GPUs). Fix: build it, or re-render with --venv PATH or "
                "--image FILE.sif"
            )
        return [], os.path.join(os.path.abspath(venv), "bin") + os.sep
    image = s.software.image
    if not os.path.isfile(image):
        raise JobFailed(
            f"image {image} not found; expected the .sif this job was rendered for. Fix: copy it there, "
            "or re-render with --image PATH"
        )
    image = os.path.abspath(image)  # as the binds: every node sees it
    # An absolute path: the ranks on other nodes do not get this node's PATH from the module providing it.
    singularity = shutil.which("singularity", path=env.get("PATH", ""))
    if not singularity:
        raise JobFailed(
            "no singularity command; expected SingularityCE/PRO on the node. Fix: module load "
            "singularitypro (if your site has it), or re-render with --module"
        )
    # --nv brings the host's NVIDIA driver in; the binds put checkpoints, data, the compilation cache, the
    # job's node list and the group area at the same paths inside.
    run = [os.path.abspath(singularity), "exec", "--nv"]
    for d in mounts:
        if d:
            run += ["--bind", d]
    for d in s.software.binds:
        if os.path.isdir(d):
            run += ["--bind", os.path.abspath(d)]
        else:
            note(f"not binding {d}: no such directory on this node")
    # The image has no MPI library: octo-dist must not call into mpi4py there (it would fail, or hang).
    env["OCTO_DIST_NO_MPI4PY"] = "1"
    return [*run, image], ""


# A wandb key is 40 (legacy) to 86 characters: a file larger than this is not a key.
KEY_FILE_MAX = 4096
AUTHORIZE = "paste the key from https://wandb.ai/authorize"


def read_key(key_file: str, text: str, size: int) -> str:
    """The key in ``text``, read from ``key_file`` of ``size`` bytes (whitespace dropped: ``"0123...cdef\\n"`` ->
    ``"0123...cdef"``); one line when the file is not a key: empty, binary, or larger than any key."""
    key = "".join(text.split())
    if size > KEY_FILE_MAX or not key or not key.isprintable() or not key.isascii():
        found = (
            "empty"
            if not key
            else (
                f"over {KEY_FILE_MAX} bytes" if size > KEY_FILE_MAX else "not printable ASCII text"
            )
        )
        raise JobFailed(
            f"{key_file} is {found}; expected one wandb API key (40 to 86 letters and digits). Fix: (umask 077; "
            f"cat >{key_file}) and {AUTHORIZE}"
        )
    return key


def wandb_key(env: dict) -> None:
    """The key comes from the environment, or from a file only you can read; never from the script: sets
    ``env["WANDB_API_KEY"]`` from the key file when that is where it is (``wandbkey``: the places, in launch's
    order). A key file, or ``~/.netrc``, that is a FIFO, a directory, a device or unreadable is named as what it
    is; none is opened blocking or read unbounded."""
    if env.get("WANDB_MODE") != "online" or env.get("WANDB_API_KEY"):
        return
    key_file = wandbkey.key_file(env)
    if os.path.isfile(key_file):
        found = os.stat(key_file)
        mode = found.st_mode & 0o777
        if mode & 0o077 or not mode & 0o400:
            raise JobFailed(
                f"{key_file} has mode {mode:o}; expected 600 or 400 (readable by you only). "
                f"Fix: chmod 600 {key_file}"
            )
        text = wandbkey.read_small(key_file)
        if text is None:  # another user's file, or replaced since
            raise JobFailed(
                f"{key_file} {wandbkey.what_is(key_file)}; expected your wandb key file, readable by you only. "
                f"Fix: rm -f {key_file}; (umask 077; cat >{key_file}) and {AUTHORIZE}"
            )
        env["WANDB_API_KEY"] = read_key(key_file, text, found.st_size)
        return
    if wandbkey.key_found(env):  # ~/.netrc's entry: the key file is not a file here
        return
    raise JobFailed(
        f"WANDB_MODE=online but no wandb key: {wandbkey.places(env)}; expected a key in one of them. "
        f"Fix: {_key_fix(env, key_file)}, or wandb login, or re-render with --wandb-mode offline"
    )


def _key_fix(env: dict, key_file: str) -> str:
    """How to put a key where the job looks: at the key file's place when nothing is there; a FIFO, directory or
    device there (``WANDB_KEY_FILE=/dev/zero``) is left alone and a file of its own named instead."""
    if not os.path.lexists(key_file):
        return f"(umask 077; cat >{key_file}) and {AUTHORIZE}"
    default = wandbkey.default_key_file(env)
    if env.get(wandbkey.KEY_FILE_ENV) and key_file != default:
        return (
            f"(umask 077; cat >{default}) and {AUTHORIZE}, then unset {wandbkey.KEY_FILE_ENV} (it names "
            f"{key_file})"
        )
    return f"mv {key_file} {key_file}.old; (umask 077; cat >{key_file}) and {AUTHORIZE}"
