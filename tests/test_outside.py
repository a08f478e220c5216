"""Text from outside octo-dist (``launchers/outside.py``): reads bounded (``/dev/zero``), binary files and directories
refused in one line, outside commands ended after their timeout with their whole process group, and control
sequences shown escaped."""

import os
import sys

import pytest

from helpers import wait_until, with_growing_budget

from octo_dist.launchers import outside


def test_escape_shows_esc_osc_and_c1_controls_and_keeps_text():
    assert outside.escape("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert outside.escape("\x1b]0;owned\x07title") == "\\x1b]0;owned\\x07title"
    assert outside.escape("a\nb\tc\rd\x7f\x9b") == "a\\nb\\tc\\rd\\x7f\\x9b"
    assert outside.escape("gxx00000 /groups/ü") == "gxx00000 /groups/ü"
    assert outside.shown("  x" * 400, limit=10).endswith("more characters)")


def test_read_text_is_bounded_even_on_an_endless_file():
    with pytest.raises(outside.InputError) as e:
        outside.read_text("/dev/zero", 1 << 16, "--env-file", "env > f.env")
    assert str(e.value) == (
        "--env-file /dev/zero is longer than 65536 bytes (read stopped there); expected a file of at most "
        "65536 bytes. Fix: env > f.env"
    )


def test_read_text_refuses_a_binary_file_and_a_directory_in_one_line(tmp_path):
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    with pytest.raises(outside.InputError, match=r"is not UTF-8 text \(byte 0xff at offset 8\)"):
        outside.read_text(str(binary), 1024, "", "fix it")
    with pytest.raises(outside.InputError, match=r"is a directory; expected a file. Fix: fix it$"):
        outside.read_text(str(tmp_path), 1024, "", "fix it")
    with pytest.raises(FileNotFoundError):
        outside.read_text(str(tmp_path / "absent"), 1024, "", "fix it")


HANGS = f"""#!{sys.executable}
import os, sys, time
child = os.fork()  # a child of its own, which the timeout must end too
if child == 0:
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)
print("waiting for the server", file=sys.stderr, flush=True)
time.sleep(600)
"""


def test_a_command_that_hangs_is_ended_with_its_children(tmp_path):
    exe = tmp_path / "hangs"
    exe.write_text(HANGS)
    exe.chmod(0o755)
    pid_file = tmp_path / "child.pid"

    def run(budget):
        pid_file.unlink(missing_ok=True)
        with pytest.raises(outside.CommandTimeout) as e:
            outside.run_command([str(exe), str(pid_file)], timeout_s=budget)
        return e.value

    # The program must start (Python, a fork) before the budget ends: it grows on a machine too busy for that.
    budget, error = with_growing_budget(
        run, lambda e: pid_file.exists() and "waiting for the server" in e.stderr
    )
    assert "waiting for the server" in error.stderr and f"did not end within {budget} s" in str(
        error
    )
    child = int(pid_file.read_text())

    def ended() -> bool:
        """Killed with its group and reaped by init: gone, or a zombie for the instant before init reaps it."""
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().split()[2] == "Z"
        except FileNotFoundError:
            return True

    # A SIGKILL is delivered when the process next runs, which a loaded machine delays; a child left alive would
    # sleep its 600 s, far past this bound (the kernel's, not the product's).
    wait_until(
        ended,
        what=f"the hung command's child {child} to die of its group's SIGKILL",
        poll_s=0.05,
        hang_s=120,
    )


def test_command_output_is_bounded_and_decoded_whatever_the_bytes(tmp_path):
    exe = tmp_path / "noisy"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write(b'12\\xff' + b'x' * 200000)\n"
        "sys.stderr.buffer.write(b'\\x1b[31mbad\\x80')\n"
    )
    exe.chmod(0o755)
    done = outside.run_command([str(exe)], timeout_s=60, limit=1000)
    assert done.returncode == 0 and len(done.stdout) <= 1004 and done.stdout.startswith("12\\xff")
    assert done.stderr == "\x1b[31mbad\\x80" and outside.shown(done.stderr) == "\\x1b[31mbad\\x80"
    with pytest.raises(FileNotFoundError):
        outside.run_command([str(tmp_path / "absent")], timeout_s=5)
    assert os.path.exists(exe)
