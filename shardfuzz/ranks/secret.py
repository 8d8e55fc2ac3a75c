"""The shared secret between a driver and its rank servers, proved both ways on connect.

A rank server runs whatever task its driver sends (tasks are pickles), so it must only take tasks
from its driver, and a driver must only take answers from its servers. Both hold the same secret
(``SHARDFUZZ_SECRET``, or a file only its owner can read) and prove it by challenge and response:
each side sends a fresh random nonce and checks the other's HMAC-SHA256 of it. The secret itself
never crosses the wire. After the handshake the socket carries pickled messages in the clear (no
TLS): this check is the only barrier, so run servers and driver on a network you trust
(``docs/how-to/multi-node.md``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
from multiprocessing.connection import Connection

from shardfuzz.errors import InfrastructureError, InvalidArgument

ENV = "SHARDFUZZ_SECRET"
MAGIC = b"SHARDFUZZ-RANKS-1"
NONCE = 32
MIN_SECRET = 16
#: how long either side waits for the other's part of the handshake
HANDSHAKE_S = 10.0


class Refused(InfrastructureError):
    """The other side did not prove the secret (or speaks another protocol)."""


def load_secret(path: str | None = None) -> bytes:
    """The secret from ``path`` (a file only its owner may read) or else ``$SHARDFUZZ_SECRET``."""
    if path is not None:
        try:
            mode = os.stat(path).st_mode
            with open(path, "rb") as f:
                value = f.read().strip()
        except OSError as e:
            raise InvalidArgument(f"--secret-file={path!r}: {e.strerror}") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidArgument(
                f"--secret-file={path!r} has mode {stat.S_IMODE(mode):o}: others may read it; "
                f"allowed: readable by its owner only (chmod 600 {path})"
            )
        where = f"--secret-file={path!r}"
    else:
        value = os.environ.get(ENV, "").strip().encode()
        where = f"${ENV}"
        if not value:
            raise InvalidArgument(
                f"no secret: set ${ENV} (the same on the driver and every rank server; e.g. "
                f'"$(python -c "import secrets; print(secrets.token_hex(32))")") or pass --secret-file'
            )
    if len(value) < MIN_SECRET:
        raise InvalidArgument(f"{where} holds {len(value)} characters; allowed: at least {MIN_SECRET}")
    return value


def _mac(secret: bytes, role: bytes, *nonces: bytes) -> bytes:
    return hmac.new(secret, role + b"".join(nonces), hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, peer: str) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise Refused(f"{peer} closed the connection during the handshake")
        data += chunk
    return data


def accept(sock: socket.socket, secret: bytes, peer: str) -> Connection:
    """The driver's side: challenge the server, check its proof, prove the secret back."""
    sock.settimeout(HANDSHAKE_S)
    mine = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + mine)
    proof, theirs = (lambda d: (d[:32], d[32:]))(_read(sock, 32 + NONCE, peer))
    if not hmac.compare_digest(proof, _mac(secret, b"server", mine)):
        sock.sendall(b"R")
        sock.close()
        raise Refused(f"refused {peer}: it does not hold this driver's secret")
    sock.sendall(b"A" + _mac(secret, b"driver", theirs, mine))
    sock.settimeout(None)
    return Connection(sock.detach())


def connect(address: tuple[str, int], secret: bytes, timeout_s: float) -> Connection:
    """The server's side: answer the driver's challenge, then check that the driver holds the
    secret too before taking anything from it."""
    where = f"the driver at {address[0]}:{address[1]}"
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.settimeout(HANDSHAKE_S)
    try:
        head = _read(sock, len(MAGIC) + NONCE, where)
        if head[: len(MAGIC)] != MAGIC:
            raise Refused(f"{where} is not a shardfuzz driver (it sent {head[: len(MAGIC)]!r})")
        theirs, mine = head[len(MAGIC) :], secrets.token_bytes(NONCE)
        sock.sendall(_mac(secret, b"server", theirs) + mine)
        if _read(sock, 1, where) != b"A":
            raise Refused(f"{where} refused this server: the secrets differ (check ${ENV} or --secret-file)")
        if not hmac.compare_digest(_read(sock, 32, where), _mac(secret, b"driver", mine, theirs)):
            raise Refused(f"{where} did not prove the secret: it is not your driver, and nothing was run")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return Connection(sock.detach())
