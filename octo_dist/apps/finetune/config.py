"""The fine-tune job's command line and configuration, checked before any rank starts: no Octo, no JAX here.

    octo-dist finetune --config=finetune_config.py:head_only,image_conditioned \
        --config.pretrained_path=weights/octo-small --config.batch_size=256 --name=my_run --debug

The flags are the fork's (``--config`` ml_collections file with ``--config.<field>=...`` overrides, ``--name``,
``--debug``) plus octo-dist's (``--resume``, ``--step_fn``, ``--compile_cache``). ``--config`` names a config
shipped with octo-dist (``finetune_config.py``, ``finetune_smoke_config.py``: :func:`resolve_config_file`) or a
path to your own. :func:`parse` turns the config into one frozen :class:`FinetuneConfig` after :func:`problems`
has checked what would otherwise fail minutes later on every rank: the pretrained checkpoint (a local directory
with Octo's layout, or an ``hf://`` repository that is cached or reachable; compute nodes often have no internet)
and the RLDS dataset directory. Octo module specs are written as plain dicts
(``octo_dist.policies.octo_spec.module_spec``), what ``octo.utils.spec.ModuleSpec.create`` returns, so config
files load without Octo.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from octo_dist.engine.stepfns import STEP_FNS


FINETUNING_MODES = ("full", "head_only", "head_mlp_only")
MODALITIES = ("image_conditioned", "language_conditioned", "multimodal")
HF_PREFIX = "hf://"
URL = re.compile(r"^[a-z][a-z0-9+.-]*://")  # "gs://bucket/rlds", "hf://rail-berkeley/octo-small"
TRAIN_STATE_DIR = "train_state"  # <run dir>/train_state: the engine's resumable checkpoints
# What OctoModel.load_pretrained reads from a checkpoint directory, besides at least one <step>/ directory.
CHECKPOINT_FILES = ("config.json", "example_batch.msgpack", "dataset_statistics.json")
DEFAULT_HF_MODEL = "hf://rail-berkeley/octo-small"
WEIGHTS_FIX = (
    "on a login node: make weights (downloads {hf} into weights/), "
    "then --config.pretrained_path=weights/{leaf}"
)

# probe(repo_id) -> None when the repository is usable (cached or reachable), else why not.
HfProbe = Callable[[str], Optional[str]]


class ConfigError(ValueError):
    """The configuration cannot run; raised before the distributed runtime starts."""


def parse_mode(config_string: str) -> Tuple[str, str]:
    """``"head_only,image_conditioned"`` -> (finetuning mode, modality), as the fork's ``get_config`` accepts."""
    parts = [p.strip() for p in config_string.split(",")]
    if len(parts) != 2 or parts[0] not in FINETUNING_MODES or parts[1] not in MODALITIES:
        raise ConfigError(
            f"config string {config_string!r}; expected '<mode>,<modality>' with mode one of "
            f"{FINETUNING_MODES} and modality one of {MODALITIES} "
            f"(e.g. --config=finetune_config.py:head_only,image_conditioned)"
        )
    return parts[0], parts[1]


def frozen_keys(mode: str) -> Optional[tuple]:
    """Parameter patterns (fnmatch over '.'-joined paths) the optimizer leaves alone, per fine-tuning mode.

    None means "the pretrained model's own ``optimizer.frozen_keys``" (the fork's ``full`` mode).
    """
    if mode == "full":
        return None
    if mode == "head_only":
        return ("octo_transformer.*",)
    if mode == "head_mlp_only":
        return (
            "octo_transformer.*",
            "heads_*.map_head.probe",
            "heads_*.map_head.MultiHeadDotProductAttention_0.*",
        )
    raise ConfigError(f"finetuning_mode {mode!r}; expected one of {FINETUNING_MODES}")


# --- the model config: the pretrained one, edited as the fork edits it ------------------------------------------


