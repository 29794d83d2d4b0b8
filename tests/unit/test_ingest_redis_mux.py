"""The pipelined Redis connection, against a fake RESP server: order, errors, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import hiredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ingest.redis_mux import MuxRedis


class FakeRedis:
    """Answers PING, ECHO (after an optional delay), AUTH, SELECT, EVALSHA (NOSCRIPT until
    EVAL ran), and SLEEP (never answers); remembers what it was sent."""

    def __init__(self) -> None:
        self.commands: list[list[bytes]] = []
        self.loaded = False
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        parser = hiredis.Reader()
        while data := await reader.read(4096):
            parser.feed(data)
            while (command := parser.gets()) is not False:
                self.commands.append(command)
                reply = await self.answer(command)
                if reply is not None:
                    writer.write(reply)
        writer.close()

    async def answer(self, command: list[bytes]) -> bytes | None:
        name = command[0].upper()
        if name == b"ECHO":
            await asyncio.sleep(float(command[2]) if len(command) > 2 else 0)
            return b"$%d\r\n%s\r\n" % (len(command[1]), command[1])
        if name == b"SLEEP":
            return None
        if name == b"EVALSHA":
            return b"-NOSCRIPT No matching script\r\n" if not self.loaded else b":7\r\n"
        if name == b"EVAL":
            self.loaded = True
            return b":7\r\n"
        if name == b"FAIL":
            return b"-ERR bad\r\n"
        return b"+OK\r\n" if name in {b"AUTH", b"SELECT"} else b"+PONG\r\n"


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeRedis, int]]:
    server = FakeRedis()
    port = await server.start()
    yield server, port
    assert server.server is not None
    server.server.close()


async def test_concurrent_calls_get_their_own_replies(fake: tuple[FakeRedis, int]) -> None:
    server, port = fake
    r = MuxRedis(f"redis://127.0.0.1:{port}/0", 2.0)
    replies = await asyncio.gather(*(r.execute("ECHO", f"v{i}") for i in range(50)))
    assert replies == [f"v{i}".encode() for i in range(50)]
    assert server.connections == 1  # all of them pipelined on one connection
    await r.aclose()


async def test_auth_and_db_are_sent_first(fake: tuple[FakeRedis, int]) -> None:
    server, port = fake
    r = MuxRedis(f"redis://ingest:s%40cret@127.0.0.1:{port}/3", 2.0)
    assert await r.ping()
    assert server.commands[:2] == [[b"AUTH", b"ingest", b"s@cret"], [b"SELECT", b"3"]]
    assert "s@cret" not in repr(r)
    await r.aclose()


async def test_error_replies_raise_and_the_link_stays(fake: tuple[FakeRedis, int]) -> None:
    server, port = fake
    r = MuxRedis(f"redis://127.0.0.1:{port}", 2.0)
    with pytest.raises(ResponseError):
        await r.execute("FAIL")
    assert await r.ping()
    assert server.connections == 1
    await r.aclose()


async def test_scripts_are_loaded_when_redis_lacks_them(fake: tuple[FakeRedis, int]) -> None:
    server, port = fake
    r = MuxRedis(f"redis://127.0.0.1:{port}", 2.0)
    script = r.register_script("return 7")
    assert await script(keys=["k"], args=[1]) == 7
    assert await script(keys=["k"], args=[1]) == 7
    names = [c[0] for c in server.commands]
    assert names == [b"EVALSHA", b"EVAL", b"EVALSHA"]
    await r.aclose()


async def test_a_silent_redis_times_out_every_waiting_call(fake: tuple[FakeRedis, int]) -> None:
    server, port = fake
    r = MuxRedis(f"redis://127.0.0.1:{port}", 0.2)
    results = await asyncio.gather(
        r.execute("SLEEP"), r.execute("ECHO", "late", "0.5"), return_exceptions=True
    )
    assert all(isinstance(x, RedisTimeoutError) for x in results)
    assert await r.ping()  # a fresh connection for the next call
    assert server.connections == 2
    await r.aclose()


async def test_nobody_listening_is_a_connection_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = MuxRedis(f"redis://127.0.0.1:{port}", 0.5)
    with pytest.raises(RedisConnectionError):
        await r.ping()
