"""octo-dist weights: pretrained Octo weights on disk, for compute nodes without internet.

    octo-dist weights hf://rail-berkeley/octo-small weights/octo-small     # what `make weights` runs

Downloads hf://owner/name into a local directory on a login node, checks it is an Octo checkpoint, and caches the
tokenizer and encoder config files its config names (Octo-Small: t5-base's) into ~/.cache/huggingface, where
transformers looks. Progress is shown per file; an interrupted download resumes where it stopped when the same
command runs again. Then fine-tune with --config.pretrained_path=weights/octo-small and HF_HUB_OFFLINE=1 in the job:
OctoModel.load_pretrained("hf://...") downloads on every rank at start-up, which fails on an ABCI compute node (no
route out) after the job has waited for its nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from octo_dist import EXIT_FAILED, EXIT_USAGE
from octo_dist.apps.finetune.configfile import ConfigError
from octo_dist.apps.finetune.checks import (
    DEFAULT_HF_MODEL,
    HF_PREFIX,
    checkpoint_problems,
    hf_dependencies,
    hf_repo,
)
from octo_dist import subcommand
from octo_dist.problems import Problem

HELP = (
    "download pretrained Octo weights (and the tokenizer files they load) for offline compute nodes"
)
PROBE_TIMEOUT_S = 10.0
# What AutoTokenizer / AutoConfig.from_pretrained read (t5-base: config.json, spiece.model, tokenizer.json).
DEPENDENCY_FILES = ["*.json", "*.model", "*.txt"]


class WeightsError(Problem, RuntimeError):
    """Weights that could not be downloaded or read (exit 1)."""


def pretrained_params(directory: str, step: Optional[int] = None) -> dict:
    """The parameters of an Octo checkpoint directory (``save_pretrained``'s layout: ``<directory>/<step>/default``,
    orbax), step ``step`` or the newest, as saved: nested dicts of numpy arrays.

    ``OctoModel.load_pretrained`` traces the saved model's init first (``jax.eval_shape``) only to give the restore a
    target; the fine-tune copies the weights into its own parameters by key and shape (the fork's ``merge_params``),
    which needs the arrays alone. The trace was 2.5 of the 2.7 s that load took on the start-up's critical path
    (tiny Octo on 2 CPU cores; this restore: 0.1 s), before the step could start compiling."""
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(directory, ocp.PyTreeCheckpointer())
    steps = manager.all_steps()
    chosen = manager.latest_step() if step is None else step
    if chosen is None or chosen not in steps:
        asked = f"step {step}" if step is not None else "step"
        fix = (
            f"--config.pretrained_step={max(steps)}"
            if steps
            else "another --config.pretrained_path"
        )
        raise WeightsError(
            f"{directory}: no checkpoint {asked} (steps found: {', '.join(map(str, sorted(steps))) or 'none'}); "
            f"expected a save_pretrained directory holding it. Fix: {fix}"
        )
    return manager.restore(chosen)


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    # requests' MaxRetryError messages run to several hundred characters; the cause is at the end.
    if "Failed to resolve" in text:
        text = "name resolution failed (no DNS / no route to huggingface.co)"
    if len(text) > 300:  # whole sentences only
        text = text[:300].rsplit(". ", 1)[0] + "."
    return f"{type(e).__name__}: {text.rstrip('.')}"


def probe(repo: str, timeout_s: float = PROBE_TIMEOUT_S, environ=os.environ) -> Optional[str]:
    """The check the fine-tune job runs before starting on an ``hf://`` path: None when ``repo``
    ("rail-berkeley/octo-small") is in the local HF cache or the Hub answers; else why not."""
    import huggingface_hub

    try:
        huggingface_hub.snapshot_download(repo, local_files_only=True)
        return None
    except Exception:
        pass
    if environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return "HF_HUB_OFFLINE is set"
    try:
        huggingface_hub.HfApi().model_info(repo, timeout=timeout_s)
        return None
    except Exception as e:
        return _short(e)


def download(
    source: str, local_dir: str | Path, snapshot: Optional[Callable[..., str]] = None
) -> Path:
    """Fetch ``hf://owner/name`` into ``local_dir`` and check it has Octo's checkpoint layout."""
    if not source.startswith(HF_PREFIX):
        raise WeightsError(
            f"source {source!r}; expected hf://<owner>/<name> (e.g. {DEFAULT_HF_MODEL})"
        )
    repo = hf_repo(source)
    if snapshot is None:
        import huggingface_hub

        snapshot = huggingface_hub.snapshot_download
    local_dir = Path(local_dir)
    try:
        snapshot(repo, local_dir=str(local_dir))
    except Exception as e:
        raise WeightsError(
            f"could not download {source} into {local_dir}: {_short(e)}. Expected huggingface.co to be reachable: "
            f"run `octo-dist weights` (or make weights) on a login node (ABCI compute nodes have no internet), "
            f"behind the proxy if your site needs one (export HTTPS_PROXY=...). Or copy an Octo checkpoint "
            f"directory (config.json, example_batch.msgpack, dataset_statistics.json, <step>/) to {local_dir}"
        ) from None
    found = checkpoint_problems(local_dir)
    if found:
        raise WeightsError(
            f"downloaded {source} into {local_dir}, but {'; '.join(found)}: not an Octo checkpoint?"
        )
    with open(local_dir / "config.json") as f:
        dependencies = hf_dependencies(json.load(f))
    for repo in dependencies:
        # Into the default HF cache (~/.cache/huggingface, shared with compute nodes through $HOME), where
        # transformers' from_pretrained(repo) looks: configs and tokenizer files only, not the encoder's weights.
        try:
            snapshot(repo, allow_patterns=DEPENDENCY_FILES)
        except Exception as e:
            raise WeightsError(
                f"{source} is in {local_dir}, but caching {repo!r} (its tokenizer / encoder config, "
                f"loaded at start-up) failed: {_short(e)}. Fix: rerun octo-dist weights where "
                f"huggingface.co is reachable"
            ) from None
    return local_dir


def add_parser(sub) -> argparse.ArgumentParser:
    p = subcommand.parser(sub, "weights", HELP, __doc__, main)
    p.add_argument(
        "source",
        nargs="?",
        default=DEFAULT_HF_MODEL,
        help=f"hf://owner/name (default: {DEFAULT_HF_MODEL})",
    )
    p.add_argument("local_dir", nargs="?", help="where to put it (default: weights/<name>)")
    return p


def main(args) -> int:
    """``octo-dist weights [SOURCE [LOCAL_DIR]]``."""
    if not args.source.startswith(HF_PREFIX):
        print(
            f"octo-dist weights: error: source {args.source!r}; expected hf://<owner>/<name>. "
            f"Fix: octo-dist weights {DEFAULT_HF_MODEL}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        repo = hf_repo(args.source)  # "hf://../../etc", "hf://a/b/c": one line before any download
    except ConfigError as e:
        print(
            f"octo-dist weights: error: source {args.source[:120]!r}; expected {e.expected}. "
            f"Fix: octo-dist weights {DEFAULT_HF_MODEL}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    local_dir = args.local_dir or os.path.join("weights", repo.split("/")[-1])
    try:
        out = download(args.source, local_dir)
    except WeightsError as e:
        print(f"octo-dist weights: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.source} -> {out}\nuse: --config.pretrained_path={out}")
    return 0
