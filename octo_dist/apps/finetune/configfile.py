"""Loading a fine-tune config file: one shipped with octo-dist (``finetune_config.py``) or the user's own.

    load_config("finetune_config.py:head_only,multimodal")  # -> that file's get_config("head_only,multimodal")

Config files are ml_collections files, as the fork's: ``get_config(config_string)`` returns a ``ConfigDict``. Octo
module specs are written in them as plain dicts (``octo_dist.policies.octo_spec.module_spec``), what
``octo.utils.spec.ModuleSpec.create`` returns, so config files load without Octo.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from octo_dist.problems import Refusal

PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "finetune_config.py"


class ConfigError(Refusal, ValueError):
    """The configuration cannot run; raised before the distributed runtime starts (exit 2)."""


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


def load_config(value: str):
    """``"finetune_config.py:head_only,multimodal"`` -> that file's ``get_config("head_only,multimodal")``."""
    path, _, arg = resolve_config_file(value).partition(":")
    spec = importlib.util.spec_from_file_location("octo_dist_finetune_config", path)
    if spec is None or not path.endswith(
        ".py"
    ):  # "config.yaml": Python cannot import it as a module
        raise ConfigError(
            f"--config={value}: {path!r} is not a Python file",
            "an ml_collections config file (*.py) with get_config()",
            "--config=finetune_config.py:full,multimodal, or your own *.py config",
        )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(
            f"--config={value}: {path} has no get_config()",
            "an ml_collections config file defining get_config(config_string)",
            "--config=finetune_config.py:full,multimodal, or add get_config to your file",
        )
    return module.get_config(arg) if arg else module.get_config()
