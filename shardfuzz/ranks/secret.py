"""The shared secret between a driver and its rank servers, proved both ways on connect, and every
message after it sealed with a key of that connection.

A rank server runs whatever task its driver sends (tasks are pickles), so it must only take tasks
from its driver, and a driver must only take answers from its servers. Both hold the same secret
(``SHARDFUZZ_SECRET``, or a file only its owner can read) and prove it by challenge and response:
each side sends a fresh random nonce and checks the other's HMAC-SHA256 of it. The secret itself
never crosses the wire. Each message after that carries an HMAC-SHA256 under a key derived from
the secret and both nonces, with its direction and its number in the stream
(:class:`SealedConnection`): a message that does not carry it is never unpickled, and the channel
closes. So a relay that passed the handshake on can neither inject, alter, replay nor reorder a
message. Messages are not encrypted (no TLS): anyone on the path can read cases and results, so
run servers and driver on a network you trust (``docs/how-to/multi-node.md``); a weak secret can
be guessed offline from a recorded handshake, so use a random one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
import socket
import stat
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from shardfuzz.errors import InfrastructureError, InvalidArgument

ENV = "SHARDFUZZ_SECRET"
MAGIC = b"SHARDFUZZ-RANKS-1"
NONCE = 32
MIN_SECRET = 16
#: how long the whole handshake may take (a peer that trickles bytes is cut off at this)
HANDSHAKE_S = 10.0
#: TCP keepalive: a peer whose host died or whose network is cut (no FIN) is found gone after
#: about KEEPIDLE + KEEPINTVL * KEEPCNT seconds of silence, so no server outlives its driver
KEEPIDLE, KEEPINTVL, KEEPCNT = 30, 10, 3


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


def _read(sock: socket.socket, n: int, peer: str, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused(f"{peer} did not finish the handshake within {HANDSHAKE_S:.0f} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(data))
        except TimeoutError:
            raise Refused(f"{peer} did not finish the handshake within {HANDSHAKE_S:.0f} s") from None
        if not chunk:
            raise Refused(f"{peer} closed the connection during the handshake")
        data += chunk
    return data


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPIDLE), ("TCP_KEEPINTVL", KEEPINTVL), ("TCP_KEEPCNT", KEEPCNT)):
        if hasattr(socket, name):  # Linux; macOS has fewer
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class SealedConnection:
    """A :class:`~multiprocessing.connection.Connection` whose every message carries an
    HMAC-SHA256 of its direction, its number in the stream and its bytes, under the connection's
    key; a message without it is never unpickled (the channel closes: the peer is treated as
    gone). It has what the pools use of a Connection: ``send``, ``recv``, ``poll``, ``fileno``
    (for :func:`multiprocessing.connection.wait`) and ``close``."""

    def __init__(self, conn: Connection, key: bytes, sending: bytes, receiving: bytes, peer: str) -> None:
        self._conn, self._key, self.peer = conn, key, peer
        self._labels = (sending, receiving)
        self._sent = self._received = 0

    def _tag(self, label: bytes, n: int, data: bytes) -> bytes:
        return hmac.new(self._key, label + n.to_bytes(8, "big") + data, hashlib.sha256).digest()

    def send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._conn.send_bytes(self._tag(self._labels[0], self._sent, data) + data)
        self._sent += 1

    def recv(self) -> Any:
        raw = self._conn.recv_bytes()
        tag, data = raw[:32], raw[32:]
        if not hmac.compare_digest(tag, self._tag(self._labels[1], self._received, data)):
            self._conn.close()
            print(f"shardfuzz: a message from {self.peer} without this connection's seal: dropped, "
                  "the channel closed", file=sys.stderr)  # fmt: skip
            raise EOFError(f"a message from {self.peer} failed its check")
        self._received += 1
        return pickle.loads(data)

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self._conn.poll(timeout)

    def fileno(self) -> int:
        return self._conn.fileno()

    def close(self) -> None:
        self._conn.close()

    @property
    def closed(self) -> bool:
        return self._conn.closed


def _sealed(
    sock: socket.socket, secret: bytes, driver_nonce: bytes, server_nonce: bytes, driver: bool, peer: str
) -> SealedConnection:
    sock.settimeout(None)
    _keepalive(sock)
    key = _mac(secret, b"session", driver_nonce, server_nonce)
    labels = (b"driver->server", b"server->driver")
    sending, receiving = labels if driver else labels[::-1]
    return SealedConnection(Connection(sock.detach()), key, sending, receiving, peer)


def accept(sock: socket.socket, secret: bytes, peer: str) -> SealedConnection:
    """The driver's side: challenge the server, check its proof, prove the secret back."""
    deadline = time.monotonic() + HANDSHAKE_S
    mine = secrets.token_bytes(NONCE)
    sock.settimeout(HANDSHAKE_S)
    sock.sendall(MAGIC + mine)
    answer = _read(sock, 32 + NONCE, peer, deadline)
    proof, theirs = answer[:32], answer[32:]
    if not hmac.compare_digest(proof, _mac(secret, b"server", mine)):
        sock.sendall(b"R")
        sock.close()
        raise Refused(f"refused {peer}: it does not hold this driver's secret")
    sock.sendall(b"A" + _mac(secret, b"driver", theirs, mine))
    return _sealed(sock, secret, mine, theirs, True, f"rank server {peer}")


def connect(address: tuple[str, int], secret: bytes, timeout_s: float) -> SealedConnection:
    """The server's side: answer the driver's challenge, then check that the driver holds the
    secret too before taking anything from it."""
    where = f"the driver at {address[0]}:{address[1]}"
    sock = socket.create_connection(address, timeout=timeout_s)
    deadline = time.monotonic() + HANDSHAKE_S
    try:
        head = _read(sock, len(MAGIC) + NONCE, where, deadline)
        if head[: len(MAGIC)] != MAGIC:
            raise Refused(f"{where} is not a shardfuzz driver (it sent {head[: len(MAGIC)]!r})")
        theirs, mine = head[len(MAGIC) :], secrets.token_bytes(NONCE)
        sock.sendall(_mac(secret, b"server", theirs) + mine)
        if _read(sock, 1, where, deadline) != b"A":
            raise Refused(f"{where} refused this server: the secrets differ (check ${ENV} or --secret-file)")
        if not hmac.compare_digest(_read(sock, 32, where, deadline), _mac(secret, b"driver", mine, theirs)):
            raise Refused(f"{where} did not prove the secret: it is not your driver, and nothing was run")
    except BaseException:
        sock.close()
        raise
    return _sealed(sock, secret, theirs, mine, False, where)