def flat_keys(d: Mapping, prefix: tuple = ()) -> dict:
    """{("a", "b"): leaf}; an empty dict is a leaf (flax's keep_empty_nodes), so it survives a round trip."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(flat_keys(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _unflat(flat: Mapping[tuple, Any]) -> dict:
    out: dict = {}
    for keys, v in flat.items():
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = dict(v) if isinstance(v, Mapping) else v
    return out


def _update(target: dict, other: Mapping) -> dict:
    # ConfigDict.update: nested dicts merge key by key; anything else replaces.
    for k, v in other.items():
        if isinstance(v, Mapping) and isinstance(target.get(k), dict):
            _update(target[k], v)
        else:
            target[k] = _unflat(flat_keys(v)) if isinstance(v, Mapping) else v
    return target


def edit_model_config(
    base: Mapping, delete: Optional[Mapping] = None, update: Optional[Mapping] = None
) -> dict:
    """The fork's ``config_delete_keys`` then ``update_config``, as plain dicts.

    ``delete={"model": {"heads": {"action": None}}}`` removes every key whose dotted path starts with
    ``model.heads.action`` (a prefix match, as the fork does); ``update`` then merges key by key.
    """
    flat = flat_keys(base)
    for d_key in flat_keys(delete or {}):
        prefix = ".".join(map(str, d_key))
        for c_key in [c for c in flat if ".".join(map(str, c)).startswith(prefix)]:
            del flat[c_key]
    return _update(_unflat(flat), update or {})


def resolve_frozen_keys(config: Mapping, model_config: Mapping) -> tuple:
    """The optimizer's frozen keys: ``optimizer.frozen_keys`` if set (the fork's config string sets it per mode);
    else the ``finetuning_mode``'s (so ``--config.finetuning_mode=head_only`` alone works); in ``full`` mode the
    pretrained model's own ``optimizer.frozen_keys`` (Octo-Small freezes its T5 encoder: ``*hf_model*``)."""
    explicit = (config.get("optimizer") or {}).get("frozen_keys")
    if explicit is not None:
        return tuple(explicit)
    by_mode = frozen_keys(config.get("finetuning_mode", "full"))
    if by_mode is not None:
        return by_mode
    return tuple((model_config.get("optimizer") or {}).get("frozen_keys") or ())


# --- names and directories --------------------------------------------------------------------------------------


def format_name(name: str, config: Mapping) -> str:
    """The fork's ``format_name_with_config``: ``"ft_{batch_size}_{finetuning_mode}"`` -> ``"ft_256_full"``.

    Keys are a leaf's name or its full path joined by ``_`` (``{dataset_kwargs_name}``).
    """
    flat = {"_".join(map(str, k)): v for k, v in flat_keys(config).items()}
    values = {**{k.split("_")[-1]: v for k, v in flat.items()}, **flat}
    try:
        return name.format(**values)
    except (KeyError, IndexError) as e:
        raise ConfigError(
            f"--name={name!r} names {e} which is not a config field; expected fields like "
            f"{{batch_size}} or {{dataset_kwargs_name}}"
        ) from None


def run_dir(config: Mapping, name: str) -> Optional[str]:
    """``<save_dir>/<wandb.project>/<wandb.group>/<name>``, or None without a save_dir; absolute unless a URL
    (orbax and ``save_pretrained`` refuse relative paths; every rank has the same working directory).

    The fork appends a timestamp (a new directory each launch). Here the directory depends only on the flags, so a
    job requeued after its wall time finds its own checkpoints (``--resume``), and a second run with the same name
    is refused instead of mixed in.
    """
    if not config.get("save_dir"):
        return None
    wandb = config.get("wandb") or {}
    parts = [str(config["save_dir"]), str(wandb.get("project") or "octo_finetune")]
    if wandb.get("group"):
        parts.append(str(wandb["group"]))
    parts.append(format_name(name, config))
    joined = os.path.join(*parts)
    return joined if is_url(joined) else os.path.abspath(joined)


def saved_steps(directory: str | Path) -> list:
    """Finished checkpoint steps in an orbax directory (``3/``, ``6/``; half-written ``3.orbax-checkpoint-tmp-*``
    directories are not steps)."""
    d = Path(directory)
    return (
        sorted(int(c.name) for c in d.iterdir() if c.is_dir() and c.name.isdigit())
        if d.is_dir()
        else []
    )


