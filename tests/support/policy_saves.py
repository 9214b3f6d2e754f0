"""A policy's directory, saved to in each of the ways editors, operators and Kubernetes do.

Every method leaves ``root/policy.kvp`` holding the given bytes (or, for the breaking
kinds, missing, unreadable or a directory). Methods that need a plain file first put
the current content back as one, by rename, which a watcher reads as no change.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import time
from pathlib import Path


def sha(data: bytes) -> str:
    """The content hash the watcher reports for a policy of these bytes (``LoadedPolicy.sha256``)."""
    return hashlib.sha256(data).hexdigest()


class Directory:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "policy.kvp"
        self.elsewhere = root.parent / f"{root.name}-elsewhere"
        self.serial = 0

    # ---- plain files ----------------------------------------------------------------

    def in_place(self, data: bytes, rng: random.Random, on_intermediate=lambda prefix: None) -> float:
        """Truncate and rewrite the file, in two writes; returns how long the file held something
        other than ``data`` (``exposed``)."""
        self._plain_file()
        cut = rng.randrange(len(data) + 1)
        on_intermediate(data[:cut])  # a reader may see this half: it is content that was in the file
        return self._write_in_two(data, cut, pause=0.0)

    def slow_in_place(self, data: bytes, cut: int, pause: float) -> float:
        """An editor that saves in place, slowly: truncate, write part, pause, write the rest.

        Returns the seconds from the truncation to the close, an upper bound on how long any
        intermediate content (empty, ``data[:cut]``) was in the file. A watcher may take an
        intermediate for final only if it stayed unchanged for the quiet period, so a test may
        excuse a prefix going live only when this is at least that long: a machine stalled
        mid-save, the watcher's documented limit (kvpolicy/runtime/watch.py)."""
        self._plain_file()
        return self._write_in_two(data, cut, pause)

    def _write_in_two(self, data: bytes, cut: int, pause: float) -> float:
        start = time.monotonic()  # before the open: "wb" truncates
        with open(self.path, "r+b" if self.path.exists() else "wb") as f:
            f.truncate(0)
            f.write(data[:cut])
            f.flush()
            if pause:
                time.sleep(pause)
            f.write(data[cut:])
        return time.monotonic() - start

    def atomic_rename(self, data: bytes) -> None:
        self._clear_directory_in_place()
        tmp = self.root / f".policy.kvp.{self.serial}.tmp"
        self.serial += 1
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def editor_backup(self, data: bytes) -> None:
        """vim without backupcopy: move the file to ``policy.kvp~``, write a new one, drop the backup."""
        self._plain_file()
        backup = self.root / "policy.kvp~"
        if self.path.exists():
            os.replace(self.path, backup)
        self.path.write_bytes(data)
        backup.unlink(missing_ok=True)

    # ---- links -----------------------------------------------------------------------

    def configmap_swap(self, data: bytes) -> None:
        """What the kubelet does: a new timestamped dir, then rename ..data_tmp over ..data."""
        self.serial += 1
        version = self.root / f"..2026_11_29_{self.serial:06d}"
        version.mkdir()
        (version / "policy.kvp").write_bytes(data)
        tmp_link = self.root / "..data_tmp"
        os.symlink(version.name, tmp_link)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        os.replace(tmp_link, self.root / "..data")
        if not (self.path.is_symlink() and os.readlink(self.path) == "..data/policy.kvp"):
            self._clear_directory_in_place()
            link_tmp = self.root / ".policy-link.tmp"
            os.symlink("..data/policy.kvp", link_tmp)
            os.replace(link_tmp, self.path)
        if old is not None:
            for child in (self.root / old).iterdir():
                child.unlink()
            (self.root / old).rmdir()

    def symlink_elsewhere(self, data: bytes, rng: random.Random) -> None:
        """The policy is a symlink into another directory: edit its target there, or re-point it."""
        self.elsewhere.mkdir(exist_ok=True)
        if self._links_elsewhere() and rng.random() < 0.6:
            target = Path(os.readlink(self.path))
            with open(target, "wb") as f:  # an in-place save of the target
                f.write(data)
            return
        self.serial += 1
        target = self.elsewhere / f"policy-{self.serial}.kvp"
        target.write_bytes(data)
        self._clear_directory_in_place()
        link_tmp = self.root / ".policy-link.tmp"
        os.symlink(target, link_tmp)
        os.replace(link_tmp, self.path)

    # ---- breaking it -------------------------------------------------------------------

    def delete(self) -> None:
        self._clear_directory_in_place()
        self.path.unlink(missing_ok=True)

    def unreadable(self) -> str:
        """Make the policy unreadable; returns how. A symlink loop for root (who reads any
        mode), mode 000 otherwise."""
        if os.geteuid() == 0:
            self.delete()
            os.symlink("policy.kvp", self.path)  # ELOOP
            return "symlink loop"
        self._plain_file()
        self.path.chmod(0)
        return "mode 000"

    def directory_in_place(self) -> None:
        self.delete()
        self.path.mkdir()

    # ---- helpers -------------------------------------------------------------------------

    def is_plain(self) -> bool:
        """The policy is a regular file (not a link, a directory, or missing)."""
        return self.path.is_file() and not self.path.is_symlink()

    def _links_elsewhere(self) -> bool:
        return self.path.is_symlink() and Path(os.readlink(self.path)).parent == self.elsewhere

    def _clear_directory_in_place(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path)

    def _plain_file(self) -> None:
        """Make the policy a plain file with the content it has now (none if it has none)."""
        self._clear_directory_in_place()
        if self.path.is_symlink() or (self.path.exists() and not os.access(self.path, os.R_OK)):
            try:
                data = self.path.read_bytes()
            except OSError:
                data = None
            self.path.unlink()
            if data is not None:
                self.atomic_rename(data)
        elif self.path.exists() and self.path.stat().st_mode & 0o777 == 0:
            self.path.chmod(0o644)
