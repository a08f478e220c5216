"""The docs say what ABCI 3.0's user guide says, where they speak of ABCI.

ABCI 3.0 user guide: requests/external-networks (compute nodes reach ports 80 and 443 outbound, so the job's
HF_HUB_OFFLINE=1 is a choice, not the network); system-overview (a node's CPU figure, 192, counts hardware
threads: 2 sockets x 48 cores x 2); the software table (Python 3.9.25 on the login nodes, 3.9.23 on the compute
nodes; SingularityCE 4.1.5 / 4.3.x); containers (builds run on compute nodes).
"""

import re

from helpers import REPO, pbs_launch

README = (REPO / "README.md").read_text()
ABCI = (REPO / "docs" / "abci.md").read_text()
STACK = (REPO / "env" / "stack.toml").read_text()


def section_b(text=README):
    return text.split("## (b) ABCI 3.0", 1)[1].split("\n## ", 1)[0]


def test_no_doc_says_abcis_compute_nodes_are_offline():
    for name, text in (("README (b)", section_b()), ("docs/abci.md", ABCI)):
        for wrong in (
            "compute nodes are offline",
            "no route to huggingface",
            "Compute nodes have no route",
        ):
            assert wrong not in text, (name, wrong)
    assert (
        "ports 80\n   and 443 outbound" in section_b()
        and "HF_HUB_OFFLINE=1` by choice" in section_b()
    )


def test_core_counts_say_cores_and_threads():
    for text in (section_b(), ABCI):
        for m in re.finditer(r"96 (?:CPU )?cores", text):
            assert "192" in text[m.start() : m.end() + 40], text[m.start() - 40 : m.end() + 40]


def test_abcis_pythons_and_singularity_versions():
    assert "3.9.25" in ABCI and "3.9.23" in ABCI and "Python 3.9.18 (`python3`)" not in ABCI
    assert "4.1.5" in ABCI and "4.3.x" in ABCI


def test_module_load_cuda_is_pinned():
    assert not re.search(r"module load cuda(?![/\w])", ABCI), "module load cuda without a version"


def test_the_cuda11_profile_is_not_labelled_production_on_abci():
    assert "production on ABCI" not in STACK


def test_readme_b_walks_the_abci_path_in_abcis_order():
    """Quota first (the group area starts at 0 TB), the image built in a compute-node job (ABCI terminates
    high-load tasks on login nodes), and a reservation's submission."""
    b = section_b()
    quota, build, reservation = (
        b.index("show_quota"),
        b.index("qsub -I -P gxx00000 -q rt_HC"),
        b.index("launch pbs --reservation R1234567"),
    )
    assert quota < build < b.index("make sif PROFILE=cuda12") < reservation
    assert "make sif PROFILE=cuda12" not in b.split("qsub -I", 1)[0]


def test_readme_b_probes_before_the_first_job():
    """The probe job settles what no ABCI document says before any real job spends GPU hours."""
    b = section_b()
    assert b.index("python3 -m octo_dist probe --group gxx00000") < b.index("--submit -- smoke")


def test_readme_bs_own_dataset_flag_is_one_the_fine_tune_takes(tmp_path, monkeypatch, capsys):
    """README (b) tells how to train on one's own dataset; launch checks the flag it names with the fine-tune's own
    flags (this venv has absl), so a renamed config field fails here, not in the job."""
    from octo_dist import cli

    b = section_b()
    flag = "--config.dataset_kwargs.name=my_dataset"
    assert f"`{flag}`" in b and "after `-- finetune`" in b
    assert (
        "singularity exec\nocto-dist-cuda12.sif octo-dist launch pbs ... --dry-run -- finetune ...`"
        in b
    )
    monkeypatch.chdir(tmp_path)
    head = pbs_launch("--venv", str(tmp_path), "--dry-run", group="gxx00000")
    weights = "--config.pretrained_path=weights/octo-small"
    assert cli.main([*head, "--", "finetune", weights, flag]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert (
        cli.main([*head, "--", "finetune", weights, "--config.dataset_kwargs.nam=my_dataset"]) == 2
    )
    assert "unknown config field" in capsys.readouterr().err
