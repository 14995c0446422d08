"""A delay line for TCP, for bench/link_bench.sh on kernels without netem: accepts connections
on LISTEN and joins each to TARGET, holding every chunk it reads for DELAY_MS / 2 milliseconds
before writing it on, in each direction, so that an exchange of messages takes DELAY_MS longer
per round trip (a gRPC ask and its answer, a request and its first byte). It delays what the
applications see, not TCP's own acknowledgements: each side's TCP talks to the proxy nearby,
so the window never waits for the delay, as it does not on a real link whose bandwidth-delay
product fits the socket buffers (1.25 MB at 1 Gbit/s and 10 ms; Linux tunes up to 4 MB and
more). Prints "listening" once it accepts.

    delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS
"""
import asyncio
import collections
import sys
import time

CHUNK = 256 << 10
HELD = 16 << 20  # bytes held per direction at most: reading waits past it


async def pump(reader, writer, delay_s):
    """Reads chunks and writes each delay_s after it was read, in order."""
    queue = collections.deque()
    ready = asyncio.Event()
    room = asyncio.Event()
    held = 0
    done = False

    async def read():
        nonlocal done, held
        try:
            while True:
                while held > HELD:
                    room.clear()
                    await room.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                queue.append((time.monotonic() + delay_s, data))
                held += len(data)
                ready.set()
        except (ConnectionError, OSError):
            pass
        done = True
        ready.set()

    reading = asyncio.ensure_future(read())
    try:
        while True:
            if not queue:
                if done:
                    break
                ready.clear()
                await ready.wait()
                continue
            due, data = queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.popleft()
            writer.write(data)
            await writer.drain()
            held -= len(data)
            room.set()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        reading.cancel()


async def handle(client_reader, client_writer, target, delay_s):
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(pump(client_reader, server_writer, delay_s),
                         pump(server_reader, client_writer, delay_s))
    for w in (client_writer, server_writer):
        w.close()


def split(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def main(listen, target, delay_ms):
    delay_s = delay_ms / 2000.0
    server = await asyncio.start_server(lambda r, w: handle(r, w, target, delay_s), *listen,
                                        limit=CHUNK)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(split(sys.argv[1]), split(sys.argv[2]), float(sys.argv[3])))
