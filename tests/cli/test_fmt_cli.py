"""``kvpolicy fmt`` as a command: files it may not write, ``--diff`` with JSON, standard input.

A file fmt cannot write is a usage error (exit 2) reported in one line, left byte for byte
as it was, while the other files are still formatted. Tests run as root here, which no file
mode stops: the decision is checked with an ``access`` that honours modes, and the real
refusal by running the command as uid 65534 where that is possible.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.commands.fmt import why_not_writable
from tests.deploy.conftest import as_user, python_for

UGLY = 'version 1\nmodel "a" {reserve 20GiB}\n'
PRETTY = 'version 1\n\nmodel "a" {\n  reserve 20 GiB\n}\n'
BROKEN = 'version 1\nmodel "a" {\n  reserve\n}\n'
NOBODY = 65534


def run_fmt(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["fmt", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def by_mode(path: Path | str, mode: int) -> bool:
    """``os.access`` as a user other than root sees it, for files that user owns: the owner's bits."""
    bits = os.stat(path).st_mode
    wanted = [(os.R_OK, 0o400), (os.W_OK, 0o200), (os.X_OK, 0o100)]
    return all(bits & bit for flag, bit in wanted if mode & flag)


# ---- files fmt may not write ---------------------------------------------------------


def test_the_decision_refuses_a_read_only_file_and_a_read_only_directory(tmp_path: Path) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    assert why_not_writable(path, by_mode) is None
    path.chmod(0o444)
    assert why_not_writable(path, by_mode) == "cannot write it: the file is not writable (its permissions, or a read-only file system)"
    path.chmod(0o644)
    tmp_path.chmod(0o555)
    try:
        assert why_not_writable(path, by_mode) == (
            f"cannot write it: its directory {tmp_path.resolve()} is not writable (its permissions, or a read-only file system)")
    finally:
        tmp_path.chmod(0o755)


def test_a_file_removed_since_it_was_read_is_not_recreated(tmp_path: Path) -> None:
    gone = tmp_path / "p.kvp"
    assert why_not_writable(gone, by_mode) == "cannot write it: it is no longer there"
    assert why_not_writable(tmp_path / "p.kvp" / "x", by_mode) == "cannot write it: it is no longer there"
    assert not gone.exists()


def test_the_decision_looks_at_the_file_a_link_points_to(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "p.kvp").write_text(UGLY)
    link = tmp_path / "p.kvp"
    link.symlink_to(real / "p.kvp")
    real.chmod(0o555)
    try:
        refusal = why_not_writable(link, by_mode)
        assert refusal is not None and str(real.resolve()) in refusal
    finally:
        real.chmod(0o755)


def test_a_pipe_is_read_but_not_written(capsys) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, UGLY.encode())
    os.close(write_end)
    try:
        name = f"/dev/fd/{read_end}"
        assert why_not_writable(Path(name)) == (
            "cannot write it: not a regular file (--check and --diff write nothing; - formats standard input)")
        code, _, err = run_fmt(capsys, name)
        assert code == 2 and err == f"kvpolicy fmt: {name}: {why_not_writable(Path(name))}; not formatted\n"
    finally:
        os.close(read_end)


