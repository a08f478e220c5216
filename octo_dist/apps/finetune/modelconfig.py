"""The model config's rules: fine-tuning modes, frozen keys, and the pretrained model's config edited as the fork
edits it (``config_delete_keys``, then ``ConfigDict.update`` with ``update_config``).

    edit_model_config(pretrained.config, delete={"model": {"heads": {"action": None}}}, update={...})

The merge is ml_collections' own (``ConfigDict.update``: nested fields merge key by key, a value replaces one of its
type); only the delete-by-prefix, which ConfigDict lacks, is written here.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from octo_dist.apps.finetune.configfile import ConfigError

FINETUNING_MODES = ("full", "head_only", "head_mlp_only")
MODALITIES = ("image_conditioned", "language_conditioned", "multimodal")


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
    # flat_keys' inverse (the delete above works on dotted paths; ConfigDict has no delete by prefix).
    out: dict = {}
    for keys, v in flat.items():
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = dict(v) if isinstance(v, Mapping) else v
    return out


def edit_model_config(
    base: Mapping, delete: Optional[Mapping] = None, update: Optional[Mapping] = None
) -> dict:
    """The fork's ``config_delete_keys``, then ``ConfigDict(config).update(update_config)``; a plain dict back.

    ``delete={"model": {"heads": {"action": None}}}`` removes every key whose dotted path starts with
    ``model.heads.action`` (a prefix match, as the fork does); ``update`` then merges key by key, as ConfigDict does
    (and refuses, as it does, a value of another type than the one it replaces: a ConfigError here).
    """
    from ml_collections import ConfigDict

    flat = flat_keys(_plain(base))
    for d_key in flat_keys(_plain(delete or {})):
        prefix = ".".join(map(str, d_key))
        for c_key in [c for c in flat if ".".join(map(str, c)).startswith(prefix)]:
            del flat[c_key]
    edited = ConfigDict(_unflat(flat))
    update = flat_keys(_plain(update or {}))
    try:
        edited.update(_unflat({k: v for k, v in update.items() if v is not None}))
        # ConfigDict.update merges a mapping into a sub-config and cannot replace one with None; the configs drop a
        # component so ({"text_processor": None}): those None leaves are set after the merge.
        for keys in [k for k, v in update.items() if v is None]:
            node = edited
            for k in keys[:-1]:
                if k not in node:
                    node[k] = ConfigDict()
                node = node[k]
            node[keys[-1]] = None
    except (
        TypeError
    ) as e:  # "Could not override field 'z' (reference). 3 is of original type int..."
        raise ConfigError(
            f"update_config: {e}",
            "a value of the type the model config has there",
            "fix the --config.update_config value",
        ) from None
    return edited.to_dict()


def _plain(config) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


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
