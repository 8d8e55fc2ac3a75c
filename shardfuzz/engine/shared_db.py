"""Where examples are kept: a local directory, or one Redis shared by a fleet of workers.

``--database`` / ``RunConfig(database=...)`` / ``$SHARDFUZZ_DATABASE`` take a directory path or a
``redis://[:PASSWORD@]HOST:PORT/N`` URL (``rediss://`` for TLS, ``unix:///path/redis.sock?db=N``).
A Redis URL gives Hypothesis' own :class:`~hypothesis.extra.redis.RedisExampleDatabase`, always
multiplexed (:class:`~hypothesis.database.MultiplexedDatabase`) with the local directory
database, so a worker that loses Redis goes on with its local copy; the loss is said once.

Fleets: ``--fleet NAME`` (``$SHARDFUZZ_FLEET``, default ``default``) picks the key prefix and
the listener channel, so two fleets on one Redis never mix.

Expiry: Hypothesis gives each Redis key a time to live that every fetch or save of that key
resets (``expire_after``, 8 days by default); a key that no worker touched for that long is
dropped. For a fleet that means the corpus of a target nobody fuzzed for that long is lost (its
findings are not: :mod:`shardfuzz.engine.fleet` stores those without expiry). We set 30 days, so a
target paused for a few weeks keeps its corpus.
"""

from __future__ import annotations

import datetime
import functools
import os
import re
import sys
import threading
import urllib.parse
from collections.abc import Iterable
from typing import Any

from shardfuzz.errors import InvalidArgument

# Hypothesis is imported inside the functions that use it: the CLI's parser or the pytest
# plugin loads this module at start (START_UP in tests/test_structure.py). redis
# is an optional extra ([redis]), imported only for a redis:// database

REDIS_SCHEMES = ("redis", "rediss", "unix")
#: the time to live of a corpus key in Redis (see the module docstring)
EXPIRE_AFTER = datetime.timedelta(days=30)
#: the client version ``hypothesis.extra.redis`` needs (its ``redis`` extra)
REDIS_REQUIREMENT = "redis>=3.0.0"
DEFAULT_FLEET = "default"
_FLEET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: how long a Redis command may take before a worker treats Redis as gone
SOCKET_TIMEOUT = 5.0


def is_redis_url(text: str | None) -> bool:
    return isinstance(text, str) and text.split(":", 1)[0].lower() in REDIS_SCHEMES and "://" in text


def redact(url: str) -> str:
    """The URL (or any text holding one: ``--database=redis://...``) with any password replaced by
    ``***`` (messages and shared reports never show a password): in the user part, up to the
    last ``@`` (a password may hold ``/``, which ends a URL's host part for a URL parser), and a
    ``password=`` query parameter (``unix:///PATH?db=0&password=...``)."""
    return _USERINFO_PASSWORD.sub(r"\1***@", _PASSWORD_PARAM.sub(r"\1***", url))


_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#\s]*", re.IGNORECASE)
#: ``scheme://user:password@``: the user part, a colon, and everything up to the last @ of the word
_USERINFO_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)\S*@")
#: the query parameters of a Redis URL that redis-py's ``from_url`` takes (any other is a TypeError
#: from deep inside the client, or a ValueError for a bad value: a traceback)
URL_PARAMS = frozenset(
    """db password username socket_timeout socket_connect_timeout socket_keepalive retry_on_timeout
    health_check_interval max_connections client_name ssl_cert_reqs ssl_ca_certs ssl_certfile
    ssl_keyfile ssl_check_hostname""".split()
)


