"""The probe job's report, parsed from fabricated command outputs (recorded ``qstat -Qf``/``qstat -f``, nvidia-smi,
ompi_info, a fake /dev tree listing): each fact, what a CPU node reports as absent, the differences from what
launch assumes with their fixes, and launch's warnings from a report it finds."""

from __future__ import annotations

import json
import os
import subprocess

from octo_dist.apps.probe import facts as F
from octo_dist.apps.probe import write
from octo_dist.jobs import probe, probesite
from test_quota_show import ABCI_GIB

# Recorded from PBS Professional 2022 (qstat -Qf -F json rt_HG; qstat -f -F json JOBID), cut to the fields read.
QUEUE_JSON = json.dumps(
    {
        "timestamp": 1,
        "pbs_version": "2022.1.4",
        "pbs_server": "pbs1",
        "Queue": {"rt_HG": {"queue_type": "Execution", "kill_delay": 5, "enabled": "True"}},
    }
)
QUEUE_NO_DELAY = json.dumps({"Queue": {"rt_HG": {"queue_type": "Execution"}}})
JOB_JSON = json.dumps(
    {
        "Jobs": {
            "12.pbs1": {
                "Resource_List": {
                    "select": "2:mpiprocs=1",
                    "place": "scatter",
                    "walltime": "00:10:00",
                },
                "exec_vnode": "(hnode001:ncpus=1)+(hnode001:ncpus=1)",
            }
        }
    }
)
SMI_BANNER = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |\n"
SMI_CSV = "0, NVIDIA H200, 550.54.15, GPU-aaaa\n"
# ompi_info --parsable --all, the plm lines: Open MPI built with PBS's tm, and one without it
OMPI_SSH = 'mca:plm:rsh:version:"mca:2.1.0"\nmca:plm:rsh:param:plm_rsh_agent:value:"ssh : rsh"\n'
OMPI_TM = 'mca:plm:tm:version:"mca:2.1.0"\n' + OMPI_SSH
# ls -l /dev/infiniband on an H node
IB_LS = (
    "total 0\ncrw------- 1 root root 231,  64 Apr  1 09:00 issm0\n"
    "crw-rw-rw- 1 root root 231, 192 Apr  1 09:00 uverbs0\n"
)


def test_kill_delay_is_the_queues_or_pbs_default_and_absent_without_qstat():
    assert F.kill_delay(QUEUE_JSON, 0, "rt_HG")["seconds"] == 5
    assert F.kill_delay(QUEUE_NO_DELAY, 0, "rt_HG") == {
        "seconds": 10,
        "source": "PBS's default: queue rt_HG sets no kill_delay",
    }
    assert "absent" in F.kill_delay("bash: qstat: command not found", 127, "rt_HG")


# The same, as qstat prints them without -F json (a long value wraps onto a line that starts with a tab).
QUEUE_TEXT = "Queue: rt_HG\n    queue_type = Execution\n    kill_delay = 5\n    enabled = True\n\n"
JOB_TEXT = (
    "Job Id: 12.pbs1\n    Job_Name = octo-dist-probe\n    Resource_List.place = scatter\n"
    "    Resource_List.select = 2:mpiprocs=1\n    exec_vnode = (hnode001:ncpus=1)+(hnod\n\te002:ncpus=1)\n\n"
)


def test_qstats_text_reads_as_its_json():
    assert F.kill_delay(QUEUE_TEXT, 0, "rt_HG")["seconds"] == 5
    got = F.placement(JOB_TEXT, 0, "12.pbs1")
    assert (got["place"], got["hosts"]) == ("scatter", ["hnode001", "hnode002"])
    assert "absent" in F.kill_delay(QUEUE_TEXT, 0, "rt_HF")


def test_placement_reads_place_and_the_hosts_of_exec_vnode():
    got = F.placement(JOB_JSON, 0, "12.pbs1")
    assert got["place"] == "scatter" and got["hosts"] == ["hnode001", "hnode001"]
    assert "absent" in F.placement("qstat: Unknown Job Id 12.pbs1", 153, "12.pbs1")


