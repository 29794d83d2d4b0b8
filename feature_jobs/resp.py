"""A lean pipelined Redis connection for the feature job's write path.

redis-py's asyncio client packs commands in Python and reads each reply through its own
timeout context: per event that costs more than Redis spends running the update script.
Here commands are packed by hiredis (the caller does it), written as they are ready, and
the replies of a whole batch are parsed by one hiredis Reader. Error replies come back as
values (`hiredis.ReplyError`), not exceptions; a broken or silent connection raises
`redis.ConnectionError` / `redis.TimeoutError` and is dropped, to be reopened by the next call.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_lib
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streams.redis_config import tls_context

ReplyError = hiredis.ReplyError


class RespConnection:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout_s: float = 2.0,
        io_timeout_s: float = 5.0,
        ssl: ssl_lib.SSLContext | None = None,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self._ssl = ssl
        self._username, self._password = username, password
        self._connect_timeout = connect_timeout_s
        self._io_timeout = io_timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser: Any = None

    @classmethod
    def for_client(cls, client: aioredis.Redis) -> RespConnection | None:
        """The same server, database, credentials and TLS as a redis-py client (which
        streams/redis_config.py built); None for unix sockets."""
        kw = client.connection_pool.connection_kwargs
        kind = client.connection_pool.connection_class
        if "path" in kw or kind not in (aioredis.Connection, aioredis.SSLConnection):
            return None
        return cls(
            ssl=tls_context(kw.get("ssl_ca_certs")) if kind is aioredis.SSLConnection else None,
            host=kw.get("host", "127.0.0.1"),
            port=int(kw.get("port", 6379)),
            db=int(kw.get("db", 0) or 0),
            username=kw.get("username"),
            password=kw.get("password"),
        )

    async def _open(self) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._ssl),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"redis {self.host}:{self.port}: {exc!r}") from exc
        self._parser = hiredis.Reader()
        hello: list[bytes] = []
        if self._password is not None:
            args = (
                ("AUTH", self._username, self._password)
                if self._username
                else (
                    "AUTH",
                    self._password,
                )
            )
            hello.append(hiredis.pack_command(args))
        if self.db:
            hello.append(hiredis.pack_command(("SELECT", self.db)))
        if hello:
            self._writer.write(b"".join(hello))
            for reply in await self.replies(len(hello)):
                if isinstance(reply, ReplyError):
                    self.close()
                    raise ResponseError(str(reply))

    async def send(self, data: bytes) -> None:
        if self._writer is None or self._writer.is_closing():
            await self._open()
        assert self._writer is not None
        self._writer.write(data)
        if self._writer.transport.get_write_buffer_size() > 1 << 20:
            await self._guard(self._writer.drain())

    async def replies(self, n: int) -> list[Any]:
        """The next `n` replies, error replies as `ReplyError` values."""
        out: list[Any] = []
        parser, reader = self._parser, self._reader
        if reader is None:
            raise RedisConnectionError("not connected")
        while len(out) < n:
            reply = parser.gets()
            if reply is False:
                data = await self._guard(reader.read(1 << 17))
                if not data:
                    self.close()
                    raise RedisConnectionError("redis closed the connection")
                parser.feed(data)
                continue
            out.append(reply)
        return out

    async def _guard(self, aw):
        try:
            return await asyncio.wait_for(aw, self._io_timeout)
        except TimeoutError as exc:
            self.close()
            raise RedisTimeoutError(f"redis {self.host}:{self.port}: no reply") from exc
        except OSError as exc:
            self.close()
            raise RedisConnectionError(f"redis {self.host}:{self.port}: {exc!r}") from exc

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._parser = None
