#!/usr/bin/python3
"""A fault-injecting HTTP proxy in front of a real S3 server, for the object-store tests
(tests/harness/s3_server.h, S3FaultProxy). Every request is forwarded to the upstream as it
came, unless a fault set through the control path matches it first:

  POST /__faults  {"method": "PUT", "query": "partNumber", "count": 2,
                   "status": 503, "code": "SlowDown"}          answer 503 with an S3 <Error>
                  {..., "status": 200, "code": "InternalError"} a 200 carrying an <Error>
                                                                 (the upstream never asked)
                  {..., "stall_s": 5}                            hold the answer that long
                  {..., "reset": true}                           close without an answer
  GET  /__faults  the faults left and the requests seen, as JSON

`count` < 0: every matching request. Debian's python3, standard library only.
Usage: s3_fault_proxy.py LISTEN_HOST LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT
"""
import http.client
import http.server
import json
import socketserver
import sys
import threading
import time

LOCK = threading.Lock()
FAULTS = []
SEEN = []


def error_body(code):
    return ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code>'
            '<Message>injected by the test proxy</Message></Error>' % code).encode()


def take_fault(method, query):
    with LOCK:
        SEEN.append({"method": method, "query": query})
        for f in FAULTS:
            if f.get("method", method) != method:
                continue
            if f.get("query", "") not in query:
                continue
            if f.get("count", 1) == 0:
                continue
            if f.get("count", 1) > 0:
                f["count"] = f.get("count", 1) - 1
            return dict(f)
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        n = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(n) if n else b""

    def answer(self, status, body, headers=(), length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def control(self):
        if self.command == "POST":
            with LOCK:
                FAULTS.append(json.loads(self.body() or b"{}"))
            self.answer(200, b"{}")
        else:
            with LOCK:
                out = json.dumps({"faults": FAULTS, "seen": SEEN}).encode()
            self.answer(200, out)

    def forward(self):
        if self.path.startswith("/__faults"):
            return self.control()
        data = self.body()
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        fault = take_fault(self.command, query)
        if fault and fault.get("reset"):
            self.close_connection = True
            self.connection.close()
            return
        if fault and fault.get("stall_s"):
            time.sleep(fault["stall_s"])
        if fault and ("status" in fault or "code" in fault):
            self.answer(fault.get("status", 200), error_body(fault.get("code", "InternalError")),
                        [("Content-Type", "application/xml")])
            return
        up = http.client.HTTPConnection(UPSTREAM[0], UPSTREAM[1], timeout=120)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("connection", "content-length")}
        up.request(self.command, self.path, body=data, headers=headers)
        resp = up.getresponse()
        payload = resp.read()
        up.close()
        keep = [(k, v) for k, v in resp.getheaders()
                if k.lower() not in ("content-length", "connection", "transfer-encoding")]
        # (a HEAD's Content-Length is the object's, not its empty body's)
        length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        self.answer(resp.status, payload, keep, length)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    UPSTREAM = (sys.argv[3], int(sys.argv[4]))
    Server((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