def test_gpus_and_isolation_on_a_shared_node():
    gpu = F.gpus(SMI_CSV, 0, SMI_BANNER)
    assert gpu == {"count": 1, "names": ["NVIDIA H200"], "driver": "550.54.15", "cuda": "12.4"}
    cgroup = "0::/pbs_jobs.service/jobid/12.pbs1\n"
    assert F.isolation({}, cgroup, gpu)["how"].startswith("the device cgroup")
    eight = F.gpus(SMI_CSV * 8, 0, SMI_BANNER)
    assert F.isolation({"CUDA_VISIBLE_DEVICES": "3"}, cgroup, eight)["how"].startswith(
        "CUDA_VISIBLE_DEVICES=3"
    )
    assert F.isolation({}, cgroup, eight)["how"].startswith("none")


def test_a_cpu_node_reports_what_it_cannot_have_as_absent():
    gpu = F.gpus("bash: nvidia-smi: command not found", 127, "")
    assert "absent" in gpu and "absent" in F.isolation({}, "", gpu)
    assert "absent" in F.devices(
        "ls: cannot access '/dev/infiniband': No such file or directory", 2
    )
    assert "absent" in F.quota("bash: show_quota: command not found", 127)
    assert "absent" in F.launcher("bash: ompi_info: command not found", 127, {})
    assert "absent" in F.singularity("bash: singularity: command not found", 127)
    assert probesite.differences({"gpus": gpu, "infiniband_host": F.devices("", 2)}, 2) == []


def test_devices_from_a_fake_dev_tree(tmp_path):
    ib = tmp_path / "infiniband"
    ib.mkdir()
    (ib / "uverbs0").write_text("")
    listing = subprocess.run(["ls", "-l", str(ib)], capture_output=True, text=True).stdout
    assert F.devices(listing, 0)["uverbs"] == []  # a regular file is not a device
    assert F.devices(IB_LS, 0) == {"files": ["issm0", "uverbs0"], "uverbs": ["uverbs0"]}


def test_how_mpirun_starts_remote_ranks():
    assert F.launcher(OMPI_TM, 0, {})["under_pbs"] is True
    ssh = F.launcher(OMPI_SSH, 0, {})
    assert ssh["rsh_agent"] == "ssh : rsh" and ssh["under_pbs"] is False
    assert (
        F.launcher(OMPI_SSH, 0, {"OMPI_MCA_plm_rsh_agent": "/opt/pbs/bin/pbs_tmrsh"})["under_pbs"]
        is True
    )


def test_singularity_versions_and_check_env():
    assert F.singularity("SingularityCE version 4.1.5-1.el9\n", 0)["version"] == "4.1.5-1.el9"
    checks = {
        "checks": [
            {"id": "cudnn.loaded", "status": "fail", "found": "no libcudnn", "remedy": "make sif"},
            {"id": "pin.jax", "status": "ok", "found": "0.4.22"},
        ]
    }
    got = F.check_env(json.dumps(checks), 1)
    assert got["exit"] == 1 and got["failed"] == ["cudnn.loaded: no libcudnn (fix: make sif)"]


def site(**over) -> dict:
    facts = {
        "gpus": F.gpus(SMI_CSV, 0, SMI_BANNER),
        "isolation": F.isolation({}, "", F.gpus(SMI_CSV, 0, SMI_BANNER)),
        "infiniband_host": F.devices(IB_LS, 0),
        "infiniband_image": F.devices(IB_LS, 0),
        "kill_delay": F.kill_delay(
            json.dumps({"Queue": {"rt_HF": {"kill_delay": 60}}}), 0, "rt_HF"
        ),
        "placement": F.placement(
            JOB_JSON.replace("(hnode001:ncpus=1)+(hnode001", "(hnode001:ncpus=1)+(hnode002"),
            0,
            "12.pbs1",
        ),
        "launcher": F.launcher(OMPI_TM, 0, {}),
        "singularity_login": F.singularity("SingularityCE version 4.1.5", 0),
        "singularity_compute": F.singularity("SingularityCE version 4.1.5", 0),
        "check_env": F.check_env('{"checks": []}', 0),
        "outbound": F.outbound("huggingface.co:443", None),
    }
    facts.update(over)
    return facts


