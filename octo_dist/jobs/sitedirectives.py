"""The checks on the header lines a site adds to a job script (each scheduler's class writes them: ``site_lines``).

A scheduler's own options (SLURM ``--partition``, Grid Engine ``--queue``, PBS ``--resource``: ``Scheduler.options``)
and ``--directive TEXT`` on every scheduler: a line of the scheduler's own syntax copied as it is (``#SBATCH
--mail-type=END``), refused when it holds a newline, is another scheduler's, sets what the rendered header already
sets (``#SBATCH -N3`` beside ``#SBATCH --nodes=2``: which one wins depends on the scheduler, and either way the job
is not the one rendered) or what no octo-dist job may have (an array job). Each scheduler reads its directives in
its own grammar (``Scheduler.directive_keys``: sbatch's unique prefixes and clustered letters, PBS's case-blind
resource names).

Pure: :func:`refusal` takes the options' values and returns ``(found, expected, fix)`` or None (the caller raises
it as a ``JobSpecError``); :func:`insert` puts a scheduler's ``site_lines`` into its rendered header.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

from octo_dist.jobs import schedulers
from octo_dist.jobs.schedulers.base import Scheduler, unprintable


def owners(option: str) -> list:
    """The registered schedulers that have ``option`` (a name: ``"partition"``), for a refusal's words."""
    return [s.name for s in schedulers.SCHEDULERS.values() if option in {o.name for o in s.options}]


def refusal(
    scheduler: Scheduler,
    *,
    group: Optional[str] = None,
    values: Mapping[str, Any],
    directives: Sequence[str] = (),
) -> Optional[Tuple[str, str, str]]:
    """``(found, expected, fix)`` for the first site option that must not reach the header; None when all may.

    Args:
      scheduler: the job's scheduler.
      group: ``--group`` (SLURM's account, Grid Engine's project, ABCI's group), already checked by the caller.
      values: option name -> value of every scheduler's own options given (``{"partition": "gpu"}``); one of
        another scheduler's is refused.
      directives: ``--directive`` values, ``"#SBATCH --mail-type=END"``.
    """
    own = {o.name for o in scheduler.options}
    for name, value in values.items():
        if value in (None, ()) or name in own:
            continue
        flag = "--" + name.replace("_", "-")
        others = owners(name) or ["no scheduler"]
        return (
            f"{flag} {value if isinstance(value, str) else ' '.join(value)} for {scheduler.name}",
            f"{flag} only with {' or '.join(others)}",
            f"drop {flag}, or give the line as --directive '{scheduler.directive_prefix} ...'",
        )
    found = scheduler.site_refusal(values)
    if found:
        return found
    given = {**values, "group": group}
    for directive in directives:
        found = _directive_refusal(scheduler, directive, given)
        if found:
            return found
    return None


def _directive_refusal(
    scheduler: Scheduler, directive: str, given: Mapping[str, Any]
) -> Optional[Tuple[str, str, str]]:
    prefix = scheduler.directive_prefix
    if unprintable(directive):
        return (
            f"--directive {directive!r} holds a newline or control character",
            "one directive line (a newline would end it and run the rest as a command)",
            "one --directive per line",
        )
    head = directive.split(None, 1)[0] if directive.strip() else ""
    if head != prefix or len(directive.split()) < 2 or "'" in directive or '"' in directive:
        other = [
            s.name
            for s in schedulers.SCHEDULERS.values()
            if head == s.directive_prefix and s is not scheduler
        ]
        return (
            f"--directive {directive!r}"
            + (f" is a {other[0]} directive" if other else f" does not start with {prefix}"),
            f"one {scheduler.name} directive, {prefix} then its options, without quotes",
            f"--directive '{prefix} ...' in {scheduler.name}'s own syntax",
        )
    found = _dependency_refusal(scheduler, directive)
    if found:
        return found
    for key in scheduler.directive_keys(directive):
        if key in scheduler.refused_keys:
            return (
                f"--directive {directive!r} sets {key}",
                f"none: {scheduler.refused_keys[key]}",
                "drop the directive",
            )
        why = scheduler.rendered_keys.get(key)
        if why is None:
            continue
        option = scheduler.conditional_keys.get(key)
        if option is not None and given.get(option) in (None, "", ()):
            continue  # not rendered for this job: the directive is its only spelling
        return (
            f"--directive {directive!r} sets {key}, which the header already sets",
            "directives that add to the header, not contradict it",
            f"drop the directive and use {why}"
            if not why.startswith("nothing")
            else "drop the directive: octo-dist sets it for the job's own needs",
        )
    return None


def dependency_keys(scheduler: Scheduler) -> Tuple[set, str]:
    """What a directive that makes the job wait for another sets, read from the scheduler's own dependency
    command (``depend_help``, what ``--chain`` submits with): ``qsub -W depend=afterany:ID`` -> ``({"-W"},
    "depend")``, ``sbatch --dependency=afterany:ID`` -> ``({"--dependency"}, "")``, ``qsub -hold_jid ID`` ->
    ``({"-hold_jid"}, "")``. The second part is the attribute where the option holds several (PBS's ``-W
    attr=value``: ``-W group_list=...`` is no dependency)."""
    words = scheduler.depend_help.split()[1:]  # ["-W", "depend=afterany:ID"]
    if not words:
        return set(), ""
    keys = set(scheduler.directive_keys(" ".join([scheduler.directive_prefix, *words])))
    attribute = re.match(r"([a-z_]+)=", words[-1])
    return keys, attribute.group(1) if attribute else ""


def _dependency_refusal(scheduler: Scheduler, directive: str) -> Optional[Tuple[str, str, str]]:
    """A directive that holds the job until another has ended: the dependencies of a chain's jobs are octo-dist's
    to write (``--chain N --submit`` submits each job after the one before, ``qsub -W depend=afterany:ID``); one
    in the script as well is read beside them (PBS takes the command line's, so the chain's first job alone waits
    for it), or instead of them."""
    keys, attribute = dependency_keys(scheduler)
    sets = keys & set(scheduler.directive_keys(directive))
    if not sets or (attribute and not re.search(rf"{attribute}\s*=", directive, re.IGNORECASE)):
        return None
    wait = scheduler.depend_help.replace("ID", "JOB_ID")
    program, _, options = wait.partition(" ")
    return (
        f"--directive {directive!r} makes the job wait for another job",
        "no dependency among the directives: octo-dist writes the chain's own (--chain N --submit holds each "
        f"job until the one before has ended: {scheduler.depend_help})",
        "drop the directive; to hold the job until another has ended, submit the written script yourself: "
        f"{program} {options} SCRIPT",
    )


def insert(header: str, lines: Iterable[str], prefix: str) -> str:
    """``lines`` after the last directive of a rendered header, where the scheduler still reads them (PBS and
    Grid Engine stop at the first command; comments in between are fine)."""
    lines = list(lines)
    if not lines:
        return header
    rows = header.split("\n")
    last = max(i for i, row in enumerate(rows) if row.startswith(prefix + " "))
    return "\n".join(rows[: last + 1] + lines + rows[last + 1 :])
