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
    "smoke": "octo_dist.apps.smoke.app",
    "launch": "octo_dist.jobs.cli",
    "finetune": "octo_dist.apps.finetune.app",
    "detect": "octo_dist.launchers.cli",
    "validate": "octo_dist.apps.validate.app",
}
RAW_ARGV = "finetune"   # the subcommand whose arguments are handed over unparsed


def _checker(module_name: str, command: str):
    """The command's ``check_command``, imported only when a script is rendered. On a login node's bare Python
    (no numpy, absl: `octo-dist launch` needs only the standard library) the check is skipped, and says so."""
    def check(argv):
        try:
            importlib.import_module(module_name).check_command(argv)
        except ImportError as e:
            print(f"octo-dist launch: note: the {command} flags after -- are not checked here ({e}); run launch "
                  f"from the octo-dist environment (or the image) to check them", file=sys.stderr)
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
            module.add_parser(sub, checkers={"smoke": _checker("octo_dist.apps.smoke.app", "smoke"),
                                             "finetune": _checker("octo_dist.apps.finetune.app", "finetune")})
        else:
            module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [RAW_ARGV]:
        from octo_dist.apps.finetune import app

        return app.main([f"octo-dist {RAW_ARGV}", *argv[1:]])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(args.func(args) or 0)