def expected_start(train_state_dir: Optional[str], resume: bool) -> int:
    """The step a run will start at, read from the directory before start-up: the newest saved step with ``--resume``
    (``[3, 6]`` -> 6), else 0. Training verifies that step's checksums and may resume from an older one; the data
    pipeline, built for this step, is then built again for the other (see ``app.OctoData.batches``)."""
    steps = saved_steps(train_state_dir) if train_state_dir and resume else []
    return steps[-1] if steps else 0


def resume_problem(train_state_dir: Optional[str], resume: bool) -> Optional[str]:
    """Checkpoints already there without ``--resume``: refused before start-up (octo_dist.engine.train refuses it too, but
    only after every rank has loaded data and compiled the model)."""
    steps = saved_steps(train_state_dir) if train_state_dir else []
    if steps and not resume:
        return (
            f"{train_state_dir} already holds checkpoints (latest: step {steps[-1]}) and --resume was not given; "
            f"expected a new run directory. Fix: add --resume to continue that run, or pick another --name or "
            f"--config.save_dir (nothing was overwritten)"
        )
    return None


# --- checks over the config: what must exist before any rank compiles ------------------------------------------


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
    steps = sorted(int(c.name) for c in p.iterdir() if c.is_dir() and c.name.isdigit())
    problems = []
    if missing:
        problems.append(f"pretrained checkpoint {str(path)!r} lacks {', '.join(missing)}")
    if not steps:
        problems.append(
            f"pretrained checkpoint {str(path)!r} has no <step>/ directory of parameters"
        )
    return problems


def hf_repo(path: str) -> str:
    """``"hf://rail-berkeley/octo-small"`` -> ``"rail-berkeley/octo-small"``."""
    repo = path[len(HF_PREFIX) :].strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"pretrained_path {path!r}; expected hf://<owner>/<name>")
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


# --- the parsed configuration -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tune job, checked and parsed once (:func:`parse`): what the job reads, nothing re-derived later."""

    config: Mapping[
        str, Any
    ]  # the whole config as plain data: Octo's calls, finetune_config.json, wandb
    name: str  # the run's name, formatted: "ft_{batch_size}" -> "ft_256"
    run_dir: Optional[str]  # absolute (or a URL); None without --config.save_dir
    seed: int
    batch_size: int  # global, over every process
    num_steps: int
    shuffle_buffer_size: int  # per process
    log_interval: int
    save_interval: int  # 0: only at the end and on a stop signal
    pretrained_path: Optional[str]
    pretrained_step: Optional[int]
    dataset_name: str
    finetuning_mode: str
    wandb_project: str
    wandb_group: Optional[str]
    wandb_entity: Optional[str]
    debug: bool = False  # wandb disabled
    resume: bool = False
    step_fn: str = "auto"
    compile_cache: Optional[str] = None

    @property
    def train_state_dir(self) -> Optional[str]:
        """Where the engine's resumable checkpoints go: ``<run dir>/train_state``."""
        return os.path.join(self.run_dir, TRAIN_STATE_DIR) if self.run_dir else None

    def fingerprint(self) -> dict:
        """The settings a resumed run must share with the run it continues (checked against the checkpoint)."""
        return {
            "batch_size": self.batch_size,
            "seed": self.seed,
            "step_fn": self.step_fn,
            "pretrained_path": str(self.pretrained_path),
            "dataset": self.dataset_name,
            "finetuning_mode": self.finetuning_mode,
        }