def test_a_site_as_launch_assumes_has_no_differences():
    assert probesite.differences(site(), 2) == []


def test_hidden_gpus_are_asked_of_a_shared_node_only():
    """An rt_HG probe (1 node) seeing 8 GPUs without CUDA_VISIBLE_DEVICES: other jobs' GPUs are in reach; an rt_HF
    pair owns its nodes' 8 GPUs."""
    eight = F.gpus(SMI_CSV * 8, 0, SMI_BANNER)
    facts = site(gpus=eight, isolation=F.isolation({}, "", eight))
    assert [d["fact"] for d in probesite.differences(facts, 1)] == ["gpu isolation"]
    assert probesite.differences(facts, 2) == []


def test_each_contradiction_is_named_with_its_fix():
    diffs = probesite.differences(
        site(
            infiniband_image=F.devices("ls: cannot access '/dev/infiniband'", 2),
            kill_delay=F.kill_delay(QUEUE_JSON, 0, "rt_HG"),
            placement=F.placement(JOB_JSON, 0, "12.pbs1"),
            launcher=F.launcher(OMPI_SSH, 0, {}),
            singularity_compute=F.singularity("SingularityCE version 4.3.1", 0),
            outbound=F.outbound("huggingface.co:443", "TimeoutError: timed out"),
            gpus=F.gpus(SMI_CSV, 0, SMI_BANNER.replace("12.4", "11.8")),
        ),
        2,
    )
    fixes = {d["fact"]: d["fix"] for d in diffs}
    assert fixes["/dev/infiniband"] == "--bind /dev/infiniband"
    assert "save_interval" in fixes["kill_delay"]
    assert "place=scatter" in fixes["placement"]
    assert "pbs_tmrsh" in fixes["mpirun"]
    assert "rt_HC" in fixes["SingularityCE"]
    assert "HF_HUB_OFFLINE=1" in fixes["outbound"]
    assert "PROFILE=cuda11" in fixes["driver"]


def test_the_writer_reports_from_a_raw_directory_and_launch_warns_from_it(tmp_path, monkeypatch):
    raw = tmp_path / "runs" / "probe" / "raw"
    raw.mkdir(parents=True)
    outputs = {
        "env.txt": ("PBS_JOBID=12.pbs1\nPBS_QUEUE=rt_HG\n", 0),
        "qstat-queue.json": (QUEUE_JSON, 0),
        "nvidia-smi.csv": (SMI_CSV, 0),
        "nvidia-smi.txt": (SMI_BANNER, 0),
        "host-infiniband.txt": (IB_LS, 0),
        "image-infiniband.txt": ("ls: no such file", 2),
    }
    for name, (text, rc) in outputs.items():
        (raw / name).write_text(text)
        (raw / f"{name}.rc").write_text(f"{rc}\n")
    directory = str(raw.parent)
    assert (
        write.main(
            [directory, "--connect", "example.invalid:443"], try_connect=lambda t: "gaierror"
        )
        == 0
    )
    rep = json.loads((raw.parent / probesite.REPORT).read_text())
    assert rep["job_id"] == "12.pbs1" and rep["facts"]["kill_delay"]["seconds"] == 5
    assert "absent" in rep["facts"]["quota"] and rep["facts"]["outbound"]["reached"] is False
    text = (raw.parent / probesite.TEXT).read_text()
    assert "Fix: --bind /dev/infiniband" in text and "kill_delay" in text
    path = probesite.find_report("runs/ft", {}, str(tmp_path))
    assert path == os.path.join(str(tmp_path), "runs", "probe", "probe.json")
    one = probesite.launch_warnings(probesite.read_report(path), path, 1)
    two = probesite.launch_warnings(probesite.read_report(path), path, 2)
    assert not any("/dev/infiniband" in w for w in one) and any(
        "Fix: --bind /dev/infiniband" in w for w in two
    )
    assert probesite.status_lines(directory)[0].startswith(f"probe report {path} (job 12.pbs1)")


