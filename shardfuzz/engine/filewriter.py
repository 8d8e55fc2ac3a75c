"""Writing failure files safely when other writers share the folder (two campaigns of the same
target, ``--jobs``, a CI matrix on one disk), and when the disk is full.

* Every write goes to a temporary file with a unique name (a random one, created exclusively),
  never ``{path}.tmp{pid}``.
* A final name is claimed by exclusive creation (``os.link`` of the complete temporary file: it
  fails when the name exists, and the file appears whole): the first writer of a key gets
  ``{stem}.json``, the next ``{stem}-2.json``, and so on.
* A file that exists is taken over (updated in place, as one campaign does while Hypothesis shrinks)
  only when its recorded writer (``"writer"``: ``HOST:BOOT:PID:RECORDER``, the host and its boot
  as hashes (:func:`host_id`, :func:`boot_id`), so a shared file names no machine) is a process of
  this host that is gone (or of an earlier boot of it), or another writer of this process whose
  record is about the same thing (``same``: the finding's signature; ``also``: of the same target
  and implementation). A file of a live writer is never replaced, and neither is another finding
  of this process: one pytest session's tests of one target each write through their own writer,
  and a serial session kept only the last test's finding where pytest-xdist kept them all. Before each update the
  writer compares the file's ``writer`` with its own, so a file taken over is left alone.
* A file taken over holds a finding that must not be lost: when the writer goes on to write
  something else (its shrink drifted to another signature), the file gets back the record it held,
  as it was, and the writer goes on under the key's next free name; should it come back to that
  finding, it takes that file over again (one file of a finding, never two).
* Each record is stamped with ``created`` (kept across updates), ``updated`` and ``updates``.
* A write that fails (a full disk) removes its partial temporary file and raises; the caller warns
  once, with the path and the size that did not fit.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import hashlib
import json
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from shardfuzz.errors import InvalidArgument

#: errors of ``os.link`` on file systems without hard links: claim with O_EXCL instead
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}


def default_dir() -> str:
    return os.environ.get("SHARDFUZZ_FAILURES_DIR") or os.path.join(".shardfuzz", "failures")


def check_failures_dir(path: str, what: str = "--failures-dir") -> str:
    """Create the failures directory if needed and make sure a file can be written there; an
    InvalidArgument naming ``what`` and the path otherwise. Returns the path."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"{what}={path!r}; must be a directory path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        why = "a file is in the way" if isinstance(e, FileExistsError) else e.strerror
        raise InvalidArgument(
            f"{what}={path!r}: cannot create the directory ({why}); give a writable directory"
        ) from None
    if not os.path.isdir(path):
        raise InvalidArgument(f"{what}={path!r} is not a directory; give a writable directory")
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".shardfuzz-write-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise InvalidArgument(
            f"{what}={path!r}: cannot write there ({e.strerror}); give a writable directory"
        ) from None
    return path