def locked_and_other(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """Two unformatted files, the first read-only (by its mode: ``os.access`` as for a user, not root)."""
    monkeypatch.setattr(os, "access", by_mode)
    locked, other = tmp_path / "locked.kvp", tmp_path / "other.kvp"
    locked.write_text(UGLY)
    other.write_text(UGLY)
    locked.chmod(0o444)
    return locked, other


def test_a_read_only_file_is_refused_and_the_others_formatted(tmp_path: Path, capsys, monkeypatch) -> None:
    locked, other = locked_and_other(tmp_path, monkeypatch)
    code, out, err = run_fmt(capsys, str(locked), str(other))
    assert code == 2
    assert err == f"kvpolicy fmt: {locked}: cannot write it: the file is not writable (its permissions, or a read-only file system); not formatted\n"
    assert locked.read_text() == UGLY and os.stat(locked).st_mode & 0o777 == 0o444
    assert other.read_text() == PRETTY
    assert out == f"reformatted {other}\n1 file(s) reformatted, 0 unchanged, 1 not formatted (errors above)\n"


def test_a_read_only_file_that_is_already_formatted_is_fine(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(os, "access", by_mode)
    path = tmp_path / "p.kvp"
    path.write_text(PRETTY)
    path.chmod(0o444)
    assert run_fmt(capsys, str(path))[0] == 0


def test_a_file_that_cannot_be_written_has_an_error_entry_in_json(tmp_path: Path, capsys, monkeypatch) -> None:
    locked, other = locked_and_other(tmp_path, monkeypatch)
    code, out, _ = run_fmt(capsys, "--format", "json", str(locked), str(other))
    assert code == 2
    doc = json.loads(out)
    by_file = {f["file"]: f for f in doc["files"]}
    assert by_file[str(locked)] == {"file": str(locked), "changed": False,
                                    "error": "cannot write it: the file is not writable (its permissions, or a read-only file system)"}
    assert by_file[str(other)] == {"file": str(other), "changed": True}


def test_a_write_that_fails_leaves_the_file_and_no_temporary_file(tmp_path: Path, capsys, monkeypatch) -> None:
    """What os.access cannot foresee (a full disk, a race): the same one line, nothing left behind."""

    def no_space(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", no_space)
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    code, _, err = run_fmt(capsys, str(path))
    assert code == 2
    assert err == f"kvpolicy fmt: {path}: cannot write it: No space left on device; not formatted\n"
    assert path.read_text() == UGLY
    assert [p.name for p in tmp_path.iterdir()] == ["p.kvp"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user may enter (pytest's own are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kvpolicy-fmt-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path)


def test_as_another_user_a_directory_or_file_it_may_not_write_is_refused(shared_dir: Path) -> None:
    """The real refusal, no stand-in: the PermissionError of the temporary file ended in a traceback,
    and a read-only file in a writable directory was replaced."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the command as another user")
    run_as = as_user(NOBODY, NOBODY)
    env = {**os.environ, "NO_COLOR": "1", "HOME": str(shared_dir)}
    python = python_for(run_as, env, shared_dir)
    if python is None:
        pytest.skip(f"no Python here that uid {NOBODY} may run with this checkout's kvpolicy")
    locked, open_ = shared_dir / "locked", shared_dir / "open"
    locked.mkdir(mode=0o755)
    open_.mkdir()
    open_.chmod(0o777)
    for path in (locked / "p.kvp", open_ / "ro.kvp", open_ / "ok.kvp"):
        path.write_text(UGLY)
        path.chmod(0o666)
    (open_ / "ro.kvp").chmod(0o444)
    names = ["locked/p.kvp", "open/ro.kvp", "open/ok.kvp"]
    for output in ("text", "json"):
        (open_ / "ok.kvp").write_text(UGLY)
        done = subprocess.run([python, "-m", "kvpolicy.cli", "fmt", "--format", output, *names], cwd=shared_dir,
                              env=env, capture_output=True, text=True, timeout=120, **run_as)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.splitlines() == [
            f"kvpolicy fmt: locked/p.kvp: cannot write it: its directory {locked} is not writable (its permissions, or a read-only file system);"
            " not formatted",
            "kvpolicy fmt: open/ro.kvp: cannot write it: the file is not writable (its permissions, or a read-only file system); not formatted",
        ]
        assert (locked / "p.kvp").read_text() == UGLY and (open_ / "ro.kvp").read_text() == UGLY
        assert (open_ / "ok.kvp").read_text() == PRETTY, "the other file is still formatted"
        assert sorted(p.name for p in open_.iterdir()) == ["ok.kvp", "ro.kvp"]
        if output == "json":
            errors = {f["file"]: "error" in f for f in json.loads(done.stdout)["files"]}
            assert errors == {"locked/p.kvp": True, "open/ro.kvp": True, "open/ok.kvp": False}


def test_root_formatting_a_user_s_file_keeps_its_owner(tmp_path: Path, capsys) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root may give a file to another user")
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    os.chown(path, NOBODY, NOBODY)
    assert run_fmt(capsys, str(path))[0] == 0
    assert path.read_text() == PRETTY
    assert (os.stat(path).st_uid, os.stat(path).st_gid) == (NOBODY, NOBODY)


# ---- --diff with --format json ---------------------------------------------------------


def test_diff_with_json_is_one_json_document_with_the_diff_in_it(tmp_path: Path, capsys) -> None:
    ugly, pretty = tmp_path / "ugly.kvp", tmp_path / "pretty.kvp"
    ugly.write_text(UGLY)
    pretty.write_text(PRETTY)
    code, out, _ = run_fmt(capsys, "--diff", "--format", "json", str(ugly), str(pretty))
    assert code == 1
    doc = json.loads(out)  # the whole of stdout
    by_file = {f["file"]: f for f in doc["files"]}
    assert by_file[str(ugly)]["changed"] is True
    assert by_file[str(ugly)]["diff"].startswith(f"--- {ugly}\n+++ {ugly} (formatted)\n")
    assert "+  reserve 20 GiB\n" in by_file[str(ugly)]["diff"]
    assert by_file[str(pretty)] == {"file": str(pretty), "changed": False, "diff": ""}
    assert ugly.read_text() == UGLY


def test_diff_in_text_is_the_diff_alone(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    code, out, _ = run_fmt(capsys, "--diff", str(path))
    assert code == 1 and out.startswith(f"--- {path}\n") and "schema" not in out and "reformatted" not in out


# ---- standard input ------------------------------------------------------------------------


@pytest.fixture
def stdin(monkeypatch):
    def feed(text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))

    return feed


def test_stdin_check_says_so_as_for_a_file_and_exits_1_when_it_would_change(capsys, stdin) -> None:
    stdin(UGLY)
    assert run_fmt(capsys, "--check", "-") == (1, "would reformat <stdin>\n1 file(s) would be reformatted, 0 unchanged\n", "")
    stdin(PRETTY)
    assert run_fmt(capsys, "--check", "-") == (0, "0 file(s) would be reformatted, 1 unchanged\n", "")


def test_stdin_diff_is_a_diff(capsys, stdin) -> None:
    stdin(UGLY)
    code, out, _ = run_fmt(capsys, "--diff", "-")
    assert code == 1
    assert out.startswith("--- <stdin>\n+++ <stdin> (formatted)\n@@")
    assert '-model "a" {reserve 20GiB}\n' in out and "+  reserve 20 GiB\n" in out
    stdin(PRETTY)
    assert run_fmt(capsys, "--diff", "-") == (0, "", "")


def test_stdin_json_is_a_json_document(capsys, stdin) -> None:
    stdin(UGLY)
    code, out, _ = run_fmt(capsys, "--format", "json", "-")
    assert code == 0
    assert json.loads(out) == {"schema": 1, "files": [{"file": "<stdin>", "changed": True, "formatted": PRETTY}]}
    stdin(UGLY)
    code, out, _ = run_fmt(capsys, "--check", "--format", "json", "-")
    assert code == 1 and json.loads(out) == {"schema": 1, "files": [{"file": "<stdin>", "changed": True}]}
    stdin(UGLY)
    code, out, _ = run_fmt(capsys, "--diff", "--format", "json", "-")
    assert code == 1 and json.loads(out)["files"][0]["diff"].startswith("--- <stdin>\n")


def test_stdin_with_a_syntax_error_in_json(capsys, stdin) -> None:
    stdin(BROKEN)
    code, out, err = run_fmt(capsys, "--format", "json", "-")
    assert code == 1 and "<stdin>:3:10: KV002" in err
    (entry,) = json.loads(out)["files"]
    assert entry["file"] == "<stdin>" and entry["changed"] is False and "KV002" in entry["error"]


def test_stdin_filename_names_standard_input(capsys, stdin) -> None:
    stdin(UGLY)
    code, out, _ = run_fmt(capsys, "--diff", "--stdin-filename", "policies/p.kvp", "-")
    assert code == 1 and out.startswith("--- policies/p.kvp\n+++ policies/p.kvp (formatted)\n")
    stdin(BROKEN)
    _, _, err = run_fmt(capsys, "--stdin-filename", "policies/p.kvp", "-")
    assert "policies/p.kvp:3:10: KV002" in err


def test_stdin_filename_without_standard_input_is_a_usage_error(capsys, tmp_path) -> None:
    policy = tmp_path / "p.kvp"
    policy.write_text(UGLY)
    code, out, err = run_fmt(capsys, "--stdin-filename", "policies/p.kvp", str(policy))
    assert (code, out) == (2, "") and "--stdin-filename names standard input" in err
    assert policy.read_text() == UGLY, "nothing formatted"


def test_stdin_is_read_to_the_size_limit(capsys, stdin, monkeypatch) -> None:
    monkeypatch.setenv("KVPOLICY_MAX_POLICY_SIZE", "64")
    stdin(UGLY + "# " + "x" * 1000 + "\n")
    code, out, err = run_fmt(capsys, "-")
    assert code == 1 and out == ""
    assert "<stdin>:3:29: KV026 error: the policy is over the size limit of 64 B" in err
    assert sys.stdin.buffer.tell() == 65, "read no further than a file is"


def test_stdin_cannot_be_combined_with_files(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    code, out, err = run_fmt(capsys, "-", str(path))
    assert (code, out) == (2, "")
    assert err == "kvpolicy fmt: - (standard input) cannot be combined with other files\n"
    assert path.read_text() == UGLY
