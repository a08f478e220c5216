"""The PBS imitation's daemon: the server, the scheduler and every node's mom in one root process (see ``pbs.py``).

    python3 -I tests/cluster/pbs_server.py RUN/config.json

It listens on ``RUN/server.sock`` (a unix socket: it is reached from every node's network namespace, and the peer's
uid, ``SO_PEERCRED``, is the caller PBS would authenticate). Each request is one JSON line; the answer is one JSON
line (``{"ok": ..., "error": "qsub: ..."}``). ``pbs_tmrsh`` also hands over its stdin, stdout and stderr
(``SCM_RIGHTS``): the task it asks for runs on those, and a second line gives it the task's exit status.

What a mom does, done here for every node (all nodes share this kernel's one pid namespace, so one process can see
and signal every session; ``nsenter`` with a node holder's pid puts a process on that node):

* a job's top process is a shell (``bash -c 'bash SCRIPT; exit $?'``, PBS's "job shell") started as the job's
  owner, in ``$HOME``, in a new session on the first host of the job; a task (``pbs_tmrsh HOST ...``) is a new
  session on HOST. The job is the set of those sessions: ``sessions(job)``.
* ``qdel`` and the wall time: SIGTERM to every process of those sessions on every node, the queue's ``kill_delay``
  (10 s unless set), SIGKILL to every process still in them; the job ends as soon as none is left. A job whose top
  shell exits ends too, and what is left of its sessions is SIGKILLed. ``Exit_status``: the top shell's exit status,
  256 + N when it died of signal N (271 after a qdel's SIGTERM).
* a process that carries the job's ``PBS_JOBID`` in its environment but is in none of the job's sessions (it left
  with setsid or ``start_new_session``) is invisible to PBS: never signalled, never waited for. Seen while the job
  runs, it is recorded in the job as ``octo_outside_sessions``; still alive when the job has ended, in
  ``octo_survivors`` (neither field exists in PBS: they are how this imitation makes such a process fail a test).
"""

from __future__ import annotations

import array
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

DEFAULT_KILL_DELAY_S = 10  # PBS's kill delay where a queue sets none
# How often jobs are scheduled, watched for their end, and scanned for processes outside their sessions.
TICK_S = 0.5


# ---- processes ---------------------------------------------------------------------------------------------------


def stat_of(pid: int):
    """(session id, state letter) of ``pid``, or None when it is gone. /proc/PID/stat: 'pid (comm) S ppid pgrp sid'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[3]), fields[0]


def live_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            state = stat_of(int(name))
            if state and state[1] not in "ZX":
                yield int(name), state[0]


def carries(pid: int, job_id: str) -> bool:
    """Whether ``pid`` started with ``PBS_JOBID=job_id`` in its environment (what every process of a job inherits)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"\0PBS_JOBID={job_id}\0".encode() in b"\0" + env


def describe(pid: int, holders: dict) -> str:
    """'node002: 4242 (session 4200) /usr/bin/orted -mca ...'."""
    try:
        net = os.readlink(f"/proc/{pid}/ns/net")
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return f"{pid} (gone)"
    node = next((n for n, p in holders.items() if _net(p) == net), "?")
    state = stat_of(pid)
    return f"{node}: {pid} (session {state[0] if state else '?'}) {cmd.strip()[:200]}"