def probe_report(path, **facts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rep = write.report(
        site(**facts), {"PBS_JOBID": "12.pbs1", "PBS_QUEUE": "rt_HG"}, 1, "2026-01-01T00:00:00Z"
    )
    path.write_text(json.dumps(rep))


LAUNCH = ["launch", "pbs", "--group", "gxx00000", "--dry-run"]


def test_launch_warns_where_the_probe_found_the_site_other(tmp_path, monkeypatch, capsys):
    """A probe report in runs/probe: a multi-node job is warned of an image without /dev/infiniband with the fix;
    a 1-node job only of what concerns every job (the kill delay); the script is rendered all the same."""
    from octo_dist import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(probesite.REPORT_ENV, raising=False)
    probe_report(
        tmp_path / "runs" / "probe" / "probe.json",
        infiniband_image=F.devices("ls: no such file", 2),
        kill_delay=F.kill_delay(QUEUE_JSON, 0, "rt_HG"),
    )
    assert cli.main([*LAUNCH, "--nodes", "2"]) == 0
    err = capsys.readouterr().err
    assert "octo-dist launch: warning: /dev/infiniband: the probe job 12.pbs1" in err, err
    assert "Fix: --bind /dev/infiniband" in err and "warning: kill_delay: " in err, err
    assert cli.main([*LAUNCH, "--nodes", "1"]) == 0
    err = capsys.readouterr().err
    assert "/dev/infiniband" not in err and "warning: kill_delay: " in err, err
    elsewhere = tmp_path / "probe-elsewhere.json"
    elsewhere.write_text("not json")
    monkeypatch.setenv(probesite.REPORT_ENV, str(elsewhere))
    assert cli.main([*LAUNCH, "--nodes", "1"]) == 0
    assert f"warning: {elsewhere}: not a probe report" in capsys.readouterr().err


def test_probe_renders_a_10_minute_job_and_refuses_what_it_cannot_submit(
    tmp_path, monkeypatch, capsys
):
    from octo_dist import cli

    monkeypatch.chdir(tmp_path)
    assert (
        cli.main(["probe", "-P", "gxx00000"]) == 2
    )  # refused before anything is written or submitted
    assert "no image " in capsys.readouterr().err and os.listdir(tmp_path) == []
    assert cli.main(["probe", "-P", "gxx00000", "--dry-run"]) == 0
    one = capsys.readouterr().out
    assert "#PBS -q rt_HG\n#PBS -l select=1:mpiprocs=1\n#PBS -l walltime=00:10:00\n" in one
    assert "octo-dist validate" not in one and "check-env --deep --json" in one
    assert subprocess.run(["bash", "-n"], input=one, text=True).returncode == 0
    assert cli.main(["probe", "-P", "gxx00000", "--nodes", "2", "--dry-run"]) == 0
    two = capsys.readouterr().out
    assert "#PBS -q rt_HF\n#PBS -l select=2:mpiprocs=1\n#PBS -l place=scatter\n" in two
    assert (
        '-hostfile "$PBS_NODEFILE" --map-by ppr:1:node singularity exec' in two
        and "octo-dist validate" in two
    )
    assert cli.main(["probe", "-P", "gxx00000", "--connect", "huggingface.co", "--dry-run"]) == 2


def test_outbound_is_reported_not_failed():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert write.connect(f"127.0.0.1:{port}") is None
    refused = write.connect(f"127.0.0.1:{port}")  # closed now: refused at once
    assert refused and "ConnectionRefusedError" in refused
    assert F.outbound("h:443", refused) == {"target": "h:443", "reached": False, "error": refused}


def test_the_login_nodes_singularity_is_recorded_at_submit(tmp_path, monkeypatch):
    """A fake singularity on PATH printing what SingularityCE 4.1.5 prints: its line is written into the script,
    and the job's bash puts it where the report reads it; none at all: absent."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "singularity"
    fake.write_text("#!/bin/sh\necho 'SingularityCE version 4.1.5-1.el9'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    settings = probe.ProbeSettings(
        "gxx00000", 1, str(tmp_path / "save"), None, "/venv", (), "h:443"
    )
    for expected in ("4.1.5-1.el9", None):
        script = probe.render(settings, probe.login_singularity())
        line = next(ln for ln in script.splitlines() if "singularity-login.txt" in ln)
        raw = tmp_path / "raw"
        raw.mkdir(exist_ok=True)
        subprocess.run(["bash", "-c", line], cwd=raw, check=True)
        fact = F.singularity(*write.read_raw(str(raw))["singularity-login.txt"])
        assert fact.get("version") == expected, fact
        fake.unlink(missing_ok=True)


HOST_PYTHON = (
    "/root/.pyenv/versions/3.9.18/bin/python"  # ABCI 3.0's login and compute nodes: Python 3.9
)


def test_the_report_is_written_by_a_bare_python_3_9_where_the_image_does_not_start(tmp_path):
    """The job's last line falls back to the node's Python with the checkout on PYTHONPATH: the writer needs only
    the standard library on 3.9 (-S: no site-packages)."""
    import pytest

    if not os.access(HOST_PYTHON, os.X_OK):
        pytest.skip(f"no {HOST_PYTHON}")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "qstat-queue.json").write_text(QUEUE_TEXT)
    (tmp_path / "raw" / "env.txt").write_text("PBS_QUEUE=rt_HG\n")
    env = {"PYTHONPATH": probe.CHECKOUT, "PATH": "/usr/bin:/bin"}
    argv = [
        HOST_PYTHON,
        "-S",
        "-m",
        "octo_dist.apps.probe.write",
        str(tmp_path),
        "--connect",
        "127.0.0.1:9",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (
        json.loads((tmp_path / probesite.REPORT).read_text())["facts"]["kill_delay"]["seconds"] == 5
    )


# ABCI 3.0 user guide, getting-started ("Checking Disk Quota"): `show_quota -b G` as printed there; system-overview:
# the group area's initial capacity is 0 TB.
SHOW_QUOTA = ABCI_GIB
NEW_GROUP = SHOW_QUOTA.replace("      312             32768", "        0                 0")


def test_the_quota_is_each_areas_use_and_limit_and_a_group_area_without_room_is_named():
    got = F.quota(SHOW_QUOTA, 0)
    assert got["areas"][0] == {
        "directory": "/groups/grpname",
        "used": 312 << 30,
        "limit": 32768 << 30,
        "free": (32768 - 312) << 30,
    }
    assert got["areas"][1]["directory"] == "/home/username" and "Disk quotas" in got["text"]
    assert probesite.differences(site(quota=got), 1) == []
    (diff,) = probesite.differences(site(quota=F.quota(NEW_GROUP, 0)), 1)
    assert diff["fact"] == "quota" and diff["found"] == (
        "/groups/grpname: 0 B free (show_quota: 0 B of 0 B used)"
    )
    assert "user portal" in diff["fix"] and "Octo-Small" in diff["expected"]
    full_home = SHOW_QUOTA.replace("      32              2048", "    2048*             2048")
    assert (
        probesite.differences(site(quota=F.quota(full_home, 0)), 1) == []
    )  # the group area is what counts
    assert "/groups/grpname 312.0 GiB of 32.0 TiB used" in write.shown(got)
