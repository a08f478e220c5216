"""``launch`` reads the group area's room from ABCI's ``show_quota``: a save directory in a group area whose quota
cannot hold the run is refused under ``--submit`` though its file system (Lustre, petabytes) has room.

ABCI 3.0 user guide, getting-started ("Checking Disk Quota"): "To display your disk/inodes usage and quota about
home and group area, use the show_quota command"; ``-b G`` "Display the disk size in Gibibyte. By default, the
display is in Tebibytes"; "If the disk usage exceeds the disk limit, the column displays '*'". System-overview:
the group area's initial capacity is 0 TB, raised in the user portal. The tables below are the guide's examples.
"""

import os

import pytest

from octo_dist.jobs import footprint
from test_abci_submitchecks import refused, site, submit  # noqa: F401  (site: a pytest fixture, used by name)

# The guide's `show_quota -b G`, as printed.
ABCI_GIB = """Disk quotas for ABCI group grpname
  Directory                          used(GiB)        limit(GiB)      used(nfiles)     limit(nfiles)
  /groups/grpname                          312             32768            422372         200000000

Disk quotas for user username
  Directory                          used(GiB)        limit(GiB)      used(nfiles)     limit(nfiles)
  /home/username                            32              2048            103221                 0
"""
# The guide's `show_quota` (whole TiB: a quota under 1 TiB reads 0, hence launch's -b G): the same table, its
# figures "0  32  422372  200000000" and "0  2  103219  0".
ABCI_TIB = (
    ABCI_GIB.replace("GiB", "TiB")
    .replace("312             32768", "  0                32")
    .replace("32              2048            103221", " 0                 2            103219")
)
GIB, TIB = 1 << 30, 1 << 40


def test_the_guides_tables_parse_to_each_areas_use_and_limit():
    assert footprint.parse_quota(ABCI_GIB) == [
        footprint.Quota("/groups/grpname", 312 * GIB, 32768 * GIB, False),
        footprint.Quota("/home/username", 32 * GIB, 2048 * GIB, False),
    ]
    group, home = footprint.parse_quota(ABCI_TIB)
    assert (group.used, group.limit, home.limit) == (0, 32 * TIB, 2 * TIB)
    assert group.free == 32 * TIB


def test_usage_past_the_limit_leaves_nothing_and_a_new_group_area_has_no_room():
    over = ABCI_GIB.replace("      312             32768", "    33000*            32768")
    group = footprint.parse_quota(over)[0]
    assert group.over and group.free == 0
    starred = footprint.parse_quota(ABCI_GIB.replace("      312 ", "        * "))[0]
    assert starred.over and starred.free == 0
    new = footprint.parse_quota(
        ABCI_GIB.replace("      312             32768", "        0                 0")
    )
    assert new[0].limit == 0 and new[0].free == 0


def test_a_table_in_a_unit_it_does_not_know_is_not_guessed():
    assert footprint.parse_quota(ABCI_GIB.replace("(GiB)", "(GB)")) == []
    assert footprint.parse_quota("show_quota: command not found\n") == []


def test_the_save_directorys_area_is_the_innermost_that_holds_it():
    quotas = footprint.parse_quota(ABCI_GIB) + [footprint.Quota("/groups", 0, TIB, False)]
    assert (
        footprint.quota_of("/groups/grpname/octo-dist/runs/ft", quotas).directory
        == "/groups/grpname"
    )
    assert footprint.quota_of("/groups/grpname", quotas).directory == "/groups/grpname"
    assert footprint.quota_of("/groups/grpname2/runs", quotas).directory == "/groups"
    assert footprint.quota_of("/scratch/runs", quotas) is None


def test_free_space_is_the_quotas_where_it_leaves_less_than_the_file_system(tmp_path):
    area = footprint.Quota(str(tmp_path), 3 * GIB, 4 * GIB, False)
    free = footprint.free_bytes(str(tmp_path / "runs" / "ft"), lambda: [area])
    assert free == GIB and free.where == (
        f"in the quota of {tmp_path} (show_quota: 3.0 GiB of 4.0 GiB used)"
    )
    st = os.statvfs(tmp_path)
    roomy = footprint.Quota(str(tmp_path), 0, 1 << 60, False)
    assert footprint.free_bytes(str(tmp_path), lambda: [roomy]).where == "on its file system"
    assert footprint.free_bytes(str(tmp_path), lambda: []) <= st.f_blocks * st.f_frsize


def fake_show_quota(where, table: str, rc: int = 0) -> None:
    """``show_quota`` on the submit shell's PATH printing ``table`` (the group area: the submit directory)."""
    (where / "show_quota").write_text(f"#!/bin/sh\ncat <<'EOF'\n{table}EOF\nexit {rc}\n")
    (where / "show_quota").chmod(0o755)


def test_submit_refuses_a_group_area_whose_quota_cannot_hold_the_run(site, capsys):  # noqa: F811
    """The group area at its initial 0 TB, as show_quota -b G prints it: refused, the quota named with the fix; the
    file system's own free space (this disk's) would have let it through."""
    fake_show_quota(
        site,
        ABCI_GIB.replace("/groups/grpname", str(site))
        .replace("312", "  0")
        .replace("32768", "    0"),
    )
    err = refused(site, capsys, "--data-dir", "data")
    assert (
        f"--save-dir runs/octo-dist: 0 B free in the quota of {site} (show_quota: 0 B of 0 B used)"
        in err
    ), err
    assert "raise the group's quota (ABCI: the user portal" in err, err


@pytest.mark.parametrize("show_quota", ["roomy", "failing", "none"])
def test_submit_goes_ahead_with_room_in_the_quota_or_without_show_quota(site, capsys, show_quota):  # noqa: F811
    """Room in the quota; a show_quota that fails (not judged by it); none at all (not ABCI): submitted."""
    if show_quota == "roomy":
        fake_show_quota(site, ABCI_GIB.replace("/groups/grpname", str(site)))
    elif show_quota == "failing":
        fake_show_quota(site, "show_quota: cannot read the quota\n", rc=1)
    assert submit("--data-dir", "data") == 0, capsys.readouterr().err
    assert (site / "submitted.log").read_text().split()[-1] == "job.sh"