class FileWriter:
    """Writes JSON records to files of one directory, one claimed file per key."""

    def __init__(self, directory: str, same: str | None = None, also: tuple[str, ...] = ()) -> None:
        self.directory = directory
        #: the record field that says what a record is about: another writer of this process takes
        #: over only a file whose record has the same value there (None: never)
        self.same = same
        #: fields that must be equal too (None on both is equal): what the finding is of
        self.also = also
        self.host, self.boot, self.pid = host_id(), boot_id(), os.getpid()
        self.token = f"{self.host}:{self.boot}:{self.pid}:{uuid.uuid4().hex[:12]}"
        #: how earlier writers named this host in their files (its name): still this host
        self.named_host = socket.gethostname()
        self.owned: dict[tuple[str, str], str] = {}  # (stem, suffix) -> the path claimed for it
        #: path -> the record it held, of the files this writer took over: the file gets it back
        #: before this writer writes something else (:meth:`_update`)
        self.taken: dict[str, dict[str, Any]] = {}
        #: path -> (stem, suffix) of every file this writer claimed
        self.keys: dict[str, tuple[str, str]] = {}

    def path(self, stem: str, suffix: str) -> str:
        """The file claimed for the key, or the name it would try first."""
        return self.owned.get((stem, suffix)) or os.path.join(self.directory, stem + suffix)

    def write(self, stem: str, suffix: str, record: dict[str, Any]) -> str:
        """Write ``record`` under the key's file, stamped with ``created`` (kept from the file it
        updates), ``updated`` and ``updates``; returns its path. Raises OSError when it cannot be
        written (nothing partial is left behind)."""
        mine = self.owned.get((stem, suffix))
        if mine is not None:
            old = read_record(mine)
            if old is not None and old.get("writer") == self.token:  # compare before replacing
                return self._update(mine, record, old)
        same = self._same_elsewhere(stem, suffix, record, mine)
        if same is not None and self._claim(same, lambda old: _stamped(record, old), (stem, suffix)):
            self.owned[(stem, suffix)] = same  # an earlier writer's file of this very finding
            return same
        path = self._claim_free(stem, suffix, lambda old: _stamped(record, old))
        self.owned[(stem, suffix)] = path
        return path

    def _update(self, path: str, record: dict[str, Any], old: dict[str, Any]) -> str:
        """Write ``record`` over ``path``, a file this writer holds; returns where it went. Another
        file of the key that holds this very finding, and may be taken over (another writer's of
        this process, whose first, larger example had another signature; or one this writer gave
        back), is updated instead: one file of a finding, not two. A file this writer took over
        keeps the finding it held: ``record`` about something else goes to the next free name."""
        key = self.keys.get(path)
        if key is not None:
            same = self._same_elsewhere(*key, record, path)
            taken = self.taken.get(path)
            if same is not None and self._claim(same, lambda o: _stamped(record, o), key):
                self._leave(path, same)
                return same
            if taken is not None and not self._about_the_same(taken, record):
                fresh = self._claim_free(*key, lambda o: _stamped(record, o))
                self._leave(path, fresh)
                return fresh
        os.replace(self._temporary(path, _stamped(record, old)), path)
        return path

    def _leave(self, path: str, to: str) -> None:
        """This writer goes on at ``to``: ``path`` gets back the record it held when this writer
        took it over (as it was, its writer too), or is removed when it was this writer's own."""
        before = self.taken.pop(path, None)
        if before is not None:
            os.replace(self._temporary(path, dict(before), writer=before.get("writer")), path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        self.keys.pop(path, None)
        for key, owned in list(self.owned.items()):
            if owned == path:
                self.owned[key] = to

    def give_back(self, path: str) -> None:
        """This writer is done with ``path`` (its finding is another one's): the file gets back the
        record it held when this writer took it over, or is removed when it was this writer's own."""
        self._leave(path, path)
        for key, owned in list(self.owned.items()):
            if owned == path:
                del self.owned[key]

    def _same_elsewhere(self, stem: str, suffix: str, record: dict[str, Any], mine: str | None) -> str | None:
        """A file of the key, other than ``mine``, that another writer of this process wrote about
        the same thing (:attr:`same`): the one to update instead. Every file of the key is looked
        at: a gap in the names (a file removed) ended the search, and a new user's second campaign
        wrote a second file of a finding whose first one came after the gap."""
        if self.same is None or record.get(self.same) is None:
            return None
        held = set(self.owned.values())
        for path in self._existing(stem, suffix):
            if path == mine or path in held:
                continue
            old = read_record(path)
            # takeable, and about the same: another writer's of this process, or an earlier run's
            if old is not None and self._may_take_over(old, record) and self._about_the_same(old, record):
                return path
        return None

    def rewrite(self, path: str, record: dict[str, Any]) -> str:
        """Write ``record`` over ``path``, a file this writer wrote (under any key, or moved: a
        finding shrunk further after its run); stamped as :meth:`write` does. Returns where it
        went (another file of the key, see :meth:`_update`). Raises OSError when the file is not
        this writer's any more (another writer took it over)."""
        old = read_record(path)
        if old is None or old.get("writer") != self.token:
            raise OSError(errno.EPERM, f"{path} is not a file this writer holds")
        return self._update(path, record, old)

    def move(self, src: str, stem: str, suffix: str) -> str:
        """Give the file ``src`` of this writer the key's first free name (never one this writer
        holds); returns it."""
        record = read_record(src)
        if record is None:
            raise OSError(errno.ENOENT, f"cannot read {src}")

        def keep_created(old: dict[str, Any] | None) -> dict[str, Any]:
            # an earlier run's file of the same finding, taken over: it was first written then
            return record if old is None or "created" not in old else {**record, "created": old["created"]}

        path = self._claim_free(stem, suffix, keep_created)
        os.remove(src)
        return path

    def claim_new(self, stem: str, suffix: str, record: dict[str, Any]) -> str:
        """Write ``record`` to the key's first free name (never one this writer holds), a file of
        no key: a second finding of a key's run. Returns its path."""
        return self._claim_free(stem, suffix, lambda old: _stamped(record, old))

    def forget(self, stem: str, suffix: str) -> None:
        self.owned.pop((stem, suffix), None)

    # -- claiming -------------------------------------------------------------------------
    def _names(self, stem: str, suffix: str) -> Iterator[str]:
        """The key's file names in the order they are claimed: ``{stem}.json``, ``{stem}-2.json``..."""
        for n in range(1, 10_000):
            yield os.path.join(self.directory, f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")

    def _existing(self, stem: str, suffix: str) -> list[str]:
        """The key's files that exist, in the order their names are claimed."""
        plain, numbered = f"{stem}{suffix}", re.compile(re.escape(stem) + r"-(\d+)" + re.escape(suffix))
        try:
            names = os.listdir(self.directory)
        except OSError:  # a folder gone or unreadable: no file of the key to update
            return []
        found = sorted(int(m.group(1)) for n in names if (m := numbered.fullmatch(n)))
        paths = [os.path.join(self.directory, f"{stem}-{k}{suffix}") for k in found if k >= 2]
        return ([os.path.join(self.directory, plain)] if plain in names else []) + paths

    def _claim_free(self, stem: str, suffix: str, make: Callable[[dict | None], dict]) -> str:
        held = set(self.owned.values())
        for path in self._names(stem, suffix):
            if path not in held and self._claim(path, make, (stem, suffix)):
                return path
        raise OSError(errno.EEXIST, f"no free file name for {stem}{suffix} in {self.directory}")

    def _claim(self, path: str, make: Callable[[dict | None], dict], key: tuple[str, str]) -> bool:
        old = read_record(path) if os.path.lexists(path) else None
        record = make(old)
        if os.path.lexists(path) and (old is None or not self._may_take_over(old, record)):
            return False  # another live writer's file, or not a record of ours: never replaced
        tmp = self._temporary(path, record)
        stale = None
        try:
            if old is not None:  # move the stale file out of the way: one taker only
                stale = tmp + ".old"
                try:
                    os.rename(path, stale)
                except FileNotFoundError:
                    stale = None
            claimed = _create_exclusive(tmp, path)
            if claimed:
                self.keys[path] = key
                if old is not None and self.same is not None:  # taken over: keep what it held
                    self.taken.setdefault(path, old)
            return claimed
        finally:
            for leftover in (tmp, stale):
                if leftover is not None and os.path.lexists(leftover):
                    os.remove(leftover)

    def _of_this_process(self, record: dict[str, Any]) -> bool:
        writer = record.get("writer")
        return isinstance(writer, str) and writer.rsplit(":", 1)[0] == f"{self.host}:{self.boot}:{self.pid}"

    def _may_take_over(self, record: dict[str, Any], new: dict[str, Any]) -> bool:
        writer = record.get("writer")
        if writer == self.token:
            return False  # this writer's own file of another key
        if writer is None:
            return True  # written before writers were recorded: an earlier run's file
        if not isinstance(writer, str) or writer.count(":") < 2:
            return False
        head, pid, _ = writer.rsplit(":", 2)
        # HOST:BOOT, or an earlier version's host name alone (its boot unknown: read as this one)
        host, _, boot = head.partition(":") if head.count(":") == 1 else (head, "", "")
        if host not in (self.host, self.named_host) or not pid.isdigit():
            return False  # another machine's writer may be alive: leave its file
        this_boot = boot in ("", self.boot)
        if this_boot and int(pid) == self.pid:  # another writer of this process: only if about the same
            return self.same is not None and self._about_the_same(record, new)
        # an earlier run's (its writer is gone: of an earlier boot, or no longer alive): only if
        # about the same, where records say what they are about (a later run wrote its other
        # finding over it, silently: one was lost)
        gone = not this_boot or not _alive(int(pid))
        return gone and (self.same is None or self._about_the_same(record, new))

    def _about_the_same(self, record: dict[str, Any], new: dict[str, Any]) -> bool:
        return (
            self.same is not None
            and record.get(self.same) == new.get(self.same) is not None
            and all(record.get(f) == new.get(f) for f in self.also)
        )

    def _temporary(self, path: str, record: dict[str, Any], writer: Any = "") -> str:
        """A complete temporary file next to ``path`` (removed again when the write fails), stamped
        with this writer's token (or ``writer``: a record put back as it was; None: none)."""
        if writer == "":
            record["writer"] = self.token
        elif writer is None:
            record.pop("writer", None)
        else:
            record["writer"] = writer
        data = (json.dumps(record, indent=2) + "\n").encode()
        tmp = os.path.join(self.directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:16]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies (mkstemp: 0600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            os.close(fd)
            os.remove(tmp)
            raise WriteFailed(path, len(data), e) from e
        os.close(fd)
        return tmp


def _stamped(record: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    created, updates = now, 0
    if old is not None:  # an update: of this run's file, or of an earlier run's
        created = old.get("created", now)
        with contextlib.suppress(TypeError, ValueError):
            updates = int(old.get("updates", 0)) + 1
    return {**record, "created": created, "updated": now, "updates": updates}


class WriteFailed(OSError):
    """A failure file that could not be written: its path and how many bytes did not fit."""

    def __init__(self, path: str, size: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.path, self.size = path, size


def _create_exclusive(tmp: str, path: str) -> bool:
    """Give the complete file ``tmp`` the name ``path`` unless it exists (True: it was free)."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
    # no hard links here (some network and FUSE file systems): exclusive creation, then the bytes
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as out, open(tmp, "rb") as src:
            out.write(src.read())
    except OSError:
        os.remove(path)  # never a truncated record under the final name
        raise
    return True


def read_record(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it cannot be read or is no object."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@functools.cache  # the same for the life of the process: read once, not by every writer
def host_id() -> str:
    """This machine, as a failure file's ``writer`` names it: a hash of its machine id (where the
    system has one: a random id, so the hash cannot be matched against guessed host names) and
    host name, so a file shared with others names no machine."""
    machine = ""
    with contextlib.suppress(OSError), open("/etc/machine-id") as f:  # systemd's; Linux only
        machine = f.read().strip()
    return hashlib.sha256(f"{machine}\0{socket.gethostname()}".encode()).hexdigest()[:12]


@functools.cache
def boot_id() -> str:
    """This boot of the machine, as a hash ("" where the system does not say): a pid means something
    only within one boot, and a file an earlier boot wrote has a writer that is gone."""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:  # Linux only
        return hashlib.sha256(f.read().strip().encode()).hexdigest()[:8]
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
