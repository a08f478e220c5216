"""`octo-dist` command line: a thin dispatcher over the library.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` (which registers the
subcommand and sets ``func``) and does its heavy imports (jax, wandb) inside the function it runs,
so ``octo-dist check-env`` never pays for ``import jax``. ``finetune`` keeps the fork's absl flags
(``--config.batch_size=...`` cannot be declared to argparse): its arguments go to it unparsed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from octo_dist import EXIT_USAGE, __version__
from octo_dist.launchers import onevalue

# subcommand -> module with add_parser(subparsers); order is the order of `octo-dist --help`.
SUBCOMMANDS = {
    "check-env": "octo_dist.envcheck.cli",
    "env": "octo_dist.envcheck.envreport",
    "smoke": "octo_dist.apps.smoke.app",
    "launch": "octo_dist.jobs.cli",
    "jobs": "octo_dist.jobs.jobscli",
    "job-runtime": "octo_dist.jobs.supervisor.zipapp",
    "finetune": "octo_dist.apps.finetune.app",
    "weights": "octo_dist.apps.finetune.weights",
    "convert-frames": "octo_dist.apps.finetune.convertframes",
    "bench-input": "octo_dist.apps.benchinput.cli",
    "detect": "octo_dist.launchers.cli",
    "validate": "octo_dist.apps.validate.app",
    "probe": "octo_dist.jobs.probe",
}
RAW_ARGV = "finetune"  # the subcommand whose arguments are handed over unparsed
TRAINING_COMMANDS = ("smoke", "finetune")  # what `launch ... --` runs


def _checker(module_name: str, command: str):
    """The command's ``check_command``, imported only when a script is rendered. On a login node's bare Python
    (no absl: `octo-dist launch` needs only the standard library) the ImportError reaches launch, which checks in
    the image or says how to (jobs/flagsinimage.py)."""

    def check(argv):
        importlib.import_module(module_name).check_command(argv)

    return check


class _Parser(argparse.ArgumentParser):
    """argparse, with every single-valued flag given once: a plain ``add_argument`` stores with
    ``onevalue.OneValue``, so ``octo-dist bench-input D --cores 2 --cores 4`` is refused in one line (exit 2) where
    argparse kept 4 without a word. Every subcommand's parser is one of these too (``add_subparsers`` makes its
    parsers of the parent's class); flags that add up (``action="append"``) and switches are unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, onevalue.OneValue)
        self.register("action", "store", onevalue.OneValue)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="octo-dist",
        description="Data-parallel multi-node fine-tuning of Octo under mpirun, on a pinned, checked JAX stack.",
    )
    parser.add_argument("--version", action="version", version=f"octo-dist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        if name == "launch":
            # The training command after `--` is checked with its own parser when the script is rendered.
            module.add_parser(
                sub,
                checkers={
                    "smoke": _checker("octo_dist.apps.smoke.app", "smoke"),
                    "finetune": _checker("octo_dist.apps.finetune.arguments", "finetune"),
                },
            )
        else:
            module.add_parser(sub)
    _add_completion(sub)
    return parser


# finetune's flags are absl's, not argparse's: the fork's own flags, for completion.
FINETUNE_FLAGS = (
    "--config=",
    "--name=",
    "--debug",
    "--resume",
    "--step_fn=",
    "--compile_cache=",
    # the start-up flags smoke takes too (runtime.argv_options)
    "--launcher=",
    "--coordinator=",
    "--init-timeout=",
    "--devices-per-process=",
    "--help",
)

BASH_COMPLETION = """\\
# bash completion for octo-dist, generated from its parsers: eval "$(octo-dist completion bash)"
_octo_dist() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} key=${{COMP_WORDS[1]}} words="" i dd=0
  # `launch pbs ... -- smoke --st`: after `--` come the training command and its own flags.
  for ((i = 2; i < COMP_CWORD; i++)); do
    if [ "${{COMP_WORDS[i]}}" = "--" ]; then dd=$i; break; fi
  done
  if [ "$COMP_CWORD" -eq 1 ]; then
    words="{commands}"
  elif [ "$dd" -gt 0 ] && [ "$COMP_CWORD" -eq $((dd + 1)) ]; then
    words="{training}"
  else
    if [ "$dd" -gt 0 ]; then
      key=${{COMP_WORDS[dd+1]}}
    elif [ "$COMP_CWORD" -ge 3 ]; then
      # "launch/pbs": a command with its own subcommands completes that subcommand's flags from the third word on.
      key="$key/${{COMP_WORDS[2]}}"
    fi
    # The value of the flag before the cursor: its choices, a path, or nothing to offer (a number, a name).
    case "$key $prev" in
{values}
      *)
        case "$key" in
{cases}
        esac ;;
    esac
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _octo_dist octo-dist
"""
ZSH_PREAMBLE = (
    '# zsh completion for octo-dist (bash\'s, through bashcompinit): eval "$(octo-dist completion zsh)"\n'
    "autoload -U +X bashcompinit && bashcompinit\n"
)
# Flags whose value is a path (by their dest): completed with file names.
PATH_DESTS = {
    "compile_cache",
    "data_dir",
    "env_file",
    "image",
    "manifest",
    "nccl_log_dir",
    "output",
    "record",
    "report",
    "save_dir",
    "venv",
}


def _value_words(key: str, action: argparse.Action) -> list:
    """What a flag's value may be, for completion: ``--step-fn`` -> ["auto", "jit", "shard_map"]; [] for free text.

    Choices argparse does not know (profiles from the manifest, a scheduler's resource types) are read where they
    are defined, so completion never lists a value the command would refuse."""
    if action.choices:
        return [str(c) for c in action.choices]
    if action.dest == "profile":
        from octo_dist.stack import manifest as mf

        try:
            return sorted(mf.load_manifest().profiles)
        except Exception:  # a checkout without env/stack.toml: no values, the flag still completes
            return []
    if action.dest == "resource_type" and "/" in key:
        from octo_dist.jobs import schedulers

        scheduler = key.split("/", 1)[1]
        return sorted(schedulers.get(scheduler).resource_types)
    return []


def _completion_cases(key: str, parser: argparse.ArgumentParser, pattern: str) -> tuple:
    """(the value cases, the flags case) of one parser for the bash function."""
    values, flags, positional = [], set(), []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            positional += list(a.choices)
        elif not a.option_strings:
            positional += [str(c) for c in a.choices or ()]
        flags.update(o for o in a.option_strings if o.startswith("--"))
        if (
            not a.option_strings
            or a.nargs == 0
            or isinstance(a, (argparse._HelpAction, argparse._VersionAction))
        ):
            continue
        shown = " ".join(a.option_strings)
        # "smoke/*" must stay a glob: quote the words around it ("smoke/"*" --steps")
        when = "|".join(
            f'"{k[:-1]}"*" {o}"' if k.endswith("/*") else f'"{k} {o}"'
            for k in pattern.split("|")
            for o in a.option_strings
        )
        if a.dest in PATH_DESTS:
            values.append(f'      {when}) COMPREPLY=($(compgen -f -- "$cur")); return ;;')
        else:
            words = _value_words(key, a)
            values.append(f'      {when}) words="{" ".join(words)}" ;;  # {shown}')
    case = f'          {pattern}) words="{" ".join([*positional, *sorted(flags)])}" ;;'
    return values, case


def completion_script(shell: str) -> str:
    """A completion script for ``shell`` ("bash" or "zsh"): every subcommand, its flags and their values (choices,
    paths), the training command after ``launch ... --`` with its own flags."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    values, cases = [], []
    for name, command in sub.choices.items():
        if name == RAW_ARGV:
            cases.append(f'          {name}|{name}/*) words="{" ".join(FINETUNE_FLAGS)}" ;;')
            continue
        nested = next(
            (a for a in command._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        v, c = _completion_cases(name, command, name if nested else f"{name}|{name}/*")
        values += v
        cases.append(c)
        for inner, inner_parser in (nested.choices if nested else {}).items():
            v, c = _completion_cases(f"{name}/{inner}", inner_parser, f"{name}/{inner}")
            values += v
            cases.append(c)
    script = BASH_COMPLETION.format(
        commands=" ".join([*sub.choices, "--help", "--version"]),
        training=" ".join(sorted(TRAINING_COMMANDS)),
        values="\n".join(values),
        cases="\n".join(cases),
    )
    return (ZSH_PREAMBLE + script) if shell == "zsh" else script


def _add_completion(sub) -> None:
    p = sub.add_parser(
        "completion",
        help="print a bash or zsh completion script for octo-dist",
        description='Load it in your shell: eval "$(octo-dist completion bash)" in ~/.bashrc, '
        'or eval "$(octo-dist completion zsh)" in ~/.zshrc.',
    )
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    p.set_defaults(func=lambda args: print(completion_script(args.shell), end="") or 0)


def _innermost_parser(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> argparse.ArgumentParser:
    """The parser of the deepest subcommand named in ``argv``: ``["launch", "pbs", "--nodse", "2"]`` -> launch pbs's."""
    for word in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            if word == "--":
                break
            continue
        parser = sub.choices[word]
    return parser


def _unknown_message(
    parser: argparse.ArgumentParser, unknown: Sequence[str], argv: Sequence[str] = ()
) -> str:
    """``["--profle", "cpu"]`` -> "unrecognized argument --profle; did you mean --profile?"."""
    import difflib

    word = unknown[0]
    flag = word.split("=", 1)[0]
    flags = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(flag, flags, n=1) if flag.startswith("-") else []
    if close:
        return f"unrecognized argument {word}; did you mean {close[0]}?"
    return f"unrecognized argument {word}" + _after_dashes_hint(parser, word, argv)


def _after_dashes_hint(parser: argparse.ArgumentParser, word: str, argv: Sequence[str]) -> str:
    """A launch flag nobody knows, on a command line without ``--``, is most often a training flag put before it:
    ``launch pbs --nodes 2 finetune --config.num_steps=5`` -> "; training flags go after --: ..."."""
    if not parser.prog.startswith("octo-dist launch ") or "--" in argv or not word.startswith("-"):
        return ""
    command = next((w for w in argv if w in ("smoke", "finetune")), "finetune")
    return f"; training flags go after --: {parser.prog} [options] -- {command} {word}"


def main(argv: Sequence[str] | None = None) -> int:
    from octo_dist.runtime import startclock

    startclock.done(
        "imports"
    )  # the start-up profile's first phase: the interpreter and this module
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [RAW_ARGV]:
        from octo_dist.apps.finetune import app

        return app.main([f"octo-dist {RAW_ARGV}", *argv[1:]])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse reports a subcommand's unknown flag through the top-level parser ("usage: octo-dist [-h] ...
        # unrecognized arguments: --profle cpu"): name the subcommand's usage and the closest flag instead.
        innermost = _innermost_parser(parser, argv)
        innermost.error(_unknown_message(innermost, unknown, argv))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(args.func(args) or 0)