def plain(config) -> dict:
    """A ConfigDict (``--config`` parsed by ml_collections) or a mapping -> a plain dict."""
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def parse(
    config,
    probe: HfProbe,
    *,
    name: str = "experiment",
    debug: bool = False,
    resume: bool = False,
    step_fn: str = "auto",
    compile_cache: Optional[str] = None,
) -> FinetuneConfig:
    """Check ``config`` (every problem at once, as a ConfigError) and return the job it describes.

    Also refused here: a run directory that already holds checkpoints without ``resume`` (the engine refuses it
    too, but only after every rank has loaded data and compiled the model).
    """
    cfg = plain(config)
    validate(cfg, probe)
    out = run_dir(cfg, name)
    train_state = os.path.join(out, TRAIN_STATE_DIR) if out else None
    refused = resume_problem(train_state, resume)
    if refused:
        raise ConfigError(refused)
    wandb = cfg.get("wandb") or {}
    return FinetuneConfig(
        config=cfg,
        name=format_name(name, cfg),
        run_dir=out,
        seed=int(cfg["seed"]),
        batch_size=int(cfg["batch_size"]),
        num_steps=int(cfg["num_steps"]),
        shuffle_buffer_size=int(cfg["shuffle_buffer_size"]),
        log_interval=int(cfg.get("log_interval") or 1),
        save_interval=int(cfg.get("save_interval") or 0),
        pretrained_path=str(cfg["pretrained_path"]) if cfg.get("pretrained_path") else None,
        pretrained_step=cfg.get("pretrained_step"),
        dataset_name=str(cfg["dataset_kwargs"]["name"]),
        finetuning_mode=str(cfg.get("finetuning_mode", "full")),
        wandb_project=str(wandb.get("project") or "octo_finetune"),
        wandb_group=wandb.get("group"),
        wandb_entity=wandb.get("entity"),
        debug=debug,
        resume=resume,
        step_fn=step_fn,
        compile_cache=compile_cache,
    )


# --- flags ------------------------------------------------------------------------------------------------------

PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "finetune_config.py"
# (flag, absl kind, default, value's name in --help, help): the flags besides --config, defined and described
# from this one table.
FLAGS = (
    (
        "name",
        "string",
        "experiment",
        "NAME",
        "the run's name; may use config fields (ft_{batch_size}_{finetuning_mode}); "
        "the run directory is <save_dir>/<wandb.project>/[<wandb.group>/]<name>",
    ),
    ("debug", "bool", False, "", "a debug run: wandb disabled"),
    ("resume", "bool", False, "", "continue from the latest checkpoint in the run directory"),
    (
        "step_fn",
        "enum",
        "auto",
        "|".join(STEP_FNS),
        "auto: shard_map on the CPU, jit on GPUs; or either by name",
    ),
    (
        "compile_cache",
        "string",
        None,
        "DIR",
        "persistent compilation cache directory (default: $OCTO_DIST_COMPILE_CACHE, else none)",
    ),
)


def packaged_configs() -> list:
    """The config files shipped with octo-dist: ``["finetune_config.py", "finetune_smoke_config.py"]``."""
    return sorted(p.name for p in PACKAGED_CONFIGS.glob("*.py") if not p.name.startswith("_"))


def resolve_config_file(value: str) -> str:
    """``--config``'s value with its file made a real path; the ``:<config string>`` part is kept.

    ``"finetune_config.py:head_only,image_conditioned"`` -> the packaged file (any working directory);
    ``"my_configs/bridge.py"`` -> itself, when the file exists. Raises ConfigError naming the choices otherwise.
    """
    path, sep, rest = value.partition(":")
    if Path(path).is_file():
        return value
    if "/" not in path and (PACKAGED_CONFIGS / path).is_file():
        return f"{PACKAGED_CONFIGS / path}{sep}{rest}"
    raise ConfigError(
        f"--config={value}: no config file {path!r} (absolute: {Path(path).absolute()}); expected a "
        f"path to your own config file or one shipped with octo-dist ({', '.join(packaged_configs())}). "
        f"Fix: --config=finetune_config.py:full,multimodal, or the right path"
    )


