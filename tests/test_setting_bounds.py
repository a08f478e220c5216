"""One table of bounds (``settings.BOUNDS``): every count ``octo-dist launch`` takes or a job script carries (nodes,
ranks, cores, wall time, stop margin, GPUs, batch, steps, the chain) has its bound there, and a value outside it is
refused in the same words by launch's options' check (``options.check_bounds``) and by the settings' check
(``settings.check(flags=True)``), and on the node by the bound's own range under its JSON path."""

from __future__ import annotations

import dataclasses
import json
from typing import get_type_hints

import pytest

from octo_dist.jobs import options, settings, settingsread, spec
from octo_dist.jobs.settings import BOUNDS, JobSpecError, SettingsError

BASE = options.LaunchOptions(scheduler="sge", nodes=1, gpus_per_node=4)


def _option_of(key: str):
    """The LaunchOptions field whose bound is ``BOUNDS[key]``, or None for a count no flag gives as a number."""
    return next((f for f in options.option_fields() if f.metadata["bound"] is BOUNDS[key]), None)


def _setting_of(key: str):
    """(section name, field) of the job setting whose bound is ``BOUNDS[key]``, or None for launch's own counts."""
    for name, cls in get_type_hints(settings.JobSettings).items():
        for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
            if f.metadata.get("bound") is BOUNDS[key]:
                return name, f
    return None


def _outside(key: str):
    bound = BOUNDS[key]
    return [bound.low - 1, bound.high + 1]


def _refusal(call) -> str:
    with pytest.raises(SettingsError) as e:
        call()
    return str(e.value)


def test_every_count_has_its_bound_in_the_one_table():
    """No count is left to a bound of its own: each int option and each int setting names a table entry, and each
    entry bounds something."""
    for f in options.option_fields():
        if f.metadata["argparse"].get("type") is int:
            assert f.metadata["bound"] in BOUNDS.values(), f.name
    for key in BOUNDS:
        assert _option_of(key) or _setting_of(key), f"BOUNDS[{key!r}] bounds nothing"
    for name in ("steps", "global_batch", "per_gpu_batch", "chain", "nodes", "cpus_per_rank"):
        assert name in BOUNDS


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_a_count_outside_its_bound_is_refused_in_the_same_words_by_both_checks(key):
    job = spec.build(BASE)
    option, setting = _option_of(key), _setting_of(key)
    bound = BOUNDS[key]
    for value in _outside(key):
        words = []
        if option is not None:
            given = dataclasses.replace(BASE, **{option.name: value})
            words.append(_refusal(lambda: options.check_bounds(given)))
            # the whole launch refuses it so, before anything is derived from it
            assert _refusal(lambda: spec.build(given)) == words[-1]
        if setting is not None:
            section_name, field = setting
            section = dataclasses.replace(
                getattr(job.settings, section_name), **{field.name: value}
            )
            carried = dataclasses.replace(job.settings, **{section_name: section})
            words.append(_refusal(lambda: settings.check(carried, flags=True)))
            # on the node, by JSON path, with the same range
            raw = json.loads(job.settings.to_json())
            raw[section_name][field.name] = value
            node = _refusal(lambda: settingsread.from_json(json.dumps(raw)))
            assert f"job setting {section_name}.{field.name}: {value};" in node, node
            assert f"a whole number from {bound.low} to {bound.high}" in node, node
        assert words and len(set(words)) == 1, words
        flag = options.flag_of(option) if option is not None else setting[1].metadata["flag"]
        if flag:
            assert words[0].startswith(f"{flag} {value}; expected "), words[0]
            low, high = bound.low, bound.high
            assert f"{low}" in words[0] and f"{high}" in words[0], words[0]
        else:  # sockets: no flag sets it, so its JSON path names it at render too
            assert words[0].startswith(f"job setting {setting[0]}.{setting[1].name}: {value};")


def test_the_bound_s_fix_is_a_value_within_it():
    """A refusal's fix is the nearest value the bound allows where the table gives no fix of its own:
    ``--chain 51`` -> ``Fix: --chain 50 ...``; ``--chain 0`` -> ``Fix: --chain 1 ...``."""
    for value, nearest in ((0, 1), (settings.MAX_CHAIN + 1, settings.MAX_CHAIN)):
        with pytest.raises(JobSpecError) as e:
            options.check_bounds(dataclasses.replace(BASE, chain=value, submit=True))
        assert f"Fix: --chain {nearest} " in str(e.value), e.value
