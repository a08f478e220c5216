"""The PBS imitation's commands: ``qsub``, ``qstat``, ``qdel``, ``qmgr``, ``pbs_tmrsh`` (see ``pbs.py``).

    $PBS_EXEC/bin/qsub  ->  exec /usr/bin/python3 -I $PBS_EXEC/lib/pbs_commands.py qsub "$@"

Each finds the server's socket through ``pbs.conf`` (``PBS_CONF_FILE``, else ``/etc/pbs.conf``), as PBS's own
commands find their server, sends one JSON request and prints what PBS would. Standard library only: the jobs'
user runs them with the system Python.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time

WITH_VALUE = set("aAcCeGjJklmMNoPpqrSuvW")  # qsub's options that take a value
FLAGS = set("hVzIX")


def conf() -> dict:
    path = os.environ.get("PBS_CONF_FILE") or "/etc/pbs.conf"
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit(
            f"{os.path.basename(sys.argv[1])}: cannot read the PBS configuration {path}: {e.strerror}"
        )
    return dict(ln.split("=", 1) for ln in lines if "=" in ln and not ln.startswith("#"))


def connect() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(conf()["PBS_IMITATION_SOCKET"])
    except OSError as e:
        sys.exit(f"Connection refused: cannot connect to server {conf().get('PBS_SERVER')} ({e})")
    return sock


def lines(sock: socket.socket):
    buf = b""
    while True:
        more = sock.recv(1 << 20)
        if not more:
            return
        buf += more
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


def ask(request: dict, fds=()) -> dict:
    sock = connect()
    socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], list(fds))
    reply = next(lines(sock), {"error": "the server closed the connection"})
    if reply.get("error"):
        sys.exit(reply["error"])
    return reply


def getopt(words: list, where: str):
    """qsub's options, getopt style ('-lselect=2', '-l select=2', '-V'): ([[letter, value]], the rest)."""
    out, i = [], 0
    while i < len(words) and words[i].startswith("-") and len(words[i]) > 1:
        letter, rest = words[i][1], words[i][2:]
        if letter in FLAGS and not rest:
            out.append([letter, ""])
        elif letter in WITH_VALUE:
            if not rest:
                i += 1
                if i >= len(words):
                    sys.exit(f"qsub: option requires an argument -- '{letter}' ({where})")
                rest = words[i]
            out.append([letter, rest])
        else:
            sys.exit(
                f"qsub: invalid option -- '{letter}' ({where})\nusage: qsub [-W ...] [-v list] script"
            )
        i += 1
    return out, words[i:]


def directives(script: str) -> list:
    """The #PBS lines of a script, up to its first command (as qsub reads them)."""
    out = []
    for n, line in enumerate(script.splitlines()[1:], 2):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#PBS"):
            found, rest = getopt(shlex.split(stripped[4:]), f"line {n}: {stripped}")
            if rest:
                sys.exit(f"qsub: directive error: {stripped}")
            out += found
    return out


def qsub(argv: list) -> None:
    options, rest = getopt(argv, "command line")
    if rest:
        name = rest[0]
        try:
            with open(name) as f:
                script = f.read()
        except OSError as e:
            sys.exit(f"qsub: script file:: {e.strerror}")
    else:
        name, script = "", sys.stdin.read()
    reply = ask({
        "op": "submit", "options": options, "script_options": directives(script), "script": script,
        "script_name": name, "environ": dict(os.environ), "cwd": os.getcwd(), "host": socket.gethostname(),
    })  # fmt: skip
    print(reply["ok"])


def show(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def qstat(argv: list) -> None:
    history = full = json_out = queues = False
    ids = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-F":
            i += 1
            json_out = argv[i] == "json" if i < len(argv) else False
        elif a.startswith("-") and len(a) > 1:
            for c in a[1:]:
                if c not in "xfQBHw":
                    sys.exit(f"qstat: option -{c} is not imitated")
            history |= "x" in a or "H" in a
            full |= "f" in a
            queues |= "Q" in a
            if "B" in a:
                print(f"Server: {conf().get('PBS_SERVER')}")
                return
        else:
            ids.append(a)
        i += 1
    if queues:
        reply = ask({"op": "stat", "queue": ids[0] if ids else ""})
        body = reply["ok"]
    else:
        reply = ask({"op": "stat", "ids": ids, "history": history})
        body = reply["ok"]
    for e in reply.get("errors") or []:
        print(e, file=sys.stderr)
    if json_out:
        print(json.dumps({"timestamp": int(time.time()), "pbs_version": "23.06.06",
                          "pbs_server": conf().get("PBS_SERVER"), **body}, indent=4))  # fmt: skip
    elif full:
        for kind, items in body.items():
            for key, attrs in items.items():
                print(f"{'Job Id' if kind == 'Jobs' else 'Queue'}: {key}")
                for k, v in attrs.items():
                    print(f"    {k} = {show(v)}")
                print()
    else:
        for key, attrs in body.get("Jobs", body.get("Queue", {})).items():
            print(f"{key:<20} {attrs.get('Job_Name', ''):<16} {attrs.get('job_state', '')}")
    if reply.get("errors"):
        sys.exit(35 if all("finished" in e for e in reply["errors"]) else 153)


def qdel(argv: list) -> None:
    force = "-W" in argv and argv[argv.index("-W") + 1 :][:1] == ["force"]
    ids = [a for a in argv if not a.startswith("-") and a != "force"]
    reply = ask({"op": "delete", "ids": ids, "force": force})
    for e in reply.get("errors") or []:
        print(e, file=sys.stderr)
    if reply.get("errors"):
        sys.exit(153)


def qmgr(argv: list) -> None:
    if argv[:1] != ["-c"] or len(argv) != 2:
        sys.exit("usage: qmgr -c 'set queue QUEUE ATTR = VALUE'")
    ask({"op": "manage", "command": argv[1]})


def pbs_tmrsh(argv: list) -> None:
    """pbs_tmrsh HOST COMMAND...: the command as a task of this job on HOST, on this process's stdio."""
    if len(argv) < 2:
        sys.exit("usage: pbs_tmrsh [-n][-l username] host [-n][-l username] command")
    sock = connect()
    request = {
        "op": "spawn",
        "job_id": os.environ.get("PBS_JOBID", ""),
        "host": argv[0],
        "argv": argv[1:],
    }
    socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    status = 255
    for reply in lines(sock):
        if reply.get("error"):
            sys.exit(f"pbs_tmrsh: {reply['error']}")
        if "exit" in reply:
            status = reply["exit"]
    sys.exit(128 + status - 256 if status >= 256 else status)


def main() -> None:
    commands = {"qsub": qsub, "qstat": qstat, "qdel": qdel, "qmgr": qmgr, "pbs_tmrsh": pbs_tmrsh}
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