def check_database(value: Any, what: str = "database") -> str | None:
    """``value`` if it is None, a directory path or a well-formed Redis URL; else InvalidArgument
    naming ``what`` and the URL (without its password)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what}={value!r}; must be a directory path or a redis://HOST:PORT/N URL")
    if "://" not in value:
        return _directory(value, what)
    scheme = value.split(":", 1)[0].lower()
    shown = redact(value)
    if scheme not in REDIS_SCHEMES:
        raise InvalidArgument(
            f"{what}={shown!r}: unknown scheme {scheme!r}; allowed: a directory path, redis://HOST:PORT/N, "
            "rediss://HOST:PORT/N or unix:///PATH?db=N"
        )
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # ValueError for a port that is not a number in range
    except ValueError as e:
        raise InvalidArgument(f"{what}={shown!r} is not a valid Redis URL ({e})") from None
    if scheme == "unix":
        if not parts.path:
            raise InvalidArgument(f"{what}={shown!r}: no socket path; expected unix:///PATH?db=N")
    elif not parts.hostname:
        raise InvalidArgument(f"{what}={shown!r}: no host; expected {scheme}://HOST:PORT/N")
    db = (
        parts.path.strip("/")
        if scheme != "unix"
        else dict(urllib.parse.parse_qsl(parts.query)).get("db", "0")
    )
    if db and not db.isdigit():
        raise InvalidArgument(f"{what}={shown!r}: database {db!r} is not a number; expected /N, e.g. /0")
    _check_params(parts.query, what, shown)
    del port
    return value


def _directory(value: str, what: str) -> str:
    """``value``, a directory (Hypothesis creates it on first save), unless it starts with a Redis
    scheme: ``redis:/x`` or ``redis:host:6379`` would become a folder of that name."""
    scheme = value.split(":", 1)[0].lower() if ":" in value else ""
    if scheme in REDIS_SCHEMES:
        shown = re.sub(r"^([^:]*:)[^@]*@", r"\1***@", value)  # a password before an @, hidden
        raise InvalidArgument(
            f"{what}={shown!r}: a Redis URL is {scheme}://HOST:PORT/N (two slashes); "
            "a directory path does not start with a Redis scheme"
        )
    return value


def _check_params(query: str, what: str, shown: str) -> None:
    """The URL's query parameters are ones redis-py takes (``?foo=bar`` crashed inside the client,
    ``?socket_timeout=abc`` too), a timeout a number."""
    for key, v in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if key not in URL_PARAMS:
            raise InvalidArgument(
                f"{what}={shown!r}: unknown parameter {key!r}; allowed: {', '.join(sorted(URL_PARAMS))}"
            )
        try:
            if key.endswith("timeout"):
                float(v)
        except ValueError:
            raise InvalidArgument(f"{what}={shown!r}: {key}={v!r} is not a number of seconds") from None


def check_fleet(value: Any, what: str = "fleet") -> str:
    if not isinstance(value, str) or not _FLEET_NAME.fullmatch(value):
        raise InvalidArgument(f"{what}={value!r}; must be 1-64 letters, digits, '_', '.' or '-'")
    return value


def database_options(get: Any, flag: str) -> tuple[str | None, str | None]:
    """(database, fleet) of a front end, checked: ``get("database")``, ``get("fleet")`` (None or
    empty: not given); errors name ``flag`` + the option."""
    database, fleet = get("database") or None, get("fleet") or None
    return check_database(database, f"{flag}database"), check_fleet(fleet, f"{flag}fleet") if fleet else None


def env_database() -> str | None:
    """``$SHARDFUZZ_DATABASE`` checked (None when unset or empty)."""
    return check_database(os.environ.get("SHARDFUZZ_DATABASE", "").strip() or None, "SHARDFUZZ_DATABASE")


def database_argument(url: str) -> str:
    """What to call ``url`` in an error: ``SHARDFUZZ_DATABASE`` where it came from there (a
    ``--jobs`` parent hands its workers the URL that way, to keep the password out of ``ps``),
    else ``--database``: an error naming an option the user never gave sent them looking for it."""
    from_env = os.environ.get("SHARDFUZZ_DATABASE", "").strip()
    return "SHARDFUZZ_DATABASE" if from_env and from_env == url else "--database"


def env_fleet() -> str:
    return check_fleet(os.environ.get("SHARDFUZZ_FLEET", "").strip() or DEFAULT_FLEET, "SHARDFUZZ_FLEET")


def redis_module() -> Any:
    """The ``redis`` client, or InvalidArgument naming the extra that installs it."""
    try:
        import redis
    except ImportError:
        raise InvalidArgument(
            f"a redis:// database needs the Redis client: pip install 'shardfuzz[redis]' ({REDIS_REQUIREMENT})"
        ) from None
    return redis


def connect(url: str, what: str | None = None) -> Any:
    """A connected client for ``url``; InvalidArgument naming the URL (never its password) when
    Redis cannot be reached or refuses the credentials."""
    redis = redis_module()
    what = what or database_argument(url)
    check_database(url, what)
    shown = redact(url)
    try:
        client = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT, **_no_retries()
        )
        client.ping()
    except redis.AuthenticationError:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None and "password" not in urllib.parse.parse_qs(parts.query):
            raise InvalidArgument(
                f"{what}={shown!r}: Redis asks for a password; give it in the URL: redis://:PASSWORD@HOST:PORT/N"
            ) from None
        raise InvalidArgument(f"{what}={shown!r}: Redis refused the password (or user)") from None
    except redis.ResponseError as e:  # NOAUTH and friends
        hint = (
            " (a server has databases 0 to 15 unless its 'databases' setting says more)"
            if "DB index" in str(e)
            else ""
        )
        raise InvalidArgument(f"{what}={shown!r}: Redis refused the connection: {e}{hint}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        tls = " or does it take TLS (rediss://)?" if urllib.parse.urlsplit(url).scheme == "rediss" else "?"
        raise InvalidArgument(
            f"{what}={shown!r}: cannot connect to Redis ({e}); is redis-server running there{tls}"
        ) from None
    except redis.RedisError as e:  # a server there, but not Redis: an HTTP proxy answered "400"
        raise InvalidArgument(
            f"{what}={shown!r}: the server there does not speak Redis ({type(e).__name__}: {e})"
        ) from None
    RedisLost.lost = None  # reachable again (a new campaign in this process)
    return client


def _no_retries() -> dict[str, Any]:
    """redis-py >= 4 retries a refused connection with a backoff (about 5 s): a worker that lost
    Redis goes on locally at once, and a wrong URL is said at once (3.x has no retries to turn off)."""
    try:
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        return {}
    return {"retry": Retry(NoBackoff(), 0)}


def fleet_prefix(fleet: str) -> str:
    return f"shardfuzz:{fleet}:"


def open_database(url: str, fleet: str, local: Any) -> Any:
    """Hypothesis' Redis database for ``url`` and ``fleet``, multiplexed with ``local`` (a
    Hypothesis database kept on this machine; None: Redis only), every Redis error turned into
    one warning and a local-only run from then on."""
    from hypothesis.database import MultiplexedDatabase
    from hypothesis.extra.redis import RedisExampleDatabase

    shared = RedisExampleDatabase(
        connect(url),
        expire_after=EXPIRE_AFTER,
        key_prefix=f"{fleet_prefix(fleet)}example:".encode(),
        listener_channel=f"{fleet_prefix(fleet)}changes",
    )
    fallible = _fallible_class()(shared, redact(url))
    return MultiplexedDatabase(local, fallible) if local is not None else fallible


class RedisLost:
    """Said once per process when Redis goes away (every fleet part shares it)."""

    _lock = threading.Lock()
    lost: str | None = None  # why, once lost

    @classmethod
    def note(cls, shown_url: str, error: BaseException) -> None:
        with cls._lock:
            if cls.lost is not None:
                return
            cls.lost = f"{type(error).__name__}: {error}"
        print(
            f"shardfuzz: warning: lost the shared database {shown_url} ({cls.lost}); going on with the "
            "local database and failure files only",
            file=sys.stderr,
            flush=True,
        )


def redis_errors() -> tuple[type[BaseException], ...]:
    redis = redis_module()
    return (redis.RedisError, OSError)


#: the suffixes of Hypothesis' secondary and pareto corpus keys (``ConjectureRunner.sub_key``)
SECONDARY, PARETO = b".secondary", b".pareto"
#: how many entries of a test's primary corpus a run replays, the smallest first (Hypothesis' own
#: shortlex order): every distinct finding's minimal example where the corpus is a machine's own,
#: the smallest of a shared corpus that many runs saved into
PRIMARY_REPLAYED = 32


def _fetch_shared(fetch: Any, key: bytes) -> list[bytes]:
    """What a fetch of ``key`` gives from the shared store: for the secondary key its primary
    corpus's smallest entries (as many as a run replays of its own: a later worker spent 2 m 42 s
    replaying 666 of them) and its secondary ones; nothing for the primary key; the pareto front."""
    if key.endswith(SECONDARY):
        primary = sorted(fetch(key[: -len(SECONDARY)]), key=lambda v: (len(v), v))
        return [*primary[:PRIMARY_REPLAYED], *fetch(key)]
    return list(fetch(key)) if key.endswith(PARETO) else []


def _fallible_class() -> type[Any]:
    from hypothesis.database import ExampleDatabase

    class FallibleDatabase(ExampleDatabase):
        """Delegates to ``inner`` until it raises a Redis error; from then on does nothing. Its
        primary corpus is fetched as the secondary one (see :meth:`fetch`)."""

        def __init__(self, inner: Any, shown_url: str) -> None:
            super().__init__()
            self.inner = inner
            self.shown_url = shown_url
            self.errors = redis_errors()

        def __repr__(self) -> str:
            return f"FallibleDatabase({self.shown_url})"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, FallibleDatabase) and self.inner == other.inner

        def __hash__(self) -> int:
            return hash(self.shown_url)

        def _call(self, name: str, *args: bytes) -> Any:
            if RedisLost.lost is not None:
                return []
            try:
                out = getattr(self.inner, name)(*args)
                return list(out) if name == "fetch" else out
            except self.errors as e:
                RedisLost.note(self.shown_url, e)
                return []

        def fetch(self, key: bytes) -> Iterable[bytes]:
            # the fleet's failing examples come back as the secondary corpus, never the primary:
            # Hypothesis reports a failing primary entry as already shrunk, and another worker
            # saves its shrink steps there as it goes; two workers started together stored a case
            # shrunk 0.1 s as a second "distinct" finding of one bug (a new user's fleet audit).
            # Replayed as secondary, a failing entry is shrunk here before it is reported
            return _fetch_shared(lambda k: self._call("fetch", k), key)

        def save(self, key: bytes, value: bytes) -> None:
            self._call("save", key, value)

        def delete(self, key: bytes, value: bytes) -> None:
            self._call("delete", key, value)

        def move(self, src: bytes, dest: bytes, value: bytes) -> None:
            self._call("move", src, dest, value)

    return FallibleDatabase


def save_only(db: Any) -> Any:
    """``db`` for saving only: a later run of a campaign keeps what it finds but does not replay
    the known failures again at its start."""
    return _save_only_class()(db)


def _save_only_class() -> type[Any]:
    from hypothesis.database import ExampleDatabase

    class SaveOnlyDatabase(ExampleDatabase):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def __repr__(self) -> str:
            return f"SaveOnlyDatabase({self.inner!r})"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, SaveOnlyDatabase) and self.inner == other.inner

        def __hash__(self) -> int:
            return hash((type(self), id(self.inner)))

        def fetch(self, key: bytes) -> Iterable[bytes]:  # noqa: ARG002 (nothing replayed, whatever the key)
            return []

        def save(self, key: bytes, value: bytes) -> None:
            self.inner.save(key, value)

        def delete(self, key: bytes, value: bytes) -> None:
            self.inner.delete(key, value)

        def move(self, src: bytes, dest: bytes, value: bytes) -> None:  # noqa: ARG002 (src was never fetched here)
            self.inner.save(dest, value)

    return SaveOnlyDatabase


@functools.cache
def hypothesis_database(database: str, fleet: str | None) -> Any:
    """The Hypothesis database for a configuration's ``database`` (one per URL and fleet in a
    process: they share a connection pool)."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if not is_redis_url(database):
        return DirectoryBasedExampleDatabase(database)
    from hypothesis.configuration import storage_directory

    # the local copy: Hypothesis' own default directory ($HYPOTHESIS_STORAGE_DIRECTORY/examples)
    where: Any = storage_directory("examples")
    local = DirectoryBasedExampleDatabase(getattr(where, "path", where))  # newer Hypothesis: a lazy object
    return open_database(database, fleet or DEFAULT_FLEET, local)
