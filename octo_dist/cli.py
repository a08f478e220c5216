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

# subcommand -> module with add_parser(subparsers); order is the order of `octo-dist --help`.
SUBCOMMANDS = {
    "check-env": "octo_dist.envcheck.cli",
    "env": "octo_dist.envcheck.envreport",
    "smoke": "octo_dist.apps.smoke.app",
    "launch": "octo_dist.jobs.cli",
    "finetune": "octo_dist.apps.finetune.app",
    "weights": "octo_dist.apps.finetune.weights",
    "detect": "octo_dist.launchers.cli",
    "validate": "octo_dist.apps.validate.app",
}
RAW_ARGV = "finetune"  # the subcommand whose arguments are handed over unparsed


def _checker(module_name: str, command: str):
    """The command's ``check_command``, imported only when a script is rendered. On a login node's bare Python
    (no numpy, absl: `octo-dist launch` needs only the standard library) the check is skipped, and says so."""

    def check(argv):
        try:
            importlib.import_module(module_name).check_command(argv)
        except ImportError as e:
            print(
                f"octo-dist launch: note: the {command} flags after -- are not checked here ({e}); run launch "
                f"from the octo-dist environment (or the image) to check them",
                file=sys.stderr,
            )

    return check


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
                    "finetune": _checker("octo_dist.apps.finetune.app", "finetune"),
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
    "--help",
)

BASH_COMPLETION = """\
# bash completion for octo-dist, generated from its parsers: eval "$(octo-dist completion bash)"
_octo_dist() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} key=${{COMP_WORDS[1]}} words
  # "launch/pbs": a command with its own subcommands completes that subcommand's flags from the third word on.
  if [ "$COMP_CWORD" -ge 3 ]; then key="$key/${{COMP_WORDS[2]}}"; fi
  if [ "$COMP_CWORD" -eq 1 ]; then
    words="{commands}"
  else
    case "$key" in
{cases}
      *) words="" ;;
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


def completion_script(shell: str) -> str:
    """A completion script for ``shell`` ("bash" or "zsh") listing every subcommand and each one's flags."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for name, command in sub.choices.items():
        flags = (
            FINETUNE_FLAGS
            if name == RAW_ARGV
            else sorted(
                {o for a in command._actions for o in a.option_strings if o.startswith("--")}
            )
        )
        nested = next(
            (a for a in command._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        if nested is None:
            cases.append(f'      {name}|{name}/*) words="{" ".join(flags)}" ;;')
            continue
        cases.append(f'      {name}) words="{" ".join([*nested.choices, *flags])}" ;;')
        for inner, inner_parser in nested.choices.items():
            inner_flags = sorted(
                {o for a in inner_parser._actions for o in a.option_strings if o.startswith("--")}
            )
            cases.append(f'      {name}/{inner}) words="{" ".join(inner_flags)}" ;;')
    script = BASH_COMPLETION.format(
        commands=" ".join([*sub.choices, "--help", "--version"]), cases="\n".join(cases)
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


def _unknown_message(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """``["--profle", "cpu"]`` -> "unrecognized argument --profle; did you mean --profile?"."""
    import difflib

    word = unknown[0]
    flag = word.split("=", 1)[0]
    flags = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(flag, flags, n=1) if flag.startswith("-") else []
    return f"unrecognized argument {word}" + (f"; did you mean {close[0]}?" if close else "")


def main(argv: Sequence[str] | None = None) -> int:
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
        innermost.error(_unknown_message(innermost, unknown))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(args.func(args) or 0)
