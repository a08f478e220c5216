"""Checks over a fine-tune config: what must exist before any rank compiles, each a sentence with its fix.

    problems(config, probe)  # -> ["dataset 'bridge_dataset': data_dir 'data' ... does not exist. Fix: ..."]

The pretrained checkpoint (a local directory with Octo's layout, or an ``hf://`` repository that is cached or
reachable; compute nodes often have no internet), the tokenizers the model loads, the RLDS dataset directory and
the numbers Octo and optax would refuse minutes later on every rank. Pure functions over the config as a mapping
and a probe of the Hugging Face cache.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Mapping, Optional

from octo_dist.apps.finetune.configfile import ConfigError
from octo_dist.apps.finetune.modelconfig import FINETUNING_MODES, edit_model_config

HF_PREFIX = "hf://"
URL = re.compile(r"^[a-z][a-z0-9+.-]*://")  # "gs://bucket/rlds", "hf://rail-berkeley/octo-small"
# What OctoModel.load_pretrained reads from a checkpoint directory, besides at least one <step>/ directory.
CHECKPOINT_FILES = ("config.json", "example_batch.msgpack", "dataset_statistics.json")
DEFAULT_HF_MODEL = "hf://rail-berkeley/octo-small"
WEIGHTS_FIX = (
    "on a login node: make weights (downloads {hf} into weights/), "
    "then --config.pretrained_path=weights/{leaf}"
)

# probe(repo_id) -> None when the repository is usable (cached or reachable), else why not.
HfProbe = Callable[[str], Optional[str]]


def is_url(path: str) -> bool:
    """``"gs://bucket/x"`` and ``"hf://owner/name"`` are URLs; ``"runs/x"`` and ``"/data/x"`` are local paths."""
    return bool(URL.match(path))


def _is_remote(path: str) -> bool:
    # gs://bucket/... is read by tf.io.gfile; it cannot be checked without credentials and network.
    return is_url(path) and not path.startswith(HF_PREFIX)


def checkpoint_problems(path: str | Path) -> list:
    """What a local Octo checkpoint directory lacks (empty: ``OctoModel.load_pretrained`` can read it)."""
    p = Path(path)
    if not p.is_dir():
        return [f"pretrained checkpoint {str(path)!r} is not a directory"]
    missing = [f for f in CHECKPOINT_FILES if not (p / f).is_file()]
    steps = sorted(
        int(c.name) for c in p.iterdir() if c.is_dir() and c.name.isascii() and c.name.isdigit()
    )
    problems = []
    if missing:
        problems.append(f"pretrained checkpoint {str(path)!r} lacks {', '.join(missing)}")
    if not steps:
        problems.append(
            f"pretrained checkpoint {str(path)!r} has no <step>/ directory of parameters"
        )
    return problems


HF_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def hf_repo(path: str) -> str:
    """``"hf://rail-berkeley/octo-small"`` -> ``"rail-berkeley/octo-small"``."""
    repo = path[len(HF_PREFIX) :].strip("/")
    # The Hub's own rule for a repo id: letters, digits, '-', '_', '.', not starting or ending with '-' or '.', no
    # "..", 96 characters at most ("hf://../../etc" and "hf://$(...)/x" are not names, and go nowhere near a path).
    parts = repo.split("/")
    if (
        len(parts) != 2
        or len(repo) > 96
        or ".." in repo
        or not all(HF_NAME.fullmatch(part) for part in parts)
    ):
        raise ConfigError(
            f"pretrained_path {path[:120]!r}",
            "hf://<owner>/<name>, each of letters, digits, '-', '_' and '.' (e.g. hf://rail-berkeley/octo-small)",
            "--config.pretrained_path=hf://rail-berkeley/octo-small, or a local directory",
        )
    return repo


def weights_fix(hf_path: str = DEFAULT_HF_MODEL) -> str:
    return WEIGHTS_FIX.format(hf=hf_path, leaf=hf_path.rstrip("/").split("/")[-1])


def hf_dependencies(model_config: Mapping) -> list:
    """Hugging Face repositories a model config loads at start-up besides its weights: the text processor's
    tokenizer (``HFTokenizer(tokenizer_name="t5-base")``) and language encoders (``LanguageTokenizer(encoder=...)``,
    whose ``setup`` reads the encoder's config). Octo-Small needs ``t5-base`` for both."""
    found = []
    tp = model_config.get("text_processor") or {}
    if isinstance(tp, Mapping) and (tp.get("kwargs") or {}).get("tokenizer_name"):
        found.append(tp["kwargs"]["tokenizer_name"])
    for spec in ((model_config.get("model") or {}).get("task_tokenizers") or {}).values():
        if isinstance(spec, Mapping) and (spec.get("kwargs") or {}).get("encoder"):
            found.append(spec["kwargs"]["encoder"])
    return sorted(set(found))


def _dependency_problems(path: str, model_config: Mapping, probe: HfProbe) -> list:
    out = []
    for repo in hf_dependencies(model_config):
        why = probe(repo)
        if why is not None:
            out.append(
                f"pretrained model {path} loads {repo!r} from Hugging Face at start-up (tokenizer / encoder "
                f"config): not in the local cache and the Hub is unreachable ({why}). Fix: on a login node: "
                f"make weights (caches {repo} in ~/.cache/huggingface too), and export HF_HUB_OFFLINE=1 in "
                f"the job"
            )
    return out


def pretrained_problems(config: Mapping, probe: HfProbe) -> list:
    path = config.get("pretrained_path")
    if not path:
        if config.get("model_config"):
            # A model from config (the smoke config): no weights; a text processor may still need a tokenizer.
            model_config = edit_model_config(
                config["model_config"],
                config.get("config_delete_keys"),
                config.get("update_config"),
            )
            return _dependency_problems("config.model_config", model_config, probe)
        return [
            f"no model: --config.pretrained_path is unset and the config has no model_config. Fix: "
            f"{weights_fix()}, or --config=finetune_smoke_config.py for a tiny model from config"
        ]
    path = str(path)
    if path.startswith(HF_PREFIX):
        repo = hf_repo(path)
        why = probe(repo)
        if why is None:
            return []
        return [
            f"pretrained_path {path}: not in the local Hugging Face cache and the Hub is unreachable ({why}). "
            f"Compute nodes often have no internet. Fix: {weights_fix(path)}"
        ]
    if _is_remote(path):
        return []
    found = checkpoint_problems(path)
    if found:
        found[-1] += (
            f". Expected a directory written by OctoModel.save_pretrained ({', '.join(CHECKPOINT_FILES)}, "
            f"<step>/). Fix: {weights_fix()}"
        )
        return found
    try:
        with open(Path(path) / "config.json") as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        return [f"pretrained checkpoint {path!r}: config.json cannot be read ({e})"]
    model_config = edit_model_config(
        saved, config.get("config_delete_keys"), config.get("update_config")
    )
    return _dependency_problems(path, model_config, probe)


def dataset_problems(dataset_kwargs: Mapping, smoke_fix: str = "make synthetic-data") -> list:
    """Whether ``<data_dir>/<name>/<version>/dataset_info.json`` exists, as tfds.builder(name, data_dir) needs."""
    name, data_dir = dataset_kwargs.get("name"), dataset_kwargs.get("data_dir")
    if not name or not data_dir:
        return [
            f"dataset_kwargs needs name and data_dir (got name={name!r}, data_dir={data_dir!r}). Fix: "
            f"--config.dataset_kwargs.name=<rlds name> --config.dataset_kwargs.data_dir=<dir holding it>"
        ]
    data_dir = str(data_dir)
    if _is_remote(data_dir):
        return []
    base, _, version = str(name).partition(":")
    root = Path(data_dir) / base
    infos = sorted(root.glob(f"{version or '*'}/dataset_info.json")) if root.is_dir() else []
    if infos:
        return []
    from octo_dist.apps.finetune.synthetic_rlds import NAME as SYNTHETIC

    fix = (
        f"{smoke_fix} (writes it to runs/synthetic_rlds), or --config.dataset_kwargs.data_dir=<where you wrote it>"
        if base == SYNTHETIC
        else f"--config.dataset_kwargs.data_dir=<the directory that holds {base}/<version>/>"
    )
    where = (
        "does not exist"
        if not Path(data_dir).is_dir()
        else f"has no {base}/{version or '<version>'}/dataset_info.json"
    )
    return [
        f"dataset {name!r}: data_dir {data_dir!r} (absolute: {Path(data_dir).absolute()}) {where}. Fix: {fix}"
    ]


def problems(config: Mapping, probe: HfProbe) -> list:
    """Everything wrong with ``config`` that can be known before JAX starts, as sentences with a fix each."""
    out = []
    mode = config.get("finetuning_mode", "full")
    if mode not in FINETUNING_MODES:
        out.append(f"finetuning_mode {mode!r}; expected one of {FINETUNING_MODES}")
    for key in ("batch_size", "num_steps", "shuffle_buffer_size"):
        value = config.get(key)
        if not isinstance(value, (int, float)) or int(value) != value or value <= 0:
            out.append(f"{key} {value!r}; expected a positive integer (--config.{key}=...)")
    if not isinstance(config.get("seed"), int) or isinstance(config.get("seed"), bool):
        out.append(f"seed {config.get('seed')!r}; expected an integer (--config.seed=...)")
    for key in ("log_interval", "save_interval"):
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or value <= 0):
            out.append(f"{key} {value!r}; expected a positive integer (--config.{key}=...)")
    lr = (config.get("optimizer") or {}).get("learning_rate")
    if isinstance(lr, Mapping) and lr.get("name") == "cosine":
        # optax: "The cosine_decay_schedule requires positive decay_steps!", raised after the data is loaded.
        warmup, decay = lr.get("warmup_steps", 0), lr.get("decay_steps", 0)
        if not decay > warmup:
            out.append(
                f"optimizer.learning_rate: a cosine schedule needs decay_steps ({decay}) > warmup_steps "
                f"({warmup}); decay_steps follows num_steps in the shipped configs. Fix: "
                f"--config.optimizer.learning_rate.warmup_steps=<fewer than {decay}> or more --config.num_steps"
            )
    if config.get("pretrained_step") is not None and str(
        config.get("pretrained_path", "")
    ).startswith(HF_PREFIX):
        out.append(
            "pretrained_step is set with an hf:// pretrained_path; Octo loads only the latest step from the "
            "Hub. Fix: download it (make weights) and point pretrained_path at the local directory"
        )
    out += pretrained_problems(config, probe)
    out += dataset_problems(config.get("dataset_kwargs") or {})
    return out


def validate(config: Mapping, probe: HfProbe) -> None:
    """Raise ConfigError listing every problem (one per line) if there is any."""
    found = problems(config, probe)
    if found:
        raise ConfigError("the fine-tune configuration cannot run:\n  - " + "\n  - ".join(found))