def _with_config_resolved(argv: Sequence[str]) -> list:
    """argv with ``--config=X`` / ``--config X`` made a real path (absl reads ``--config``'s file itself)."""
    out, args = list(argv[:1]), list(argv[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith(("--config=", "-config=")):
            flag, _, value = a.partition("=")
            out.append(f"{flag}={resolve_config_file(value)}")
        elif a in ("--config", "-config") and i + 1 < len(args):
            out += [a, resolve_config_file(args[i + 1])]
            i += 1
        else:
            out.append(a)
        i += 1
    return out


def define_flags(flag_values, argv: Sequence[str]) -> None:
    """The fork's flags (``--config``, ``--name``, ``--debug``) and octo-dist's (``--resume``, ``--step_fn``...).

    ``argv`` is needed at definition time: ml_collections registers one flag per ``--config.<field>=`` it sees.
    """
    from absl import flags
    from ml_collections import config_flags

    define = {"string": flags.DEFINE_string, "bool": flags.DEFINE_bool}
    for name, kind, default, _, text in FLAGS:
        if kind == "enum":
            flags.DEFINE_enum(name, default, STEP_FNS, text, flag_values=flag_values)
        else:
            define[kind](name, default, text, flag_values=flag_values)
    config_flags.DEFINE_config_file(
        "config",
        str(PACKAGED_CONFIGS / DEFAULT_CONFIG),
        "the config file",
        flag_values=flag_values,
        lock_config=False,
        sys_argv=list(argv),
    )


def parse_flags(argv: Sequence[str]):
    """argv (program name first) -> the parsed absl FlagValues (``.config``, ``.name``, ``.debug``, ``.resume``)."""
    from absl import flags

    argv = _with_config_resolved(argv)
    fv = flags.FlagValues()
    define_flags(fv, argv)
    with warnings.catch_warnings():
        # ml_collections loads the config file with importlib's deprecated load_module(): not ours to fix.
        warnings.filterwarnings("ignore", message="the load_module", category=DeprecationWarning)
        fv(list(argv))
    return fv


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help", "-help", "--helpfull") for a in argv[1:])


def config_value(argv: Sequence[str]) -> str:
    for i, a in enumerate(argv[1:], 1):
        if a.startswith(("--config=", "-config=")):
            return a.partition("=")[2]
        if a in ("--config", "-config") and i + 1 < len(argv):
            return argv[i + 1]
    return DEFAULT_CONFIG


def load_config(value: str):
    """``"finetune_config.py:head_only,multimodal"`` -> that file's ``get_config("head_only,multimodal")``."""
    path, _, arg = resolve_config_file(value).partition(":")
    spec = importlib.util.spec_from_file_location("octo_dist_finetune_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


USAGE = (
    "usage: octo-dist finetune [--config=FILE[:ARGS]] [--config.FIELD=VALUE ...] [--name=NAME] [--debug]\n"
    "                          [--resume] [--step_fn=auto|jit|shard_map] [--compile_cache=DIR]"
)
DESCRIPTION = """\
Fine-tune Octo on every rank (run it under mpirun, srun, or alone): the pretrained model, edited as the config
says, trained data-parallel on the RLDS dataset; checkpoints in the run directory, resumable with --resume.
The config is checked before any rank starts: a missing dataset or unreachable weights end the job at once.

    mpirun -np 8 octo-dist finetune --config=finetune_config.py:head_only,image_conditioned \\
        --config.pretrained_path=weights/octo-small --config.dataset_kwargs.data_dir=data --config.save_dir=runs"""


def help_text(argv: Sequence[str], width: int = 118) -> str:
    """``octo-dist finetune --help``: the flags with their defaults, then the fields of the chosen config."""
    rows = [
        (
            "--config=FILE[:ARGS]",
            f"a config shipped with octo-dist ({', '.join(packaged_configs())}; "
            f"finetune_config.py takes <mode>,<modality>: mode one of "
            f"{', '.join(FINETUNING_MODES)}; modality one of {', '.join(MODALITIES)}), "
            f"or the path to your own (default: {DEFAULT_CONFIG})",
        )
    ]
    for name, kind, default, metavar, text in FLAGS:
        shown = f"={metavar}" if metavar else ""
        rows.append(
            (
                f"--{name}{shown}",
                text
                if default is None
                else f"{text} (default: {'off' if default is False else default})",
            )
        )
    lines = [USAGE, "", DESCRIPTION, "", "flags:"]
    for flag, text in rows:
        lines += textwrap.wrap(
            text, width, initial_indent=f"  {flag:<24} ", subsequent_indent=" " * 27
        )
    value = config_value(argv)
    lines += [
        "",
        f"config fields of {value} (default value shown; set any with --config.FIELD=VALUE):",
    ]
    try:
        config = plain(load_config(value))
    except Exception as e:  # a bad config string or path: still show the flags
        lines.append(f"  (cannot load {value}: {e})")
    else:
        lines += [
            f"  --config.{'.'.join(map(str, key))}={value!r}"
            for key, value in flat_keys(config).items()
        ]
    return "\n".join(lines) + "\n"
