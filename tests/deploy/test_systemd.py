"""The systemd unit starts after a reboot: the ledger directory its sandbox names is made,
with the owner and mode the ledger demands, by tmpfiles.d before every start — and the unit,
the tmpfiles line and the sysusers line agree. Checked with systemd's own tools
(systemd-analyze verify, systemd-sysusers and systemd-tmpfiles on a scratch root) where this
machine has them, and by reading the files everywhere."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.runtime.segment import Access
from tests.deploy.conftest import DEPLOY, as_user, python_for

SYSTEMD = DEPLOY / "systemd"
UNIT = SYSTEMD / "kvpolicy.service"
TMPFILES = SYSTEMD / "tmpfiles.d" / "kvpolicy.conf"
SYSUSERS = SYSTEMD / "sysusers.d" / "kvpolicy.conf"


def unit_entries(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of a unit file, in order; keys may repeat, as systemd allows."""
    entries, section = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(key: str, section: str = "Service") -> list[str]:
    return [v for s, k, v in unit_entries(UNIT) if (s, k) == (section, key)]


def lines(path: Path) -> list[list[str]]:
    return [shlex.split(line) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def kvpolicy_run_options() -> dict[str, str]:
    (start,) = values("ExecStart")
    words = shlex.split(start)
    assert words[:2] == ["/opt/kvpolicy/bin/kvpolicy", "run"]
    return {words[i][2:]: words[i + 1] for i in range(3, len(words) - 1) if words[i].startswith("--")}


def test_the_directory_is_made_before_every_start_as_the_ledger_demands():
    options = kvpolicy_run_options()
    (line,) = lines(TMPFILES)
    kind, path, mode, user, group, age = line
    assert (kind, age) == ("d", "-")  # a directory, never cleaned: live engines' segments stay
    assert path == options["ledger-dir"]
    assert values("ReadWritePaths") == [path]
    assert int(mode, 8) == Access(group=0).dir_mode  # 2770, what the ledger makes with a group
    assert (user, group) == (values("User")[0], values("Group")[0]) and options["group"] == group
    # Before every start, as root: also after a reboot (/dev/shm is a tmpfs) or a deletion.
    assert f"+/usr/bin/systemd-tmpfiles --create {TMPFILES.name}" in values("ExecStartPre")
    assert not values("RuntimeDirectory")  # under /run, deleted at every stop: it would wipe live segments
    ((kind, name, *_),) = lines(SYSUSERS)
    assert (kind, name) == ("u", user)  # sysusers makes the user and its group of the same name


def test_the_unit_serves_metrics_for_a_scraper():
    host, port = kvpolicy_run_options()["metrics-address"].rsplit(":", 1)
    assert host == "0.0.0.0" and port == "9464"


def systemd_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed here (systemd's tools)")
    return found


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    analyze = systemd_tool("systemd-analyze")
    kvpolicy = Path(sys.executable).parent / "kvpolicy"
    unit = tmp_path / UNIT.name  # the same unit, with this environment's kvpolicy for /opt/kvpolicy's
    unit.write_text(UNIT.read_text().replace("/opt/kvpolicy/bin/kvpolicy", str(kvpolicy)))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-sysusers and systemd-tmpfiles --root need root")
def test_sysusers_and_tmpfiles_make_a_directory_the_ledger_accepts(node):
    sysusers, tmpfiles = systemd_tool("systemd-sysusers"), systemd_tool("systemd-tmpfiles")
    root = node / "root"
    for folder, source in (("etc/sysusers.d", SYSUSERS), ("etc/tmpfiles.d", TMPFILES)):
        (root / folder).mkdir(parents=True)
        shutil.copy(source, root / folder / source.name)
    (root / "dev" / "shm").mkdir(parents=True)
    subprocess.run([sysusers, f"--root={root}", SYSUSERS.name], check=True, capture_output=True, timeout=60)
    subprocess.run([tmpfiles, f"--root={root}", "--create", TMPFILES.name], check=True, capture_output=True, timeout=60)
    users = {f[0]: f for f in (line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines())}
    groups = {f[0]: f for f in (line.split(":") for line in (root / "etc" / "group").read_text().splitlines())}
    uid, gid = int(users["kvpolicy"][2]), int(groups["kvpolicy"][2])
    ledger = root / kvpolicy_run_options()["ledger-dir"].lstrip("/")
    st = ledger.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, Access(group=gid).dir_mode)
    # The ledger's own check accepts it as the unit's user with the unit's --group, and refuses it
    # to another user who does not share the ledger through the group.
    check = ("import sys; from pathlib import Path; from kvpolicy.runtime.segment import Access, check_directory; "
             "check_directory(Path(sys.argv[1]), Access(group=int(sys.argv[2]) if sys.argv[2] else None))")
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
    python = python_for(as_user(uid, gid), env, node)
    if python is None:
        pytest.skip(f"no Python here that uid {uid} may run with this checkout's kvpolicy")
    for user, group, ok in ((uid, str(gid), True), (uid + 1, "", False)):
        done = subprocess.run([python, "-c", check, str(ledger), group], cwd=node, env=env,
                              capture_output=True, text=True, timeout=60, **as_user(user, user))
        assert (done.returncode == 0) == ok, done.stderr
    assert "is owned by uid" in done.stderr


def test_systemctl_reload_sends_the_signal_that_rereads_the_policy():
    """`systemctl reload kvpolicy` sends SIGHUP, which `kvpolicy run` handles as "read the policy now"
    (tests/controller/test_run_policy_path.py checks a real controller lives on and re-reads)."""
    (reload,) = values("ExecReload")
    assert shlex.split(reload) == ["/bin/kill", "-HUP", "$MAINPID"]
