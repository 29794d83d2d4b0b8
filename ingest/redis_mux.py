"""One Redis connection shared by every request of an ingest process, pipelined.

Why not redis-py's asyncio client on the request path: on this project's machine a call
through it costs 180-310 µs of CPU (a pooled connection checked out and back, a timeout
context and a retry wrapper per call, commands packed in Python), which was most of the CPU
of a single-ticket post. Here each call is packed by hiredis and written at once; Redis
answers in order, so one reader task parses the replies with hiredis and hands them to the
waiting calls first in, first out. Concurrent requests pipeline on the connection without
waiting for each other, and the commands of one turn of the event loop go in one write.

A call that gets no reply within the timeout fails, and so does every call behind it: the
connection is dropped (a late reply could no longer be matched) and reopened by the next
call. Errors are redis-py's (`ConnectionError`, `TimeoutError`, `ResponseError`), so the
stores and the fail-open rules treat both clients alike; `ticketflow keys|limits` use
redis-py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streams.redis_config import Target, endpoint

Arg = str | bytes | int | float


def as_text(value: bytes | str, errors: str = "strict") -> str:
    """A reply or record field as text: redis-py and confluent-kafka type theirs as bytes or
    str (bytes here: no client of ours decodes responses)."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else value


class _Link:
    """One open connection: its writer, the calls waiting for replies, its reader task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.task: asyncio.Task[None] | None = None
        # commands of one turn of the event loop, written together: a send() costs tens of
        # µs here, and under load many requests reach Redis in the same turn
        self.out: list[bytes] = []

    def queue(self, packed: bytes) -> None:
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(packed)

    def flush(self) -> None:
        out, self.out = self.out, []
        if out and not self.writer.is_closing():
            self.writer.write(b"".join(out))

    def fail(self, error: Exception) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)
        self.writer.close()


class MuxRedis:
    def __init__(self, url: Target, timeout_s: float) -> None:
        # the same reading of the URL (scheme, user, password, db) and CA as every other
        # client's; a rediss:// URL verifies the server's certificate and name
        e = endpoint(url)
        self.host, self.port, self.db = e.host, e.port, e.db
        self._username = e.username
        self._password = e.password
        self._ssl = e.ssl
        self.timeout_s = timeout_s
        self._link: _Link | None = None
        self._opening: asyncio.Lock | None = None

    # ---- the connection -----------------------------------------------------------------------

    async def _connect(self) -> _Link:
        if self._link is not None and not self._link.writer.is_closing():
            return self._link
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # one opening at a time; the others wait for it
            if self._link is None or self._link.writer.is_closing():
                self._link = await self._open()
        return self._link

    async def _open(self) -> _Link:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._ssl), self.timeout_s
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise RedisConnectionError(
                f"redis {self.host}:{self.port}: {type(exc).__name__}"
            ) from None
        link = _Link(reader, writer)
        link.task = asyncio.get_running_loop().create_task(self._read(link))
        hello: list[tuple[Arg, ...]] = []
        if self._password is not None:
            user = (self._username,) if self._username else ()
            hello.append(("AUTH", *user, self._password.get_secret_value()))
        if self.db:
            hello.append(("SELECT", self.db))
        for command in hello:
            await self._send(link, command)  # an error reply raises ResponseError
        return link

    async def _read(self, link: _Link) -> None:
        parser = hiredis.Reader()
        try:
            while True:
                data = await link.reader.read(1 << 16)
                if not data:
                    raise RedisConnectionError("redis closed the connection")
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    future = link.waiting.popleft()
                    if future.done():
                        continue  # its caller timed out; the link is failing anyway
                    if isinstance(reply, hiredis.ReplyError):
                        future.set_exception(ResponseError(str(reply)))
                    else:
                        future.set_result(reply)
        except (OSError, RedisConnectionError, IndexError) as exc:
            error = (
                exc
                if isinstance(exc, RedisConnectionError)
                else RedisConnectionError(f"redis {self.host}:{self.port}: {type(exc).__name__}")
            )
            self._drop(link, error)
        except asyncio.CancelledError:
            self._drop(link, RedisConnectionError("closed"))
            raise

    def _drop(self, link: _Link, error: Exception) -> None:
        if self._link is link:
            self._link = None
        link.fail(error)

    # ---- calls --------------------------------------------------------------------------------

    async def execute(self, *command: Arg) -> Any:
        link = await self._connect()
        return await self._send(link, command)

    async def _send(self, link: _Link, command: Sequence[Arg]) -> Any:
        if link.writer.is_closing():
            raise RedisConnectionError(f"redis {self.host}:{self.port}: connection lost")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.waiting.append(future)
        # hiredis's stub types the command as a 1-tuple; it takes any number of arguments
        link.queue(hiredis.pack_command(tuple(command)))  # type: ignore[arg-type]  # stub: 1-tuple
        timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire, link, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, link: _Link, future: asyncio.Future[Any]) -> None:
        if not future.done():
            self._drop(link, RedisTimeoutError(f"redis {self.host}:{self.port}: no reply"))

    # ---- what the stores use ------------------------------------------------------------------

    def register_script(self, source: str) -> MuxScript:
        return MuxScript(self, source)

    async def hgetall(self, name: str) -> dict[bytes, bytes]:
        flat = await self.execute("HGETALL", name)
        return dict(zip(flat[::2], flat[1::2], strict=True))

    async def hget(self, name: str, field: str) -> bytes | None:
        return await self.execute("HGET", name, field)

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self.execute("MGET", *keys)

    async def exists(self, *names: str) -> int:
        return await self.execute("EXISTS", *names)

    async def ping(self) -> bool:
        return await self.execute("PING") in (b"PONG", "PONG")

    async def aclose(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            if link.task is not None:
                link.task.cancel()
            link.fail(RedisConnectionError("closed"))


class MuxScript:
    """A Lua script called by its SHA-1, loaded (by EVAL) when Redis does not have it."""

    def __init__(self, client: MuxRedis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        try:
            return await self.client.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self.client.execute("EVAL", self.source, len(keys), *keys, *args)
