"""The locks of `annotated.files` on a system without fcntl, as on Windows. Each script runs in a
fresh process where `import fcntl` fails and `os.O_NOFOLLOW` is missing, and where `msvcrt`, the
Windows module the locks then use, is played by the C library's `flock` (called through ctypes,
not through fcntl): like Windows' lock it belongs to the open file, works on a file opened for
reading only, and ends with the process. Everything else, the files, the processes and the
locks' contention, is real. The stand-in comes after torch is imported: the standard library
takes a module named msvcrt for a sign of Windows (subprocess does)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the stand-in is the C library's flock")

NO_FCNTL = """
import errno, os, sys, types
from pathlib import Path
sys.modules["fcntl"] = None  # `import fcntl` fails, as on Windows
del os.O_NOFOLLOW  # and opening a file cannot refuse a link
import annotated.errors  # torch, and subprocess, before a stand-in msvcrt says "Windows" to them
"""

MSVCRT = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
msvcrt = types.ModuleType("msvcrt")
msvcrt.LK_UNLCK, msvcrt.LK_LOCK, msvcrt.LK_NBLCK, msvcrt.LK_RLCK, msvcrt.LK_NBRLCK = range(5)
LOCK_EX, LOCK_NB, LOCK_UN = 2, 4, 8  # flock's operations
FLOCK = [LOCK_UN, LOCK_EX, LOCK_EX | LOCK_NB, LOCK_EX, LOCK_EX | LOCK_NB]  # by msvcrt's mode
msvcrt.locked_at = []

def locking(fd, mode, nbytes):  # msvcrt.locking: `nbytes` bytes from the file's position
    msvcrt.locked_at.append(os.lseek(fd, 0, os.SEEK_CUR))
    if libc.flock(fd, FLOCK[mode]) != 0:
        e = ctypes.get_errno()
        if e != errno.EWOULDBLOCK:
            raise OSError(e, os.strerror(e))
        raise PermissionError(errno.EACCES, "Permission denied")  # what msvcrt raises

msvcrt.locking = locking
sys.modules["msvcrt"] = msvcrt
"""

IMPORT = """
import annotated.files as files
from annotated.errors import TrainingError
from annotated.files import hold_lock, lock_holder, lock_out_dir
"""

WINDOWS_LIKE = NO_FCNTL + MSVCRT + IMPORT + "assert files._msvcrt is msvcrt\n"


def start(script: str, *args) -> subprocess.Popen:
    """A Python process running `script` with `args` as sys.argv[1:], its stdin and stdout
    piped."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def run(script: str, *args) -> list[str]:
    """The lines that `script` prints, run to the end; it must succeed."""
    r = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def test_without_fcntl_the_trainer_s_lock_refuses_a_second_and_names_its_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = start(
        WINDOWS_LIKE + "held = lock_out_dir(Path(sys.argv[1]))\n"
        "print(*msvcrt.locked_at, flush=True)  # where the lock was taken\n"
        "sys.stdin.read()  # held until the test closes stdin\n",
        run_dir,
    )
    try:
        locked_at = [int(n) for n in holder.stdout.readline().split()]
        text = (run_dir / "trainer.lock").read_text()
        assert text == f"pid {holder.pid}"
        # one byte is locked, past the text: Windows would keep a locked byte from other readers
        assert len(locked_at) == 1 and locked_at[0] > len(text)
        second = WINDOWS_LIKE + (
            "try:\n"
            "    lock_out_dir(Path(sys.argv[1]))\n"
            "    print('taken')\n"
            "except TrainingError as e:\n"
            "    print(e)\n"
            "print(lock_holder(Path(sys.argv[1])))\n"
        )
        refused, seen = run(second, run_dir)
        assert f"{run_dir} is in use by another trainer (pid {holder.pid})" in refused
        assert seen == f"pid {holder.pid}"
        assert (run_dir / "trainer.lock").read_text() == text  # the refused one changed nothing
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    after = WINDOWS_LIKE + (
        "print(lock_holder(Path(sys.argv[1])))\n"
        "lock_out_dir(Path(sys.argv[1])).close()\n"
        "print('taken')\n"
    )
    # the pid left in the file names no trainer: the holder has ended, and so has its lock
    assert run(after, run_dir) == ["None", "taken"]


def test_without_fcntl_a_planted_link_is_refused(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("someone else's file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trainer.lock").symlink_to(precious)
    (run_dir / "prepare.lock").symlink_to(precious)
    script = WINDOWS_LIKE + (
        "out = Path(sys.argv[1])\n"
        "def prepare():\n"
        "    with hold_lock(out / 'prepare.lock'):\n"
        "        pass\n"
        "for take in (lambda: lock_out_dir(out), prepare):\n"
        "    try:\n"
        "        take()\n"
        "        print('taken')\n"
        "    except TrainingError as e:\n"
        "        print(e)\n"
        "print(lock_holder(out))\n"
    )
    trainer, preparer, seen = run(script, run_dir)
    assert trainer.startswith(f"{run_dir / 'trainer.lock'} is a symbolic link (to {precious})")
    assert preparer.startswith(f"{run_dir / 'prepare.lock'} is a symbolic link (to {precious})")
    assert seen == "None"  # a link is no trainer's lock
    assert precious.read_text() == "someone else's file"


def test_without_fcntl_hold_lock_waits_for_the_holder(tmp_path):
    path = tmp_path / "prepare.lock"
    holder = start(
        WINDOWS_LIKE + "with hold_lock(Path(sys.argv[1])):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.read()\n",
        path,
    )
    waiter = None
    try:
        assert holder.stdout.readline() == "held\n"
        waiter = start(
            WINDOWS_LIKE + "print('asking', flush=True)\n"
            "with hold_lock(Path(sys.argv[1])):\n"
            "    print('entered', flush=True)\n",
            path,
        )
        assert waiter.stdout.readline() == "asking\n"
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=1.5)  # still waiting while the holder holds it
        holder.stdin.close()
        assert waiter.communicate(timeout=60)[0] == "entered\n"
    finally:
        for p in (holder, waiter):
            if p and p.poll() is None:
                p.kill()
                p.wait()


def test_without_any_file_lock_the_trainer_is_told_why(tmp_path):
    script = (
        NO_FCNTL
        + 'sys.modules["msvcrt"] = None\n'
        + IMPORT
        + (
            "try:\n"
            "    lock_out_dir(Path(sys.argv[1]))\n"
            "    print('taken')\n"
            "except TrainingError as e:\n"
            "    print(e)\n"
        )
    )
    assert run(script, tmp_path / "run")[0].startswith("this Python has no file locks")
