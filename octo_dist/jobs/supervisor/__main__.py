"""``python -m octo_dist.jobs.supervisor`` / ``python3 RUNTIME.pyz``: ``supervise SETTINGS`` or
``octo-dist-rank JOB_DIR CMD...`` (see the package docstring)."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["supervise"] and len(argv) == 2:
        from octo_dist.jobs.supervisor import supervise

        return supervise.main(argv[1])
    if argv[:1] == ["octo-dist-rank"] and len(argv) >= 3:
        from octo_dist.jobs.supervisor import rankguard

        return rankguard.main(argv[1], argv[2:])
    print(
        f"octo-dist job runtime: error: arguments {argv!r}; expected 'supervise SETTINGS_JSON' or "
        "'octo-dist-rank JOB_DIR CMD...'. Fix: run the job script octo-dist launch wrote",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
