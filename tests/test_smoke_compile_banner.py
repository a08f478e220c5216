"""`make smoke` (`octo-dist smoke --check-equivalence`) shows XLA's slow-compile banner once: XLA logs it when a
compilation passes two minutes and again when it ends, in every process of the check (the reference, each rank),
and a newcomer's slow machine printed it twice in one run."""

from __future__ import annotations

import sys

from octo_dist.apps.smoke import compilebanner, equivalence

BANNER = (
    "********************************\n"
    "[Compiling module jit_step] Very slow compile? If you want to file a bug, run with envvar "
    "XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n"
    "********************************\n"
)
# What XLA writes to stderr for one compilation of over two minutes (jax 0.4.x, slow_operation_alarm.cc)
ONE_SLOW_COMPILE = (
    "2026-08-15 06:23:03.016556: E external/xla/xla/service/slow_operation_alarm.cc:65] \n"
    + BANNER
    + "2026-08-15 06:24:05.368570: E external/xla/xla/service/slow_operation_alarm.cc:133] The operation took "
    "3m2.369747s\n\n" + BANNER
)


def shown(banner: compilebanner.CompileBanner, text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if banner.keep(line))


def test_one_slow_compile_shows_the_banner_once_and_how_long_it_took():
    out = shown(
        compilebanner.CompileBanner(), "before\n" + ONE_SLOW_COMPILE + "train: step 20/20\n"
    )
    assert out.count("Very slow compile?") == 1 and out.count("*" * 32) == 2
    assert out.startswith("before\n2026-08-15 06:23:03.016556: E ")
    assert (
        "] The operation took 3m2.369747s\ntrain: step 20/20\n" in out
    )  # no blank line, no second banner


def test_interleaved_ranks_and_a_second_run_add_no_banner():
    banner = compilebanner.CompileBanner()
    first = shown(banner, ONE_SLOW_COMPILE)
    # two ranks under mpirun, their lines interleaved as mpirun forwards them
    rank0, rank1 = ONE_SLOW_COMPILE.splitlines(True), ONE_SLOW_COMPILE.splitlines(True)
    mixed = "".join(a + b for a, b in zip(rank0, rank1))
    second = shown(banner, "[rank 0/2 vm] INFO model: tiny\n" + mixed + "loss 0.1\n")
    assert "Very slow compile?" not in second and "*" * 32 not in second
    assert second.count("The operation took 3m2.369747s") == 2
    assert second.startswith("[rank 0/2 vm] INFO model: tiny\n") and second.endswith("loss 0.1\n")
    assert first.count("Very slow compile?") == 1


def test_other_lines_pass_untouched():
    text = (
        "*****************\n"  # asterisks before any alarm are someone else's
        "E external/xla/xla/service/slow_operation_alarm.cc:65] Constant folding an instruction is taking > 1s:\n"
        "\n"
        "octo-dist smoke: equivalence: OK\n"
    )
    assert shown(compilebanner.CompileBanner(), text) == text


def test_the_check_shows_the_banner_once_over_both_of_its_processes(capfd):
    """Two real processes writing XLA's output to stderr, run as the check runs its reference and its ranks."""
    write = f"import sys; sys.stderr.write({ONE_SLOW_COMPILE!r}); print('done', flush=True)"
    banner = compilebanner.CompileBanner()
    for what in ("reference", "2 processes x 1 device"):
        assert equivalence._run([sys.executable, "-c", write], {}, what, banner) == 0
    captured = capfd.readouterr()
    assert captured.out.count("done\n") == 2
    assert captured.err.count("Very slow compile?") == 1
    assert captured.err.count("The operation took 3m2.369747s") == 2


def test_a_failing_run_keeps_its_exit_status_and_its_error(capfd):
    fail = "import sys; sys.stderr.write('Traceback: boom\\n'); sys.exit(3)"
    assert (
        equivalence._run([sys.executable, "-c", fail], {}, "x", compilebanner.CompileBanner()) == 3
    )
    assert "Traceback: boom\n" in capfd.readouterr().err
