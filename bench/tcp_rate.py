"""Raw TCP throughput between two hosts, the baseline of bench/link_bench.sh: what one TCP
connection carries over the same link as the shuffle, with nothing but sendall and recv_into.

    tcp_rate.py serve HOST PORT     # receives one connection, prints "RESULT {mb_per_sec...}"
    tcp_rate.py send HOST PORT MB   # sends MB mebibytes in 1 MiB writes, then closes
"""
import json
import socket
import sys
import time


def serve(host, port):
    with socket.create_server((host, port)) as srv:
        print("listening", flush=True)
        conn, _ = srv.accept()
        with conn:
            buf = bytearray(1 << 20)
            view = memoryview(buf)
            got = conn.recv_into(view)
            start = time.perf_counter()
            total = got
            while got:
                got = conn.recv_into(view)
                total += got
            seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({"bytes": total, "seconds": round(seconds, 4),
                                  "mb_per_sec": round(total / seconds / 1e6, 1)}), flush=True)


def send(host, port, mb):
    block = bytes(1 << 20)
    with socket.create_connection((host, port)) as s:
        for _ in range(mb):
            s.sendall(block)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # until the receiver closes


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "send":
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)