def _net(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def outside_sessions(job_id: str, sessions: set, holders: dict) -> list:
    """Live processes of the job (its PBS_JOBID) in none of its sessions, on this cluster's nodes (another
    cluster's job may have the same id): [(pid, session)]. Asked every tick of a running job: the node comes
    first (one readlink), the environment (the whole of it read) only of a process on a node of this cluster, not
    of each of the machine's hundreds."""
    nets = {_net(p) for p in holders.values()}
    return [
        (pid, sid)
        for pid, sid in live_pids()
        if sid not in sessions and _net(pid) in nets and carries(pid, job_id)
    ]


# ---- requests ----------------------------------------------------------------------------------------------------


def parse_resources(text: str, into: dict) -> None:
    """'select=2:ncpus=2:mpiprocs=1,walltime=1:00:00' -> into["select"], into["walltime"] (later ones win)."""
    for item in re.split(r",(?=[A-Za-z_]+=)", text):
        key, _, value = item.partition("=")
        if key:
            into[key.strip().lower()] = value.strip()


def chunks_of(select: str) -> list:
    """'2:ncpus=2:mpiprocs=1+1:ncpus=4' -> [{"ncpus": 2, "mpiprocs": 1}] * 2 + [{"ncpus": 4, "mpiprocs": 1}]."""
    out = []
    for spec in select.split("+"):
        parts = spec.split(":")
        count = int(parts[0]) if parts[0].isdigit() else 1
        chunk = {"ncpus": 1, "mpiprocs": 1}
        for p in parts[1 if parts[0].isdigit() else 0 :]:
            k, _, v = p.partition("=")
            chunk[k] = int(v) if v.isdigit() else v
        out += [dict(chunk) for _ in range(count)]
    return out


def seconds(hms: str) -> int:
    """'01:30:00' -> 5400; '90' -> 90."""
    total = 0
    for part in hms.split(":"):
        total = total * 60 + int(part)
    return total


class Server:
    def __init__(self, config: dict):
        self.config = config
        self.run = Path(config["run"])
        self.holders = {n: int(p) for n, p in config["nodes"].items()}
        self.nodes = list(self.holders)
        self.name = self.nodes[0]
        self.queues = {q: {} for q in config["queues"]}
        self.jobs: dict = {}  # id -> job record (qstat's attributes plus our private "_..." keys)
        self.next_seq = 0
        self.lock = threading.RLock()

    # ---- the socket ----

    def serve(self) -> None:
        path = self.run / "server.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        path.chmod(0o666)
        sock.listen(64)
        threading.Thread(target=self.loop, daemon=True).start()
        (self.run / "server.ready").write_text(str(os.getpid()))
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        with conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            uid = array.array("i", creds)[1]
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
            buf = msg
            while not buf.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    break
                buf += more
            request = json.loads(buf)
            try:
                reply = getattr(self, "do_" + request["op"])(request, uid, fds, conn)
            except Exception as e:  # an answer, never a dead connection: the command prints it
                reply = {"error": f"{request.get('op')}: internal error: {e!r}"}
            finally:
                for fd in fds:
                    os.close(fd)
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass  # the caller is gone: a pbs_tmrsh the qdel ended before its task did

    # ---- qsub ----

    def do_submit(self, req: dict, uid: int, fds, conn) -> dict:
        if uid == 0:
            return {
                "error": "qsub: Bad UID for job execution"
            }  # PBS's default: root's jobs are refused
        # [[letter, value]]: the script's #PBS lines, then the command line's (which win). A command line's -v
        # replaces the script's -v list (measured on OpenPBS 23.06: a chained job lost its script's #PBS -v).
        attrs: dict = {"resources": {}, "v": None, "V": False}
        for source in ("script_options", "options"):
            listed = None
            for letter, value in req[source]:
                if letter == "l":
                    parse_resources(value, attrs["resources"])
                elif letter == "v":
                    listed = value if listed is None else f"{listed},{value}"
                elif letter == "V":
                    attrs["V"] = True
                else:
                    attrs[letter] = value
            if listed is not None:
                attrs["v"] = listed
        queue = attrs.get("q") or self.config["default_queue"]
        if queue not in self.queues:
            return {"error": f"qsub: Unknown queue {queue}"}
        env = req["environ"]
        listed = attrs["v"]
        variables = {k: v for k, v in env.items() if attrs["V"]}
        for item in [i for i in (listed or "").split(",") if i]:
            name, eq, value = item.partition("=")
            if eq:
                variables[name] = value
            elif name in env:
                variables[name] = env[name]
        pw = pwd.getpwuid(uid)
        for k in ("HOME", "LANG", "LOGNAME", "PATH", "MAIL", "SHELL"):
            if k in env:
                variables[f"PBS_O_{k}"] = env[k]
        variables.update(
            PBS_O_WORKDIR=req["cwd"],
            PBS_O_SYSTEM="Linux",
            PBS_O_QUEUE=queue,
            PBS_O_HOST=req["host"],
        )
        res = attrs["resources"]
        res.setdefault("select", "1")
        try:
            chunks = chunks_of(res["select"])
            walltime = seconds(res["walltime"]) if "walltime" in res else None
        except ValueError:
            return {"error": f"qsub: Illegal attribute or resource value Resource_List {res}"}
        depend = []
        with self.lock:
            for spec in attrs.get("W", "").split(","):
                kind, _, ids = spec.partition("depend=")[2].partition(":")
                for jid in [i for i in ids.split(":") if i]:
                    found = self.find(jid)
                    if found is None:
                        return {"error": f"qsub: Unknown Job Id {jid}"}
                    depend.append((kind, found))
            seq = self.next_seq
            self.next_seq += 1
            job_id = f"{seq}.{self.name}"
            name = attrs.get("N") or (
                Path(req["script_name"]).name if req["script_name"] else "STDIN"
            )
            keep = attrs.get("k", "")
            join = attrs.get("j", "n")
            out_default = f"{req['cwd']}/{name}.o{seq}"
            err_default = f"{req['cwd']}/{name}.e{seq}"
            job = {
                "Job_Name": name,
                "Job_Owner": f"{pw.pw_name}@{req['host']}",
                "job_state": "H" if depend else "Q",
                "queue": queue,
                "server": self.name,
                "ctime": time.ctime(),
                "Join_Path": join,
                "Keep_Files": keep or "n",
                "Output_Path": f"{req['host']}:{attrs.get('o') or out_default}",
                "Error_Path": f"{req['host']}:{attrs.get('e') or err_default}",
                "Resource_List": {
                    **{k: v for k, v in res.items()},
                    "ncpus": sum(c["ncpus"] for c in chunks),
                    "nodect": len(chunks),
                    "place": res.get("place", "free"),
                },
                "Variable_List": variables,
                "project": attrs.get("P", "_pbs_project_default"),
                "substate": 22 if depend else 10,
                "comment": "",
                "_uid": uid,
                "_seq": seq,
                "_script": req["script"],
                "_chunks": chunks,
                "_walltime": walltime,
                "_depend": depend,
                "_sessions": {},  # session id -> node
                "_popen": [],
                "_outside": {},
            }
            if depend:
                job["depend"] = ",".join(f"{k}:{j}@{self.name}" for k, j in depend)
            self.jobs[job_id] = job
        return {"ok": job_id}

    def find(self, jid: str):
        """'3' or '3.node001' -> '3.node001' (None when unknown)."""
        for job_id in self.jobs:
            if jid in (job_id, job_id.split(".")[0]):
                return job_id
        return None

    # ---- qstat, qdel, qmgr ----

    def public(self, job: dict) -> dict:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    def do_stat(self, req: dict, uid: int, fds, conn) -> dict:
        with self.lock:
            if req.get("queue") is not None:
                names = [req["queue"]] if req["queue"] else list(self.queues)
                unknown = [q for q in names if q not in self.queues]
                if unknown:
                    return {"error": f"qstat: Unknown queue {unknown[0]}"}
                out = {}
                for q in names:
                    jobs = [
                        j for j in self.jobs.values() if j["queue"] == q and j["job_state"] != "F"
                    ]
                    out[q] = {
                        "queue_type": "Execution",
                        "total_jobs": len(jobs),
                        **self.queues[q],
                        "enabled": "True",
                        "started": "True",
                    }
                return {"ok": {"Queue": out}}
            ids = [self.find(j) or j for j in req.get("ids") or []] or list(self.jobs)
            found, errors = {}, []
            for jid in ids:
                job = self.jobs.get(jid)
                if job is None:
                    errors.append(f"qstat: Unknown Job Id {jid}")
                elif job["job_state"] == "F" and not req.get("history"):
                    if req.get("ids"):
                        errors.append(
                            f"qstat: {jid} Job has finished, use -x or -H to obtain historical job information"
                        )
                else:
                    found[jid] = self.public(job)
            return {"ok": {"Jobs": found}, "errors": errors}

    def do_delete(self, req: dict, uid: int, fds, conn) -> dict:
        errors = []
        with self.lock:
            for jid in req["ids"]:
                job_id = self.find(jid)
                job = self.jobs.get(job_id) if job_id else None
                if job is None:
                    errors.append(f"qdel: Unknown Job Id {jid}")
                elif uid not in (0, job["_uid"]):
                    errors.append(f"qdel: Unauthorized Request  {job_id}")
                elif job["job_state"] in ("Q", "H"):
                    job.update(job_state="F", substate=91, comment="Job deleted before it ran")
                elif job["job_state"] == "R":
                    self.stop(job, "qdel")
                elif job["job_state"] == "E" and req.get("force"):
                    job["_kill_at"] = 0
        return {"ok": None, "errors": errors}

    def do_manage(self, req: dict, uid: int, fds, conn) -> dict:
        """qmgr -c 'set queue Q kill_delay = 30' / 'unset queue Q kill_delay' (root only)."""
        if uid != 0:
            return {"error": "qmgr obj= svr=default: Unauthorized Request"}
        words = req["command"].replace("=", " = ").split()
        if len(words) >= 4 and words[:2] in (["set", "queue"], ["unset", "queue"]):
            queue, attr = words[2], words[3]
            if queue not in self.queues:
                return {"error": f"qmgr obj={queue} svr=default: Unknown queue"}
            with self.lock:
                if words[0] == "set" and len(words) == 6 and words[4] == "=":
                    self.queues[queue][attr] = int(words[5]) if words[5].isdigit() else words[5]
                elif words[0] == "unset":
                    self.queues[queue].pop(attr, None)
                else:
                    return {"error": f"qmgr: syntax error: {req['command']}"}
            return {"ok": None}
        return {
            "error": f"qmgr: only 'set|unset queue Q ATTR[=VALUE]' is imitated, not: {req['command']}"
        }

    # ---- pbs_tmrsh ----

    def do_spawn(self, req: dict, uid: int, fds, conn):
        """A task of a running job on one of its hosts, on the caller's stdio; answers twice (started, exit)."""
        with self.lock:
            job_id = self.find(req.get("job_id") or "")
            job = self.jobs.get(job_id) if job_id else None
            if job is None or job["job_state"] != "R":
                return {"error": f"pbs_tmrsh: job {req.get('job_id')!r} is not running (PBS_JOBID)"}
            if uid not in (0, job["_uid"]):
                return {"error": "pbs_tmrsh: Unauthorized Request"}
            host = req["host"].split(".")[0]
            if host not in job["_hosts"]:
                return {
                    "error": f"pbs_tmrsh: host {host} is not a node of job {job_id} ({job['exec_host']})"
                }
            job["_tasks"] = job.get("_tasks", 1) + 1
            env = self.job_env(job, host)
            env.update(PBS_TASKNUM=str(job["_tasks"]), PBS_NODENUM=str(job["_hosts"].index(host)))
            proc = self.start_on(host, job, req["argv"], env, stdio=fds)
        conn.sendall(json.dumps({"ok": proc.pid}).encode() + b"\n")
        rc = proc.wait()
        return {"exit": 256 - rc if rc < 0 else rc}

    # ---- the moms' work ----

    def start_on(self, node: str, job: dict, argv, env: dict, stdio) -> subprocess.Popen:
        """``argv`` as the job's owner on ``node``, in ``$HOME``, in a new session of the job (under the lock)."""
        pw = pwd.getpwuid(job["_uid"])
        proc = subprocess.Popen(
            ["nsenter", "-t", str(self.holders[node]), "-n", "-u", "-m", f"--wd={pw.pw_dir}",
             "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *argv],
            stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], env=env, start_new_session=True,
        )  # fmt: skip
        job["_sessions"][proc.pid] = node
        job["_popen"].append(proc)
        return proc

    def job_env(self, job: dict, node: str) -> dict:
        """What a mom gives a job's processes on ``node``: its pbs_environment, the job's Variable_List, the
        owner's login variables and PBS's own."""
        pw = pwd.getpwuid(job["_uid"])
        env = {}
        for line in Path(self.config["pbs_environment"][node]).read_text().splitlines():
            k, eq, v = line.partition("=")
            if eq:
                env[k] = v
        env.update(job["Variable_List"])
        mine = [c for c, h in zip(job["_chunks"], job["_chunk_hosts"]) if h == node]
        ncpus = sum(c["ncpus"] for c in mine) or 1
        env.update(
            HOME=pw.pw_dir, LOGNAME=pw.pw_name, USER=pw.pw_name, SHELL=pw.pw_shell, ENVIRONMENT="BATCH",
            PBS_ENVIRONMENT="PBS_BATCH", PBS_JOBID=job["_id"], PBS_JOBNAME=job["Job_Name"],
            PBS_QUEUE=job["queue"], PBS_NODEFILE=job["_nodefile"], PBS_JOBCOOKIE=f"{job['_seq']:032X}",
            PBS_MOMPORT="15003", PBS_TASKNUM="1", PBS_NODENUM="0", PBS_JOBDIR=pw.pw_dir,
            TMPDIR=job["_tmpdir"], NCPUS=str(ncpus),
            OMP_NUM_THREADS=str(mine[0].get("ompthreads", mine[0]["ncpus"]) if mine else 1),
        )  # fmt: skip
        return env

    def place(self, job: dict):
        """Hosts for each chunk, or (None, why). Without place=scatter (or excl) chunks fill a host before the next
        (PBS's free placement: 'select=2:mpiprocs=1' ran as node001/0+node001/1)."""
        free = {n: self.config["ncpus"] for n in self.nodes}
        for other in self.jobs.values():
            if other["job_state"] in ("R", "E"):
                for c, h in zip(other["_chunks"], other["_chunk_hosts"]):
                    free[h] -= c["ncpus"]
        place = job["Resource_List"]["place"]
        scatter = "scatter" in place or "excl" in place
        if scatter and len(job["_chunks"]) > len(self.nodes):
            return None, "Can Never Run: Insufficient amount of resource: host (place=scatter)"
        hosts, used = [], set()
        for chunk in job["_chunks"]:
            fits = [
                n for n in self.nodes if free[n] >= chunk["ncpus"] and not (scatter and n in used)
            ]
            if not fits:
                return None, "Not Running: Insufficient amount of resource: ncpus"
            hosts.append(fits[0])
            used.add(fits[0])
            free[fits[0]] -= chunk["ncpus"]
        return hosts, ""

    def start(self, job_id: str, job: dict, hosts: list) -> None:
        seq, pw = job["_seq"], pwd.getpwuid(job["_uid"])
        first = hosts[0]
        cpu = {n: 0 for n in self.nodes}
        exec_host = []
        for c, h in zip(job["_chunks"], hosts):
            exec_host.append(f"{h}/{cpu[h]}" + (f"*{c['ncpus']}" if c["ncpus"] > 1 else ""))
            cpu[h] += 1
        home = self.run / first
        nodefile = home / "aux" / job_id
        nodefile.write_text(
            "".join(f"{h}\n" * int(c["mpiprocs"]) for c, h in zip(job["_chunks"], hosts))
        )
        nodefile.chmod(0o644)
        tmpdir = Path(self.config["tmpdir"]) / f"pbs.{job_id}"
        tmpdir.mkdir(mode=0o700)
        os.chown(tmpdir, pw.pw_uid, pw.pw_gid)
        script = home / "mom_priv" / "jobs" / f"{job_id}.SC"
        script.write_text(job["_script"])
        script.chmod(0o755)
        job.update(
            _id=job_id, _hosts=list(dict.fromkeys(hosts)), _chunk_hosts=hosts, _nodefile=str(nodefile),
            _tmpdir=str(tmpdir), _started=time.monotonic(), job_state="R", substate=42, stime=time.ctime(),
            exec_host="+".join(exec_host),
            exec_vnode="+".join(f"({h}:ncpus={c['ncpus']})" for c, h in zip(job["_chunks"], hosts)),
            comment=f"Job run at {time.ctime()} on {'+'.join(dict.fromkeys(hosts))}",
        )  # fmt: skip
        # Output: -k oe keeps it in the owner's home on the first host while the job runs; otherwise a spool file
        # copied to Output_Path at the end. -j oe: stderr into stdout.
        keep, join = job["Keep_Files"], job["Join_Path"]
        out = (
            Path(pw.pw_dir) / f"{job['Job_Name']}.o{seq}"
            if "o" in keep
            else home / "spool" / f"{job_id}.OU"
        )
        err = (
            Path(pw.pw_dir) / f"{job['Job_Name']}.e{seq}"
            if "e" in keep
            else home / "spool" / f"{job_id}.ER"
        )
        files = [open(out, "ab")]
        files.append(files[0] if join == "oe" else open(err, "ab"))
        for path in {out, *([] if join == "oe" else [err])}:
            os.chown(path, pw.pw_uid, pw.pw_gid)
            path.chmod(0o644)
        job["_files"] = (out, None if join == "oe" else err)
        env = self.job_env(job, first)
        # The job shell runs the script as a child: a qdel's SIGTERM kills it (256 + 15) whatever the script does.
        top = ["/bin/bash", "-c", 'bash "$0"; exit $?', str(script)]
        with open(os.devnull) as null:
            job["_top"] = self.start_on(
                first, job, top, env, stdio=(null.fileno(), files[0].fileno(), files[1].fileno())
            )
        for f in set(files):
            f.close()
        job["session_id"] = job["_top"].pid

    def stop(self, job: dict, why: str) -> None:
        """qdel or the wall time: SIGTERM to every process of the job's sessions now, SIGKILL after kill_delay."""
        delay = self.queues[job["queue"]].get("kill_delay", DEFAULT_KILL_DELAY_S)
        job.update(job_state="E", substate=51, _kill_at=time.monotonic() + int(delay), _stopped=why)
        self.signal_sessions(job, signal.SIGTERM)

    def in_sessions(self, job: dict) -> list:
        return [pid for pid, sid in live_pids() if sid in job["_sessions"]]

    def signal_sessions(self, job: dict, sig: int) -> None:
        for pid in self.in_sessions(job):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def finish(self, job_id: str, job: dict) -> None:
        """Every process left in the job's sessions SIGKILLed; the exit status, the output, the escapes."""
        deadline = time.monotonic() + 30
        while self.in_sessions(job) and time.monotonic() < deadline:
            self.signal_sessions(job, signal.SIGKILL)
            time.sleep(0.1)
        for p in job["_popen"]:
            if p is not job["_top"] and p.poll() is None:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        rc = job["_top"].wait()
        job["Exit_status"] = 256 - rc if rc < 0 else rc
        job["resources_used"] = {
            "walltime": time.strftime("%H:%M:%S", time.gmtime(time.monotonic() - job["_started"]))
        }
        pw = pwd.getpwuid(job["_uid"])
        for spooled, dest in zip(job["_files"], (job["Output_Path"], job["Error_Path"])):
            if spooled is not None and spooled.parent.name == "spool":
                target = Path(dest.split(":", 1)[1])
                try:
                    shutil.copyfile(spooled, target)
                    os.chown(target, pw.pw_uid, pw.pw_gid)
                except OSError as e:
                    job["comment"] += f"; output not delivered to {target}: {e}"
                spooled.unlink(missing_ok=True)
        Path(job["_nodefile"]).unlink(missing_ok=True)
        shutil.rmtree(job["_tmpdir"], ignore_errors=True)
        survivors = outside_sessions(job_id, set(), self.holders)
        if survivors:
            job["octo_survivors"] = [describe(pid, self.holders) for pid, _ in survivors]
        job.update(job_state="F", substate=92 if "_stopped" not in job else 91)
        job["comment"] += f"; Job finished at {time.ctime()}" + (
            f" ({job['_stopped']})" if "_stopped" in job else ""
        )

    # ---- the loop: schedule, watch, end ----

    def loop(self) -> None:
        while True:
            try:
                self.tick()
            except Exception as e:  # never silently stop scheduling: the log says why
                print(f"pbs_server: tick failed: {e!r}", file=sys.stderr, flush=True)
            time.sleep(TICK_S)

    def tick(self) -> None:
        with self.lock:
            for job_id, job in self.jobs.items():
                state = job["job_state"]
                if state == "H":
                    ended = [self.jobs[d]["job_state"] == "F" for _k, d in job["_depend"]]
                    if all(ended):
                        job.update(job_state="Q", substate=10)
                if job["job_state"] == "Q":
                    hosts, why = self.place(job)
                    if hosts:
                        self.start(job_id, job, hosts)
                    else:
                        job["comment"] = why
                    continue
                if state not in ("R", "E"):
                    continue
                for pid, sid in outside_sessions(job_id, set(job["_sessions"]), self.holders):
                    job["_outside"].setdefault(pid, describe(pid, self.holders))
                    job["octo_outside_sessions"] = list(job["_outside"].values())
                limit = job["_walltime"]
                if state == "R" and limit and time.monotonic() - job["_started"] > limit:
                    self.stop(job, f"walltime {limit} s exceeded")
                    job["comment"] = f"job killed: walltime {limit} exceeded limit {limit}"
                if job["_top"].poll() is not None and state == "R":
                    self.finish(job_id, job)
                elif job["job_state"] == "E":
                    if not self.in_sessions(job) or time.monotonic() >= job["_kill_at"]:
                        self.finish(job_id, job)


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    Server(config).serve()


if __name__ == "__main__":
    main()
