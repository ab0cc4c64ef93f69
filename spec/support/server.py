#!/usr/bin/python3
"""Scriptable HTTP/1.1 test server for the ratewise specs.

Standard library only. Run as ``/usr/bin/python3 spec/support/server.py``
(the pyenv ``python3`` first on PATH is a different build). Once listening it
prints exactly one line ``listening <port> <pid>`` to stdout.

What it offers (see spec/support/server.lua for the Lua driver):

* ``POST /_script`` ``{"path": "/x", "steps": [step, ...]}``: requests to
  ``/x`` consume the steps in order; the last step then repeats forever.
  A step has ``status``, ``headers`` (name -> string or array of strings),
  ``body``, ``delay`` (seconds) and ``action``: respond, drop, reset
  (RST before a byte), garbage (a line that is not HTTP), hang, slow (body
  byte by byte, every ``interval`` s), truncate (Content-Length 1000 bytes
  over the body), chunked_forever, redirect (to ``location``), reset_body
  (headers and the first ``sent`` bytes of the body, default half, then
  RST), raw (``body`` is the whole answer, status line included) or
  stream (a chunked body sent as ``chunks``, each ``[seconds, text]``: a
  pause, then the text; then the body ends, or with ``end`` "reset" the
  connection is reset, with "hang" it stays silent).
  A step's ``encoding`` (gzip, deflate, deflate-raw, br or zstd, or an
  array of them applied in order) sends the body compressed, with its
  Content-Encoding (deflate-raw is sent as "deflate"); a stream's chunks
  are compressed as they go out (gzip, deflate or deflate-raw alone). With
  ``cut`` N the encoded body's last N bytes are left out, and its
  Content-Length says what is sent; with ``zeros`` N the body is N zero
  bytes, compressed without ever being in memory whole (a bomb). A
  stream's ``end`` "unfinished" ends the body without the coding's end.
  endless: a chunked body of ``body`` (default 64 KiB of "x"), again and
  again as fast as the client takes it (every ``interval`` s if given),
  until the client goes away or ``cap`` bytes (default 1 GiB) went out;
  the request's log record then says ``sent`` (body bytes written) and
  ``gone`` (true: the client disconnected; false: the cap was reached).
* A request in absolute form (``GET http://host:port/x``, as a client sends
  it to a proxy) is answered as its path would be, and logged with
  ``proxied`` true and whether it carried Proxy-Authorization.
* ``GET /_log[?path=/x]``: JSON array of the logged requests.
* ``POST /_limit`` ``{"path": "/x", "rate": R, "burst": B, "retry_after": "1"}``:
  requests to ``/x`` (unless scripted) pass a token bucket of B tokens
  refilled at R a second, as a rate-limited API's server does: ``200 ok``,
  or ``429`` with the given Retry-After (none when it is absent).
  ``GET /_limit?path=/x`` answers ``{"ok": n, "limited": n}``.
  With ``"window": W`` and ``"limit": N`` instead, the limit is a fixed
  window of N requests per W seconds, opened by the first request after the
  last one ended (as the memory stores of express-rate-limit 7 and
  @fastify/rate-limit 9 do), and answers with the headers of ``"as"``:
  ``express`` (X-RateLimit-* with the reset in epoch seconds rounded up, a
  whole-second Date, Retry-After in whole seconds rounded up),
  ``express-draft-6`` (RateLimit-Limit/-Remaining/-Reset as seconds and
  RateLimit-Policy ``N;w=W``), ``express-draft-7`` (RateLimit
  ``limit=N, remaining=n, reset=s`` and RateLimit-Policy), ``fastify``
  (x-ratelimit-* with the reset as seconds until it, rounded up) or
  ``flexible`` (rate-limiter-flexible's documented headers: the reset in
  epoch seconds rounded up, Retry-After in fractional seconds).
  ``"retry_after": false`` leaves Retry-After out (fastify's
  ``addHeaders: {'retry-after': false}``).
* ``POST /_llm`` ``{"path": "/v1/messages", "provider": "anthropic",
  "models": {"m": {"rpm": R, "itpm": I, "otpm": O}}, ...}``: requests to
  the path meet the rate limits of OpenAI's or Anthropic's API, as
  spec/support/llm_mock.py describes; ``GET /_llm?path=`` says what they
  counted.
* ``POST /_reset``: forget scripts, log, the limits and the demo rate limiter.
* ``/echo``: describes the request as JSON.
* ``/api/...``: a demo rate-limited API (token bucket, random 503s).
* anything else: ``200 ok``.

Control requests (paths starting with ``/_``) are neither logged nor counted
in ``active``.
"""

import argparse
import email.utils
import json
import math
import os
import random
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import llm_mock

ACTIONS = (
    "respond", "drop", "reset", "garbage", "hang", "slow", "truncate",
    "chunked_forever", "redirect", "reset_body", "raw", "stream", "endless",
)

# Errors that only mean "the client went away"; never worth a traceback.
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError,
               TimeoutError)


class State:
    """All mutable server state, shared by the handler threads."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.active = 0  # requests being handled right now (non-control)
        self.reset()

    def reset(self):
        with self.lock:
            self.seq = 0
            self.log = []
            self.scripts = {}  # path -> {"steps": [...], "next": index}
            self.limits = {}  # path -> a bucket set with /_limit
            self.llm = {}  # path -> an llm_mock.LLMMock set with /_llm
            self.tokens = float(self.args.api_capacity)
            self.refilled_at = time.monotonic()
            self.rng = random.Random(self.args.seed)

    def record(self, rec):
        """Append a request to the log, assign its seq and pick its step.

        Done under one lock so that seq order and step order always agree.
        Returns the step (dict) or None if the path has no script.
        """
        with self.lock:
            self.seq += 1
            rec["seq"] = self.seq
            self.log.append(rec)
            script = self.scripts.get(rec["path"])
            if script is None:
                return None
            steps = script["steps"]
            step = steps[min(script["next"], len(steps) - 1)]
            script["next"] += 1
            return step

    def take_token(self):
        """Token bucket of the demo API.

        Returns (allowed, tokens_left, seconds_until_next_token, fail) where
        fail says whether an allowed request should fail with a 503 anyway.
        The RNG is only drawn for allowed requests, so a given sequence of
        allowed/limited requests always yields the same 503s for one seed.
        """
        cap = float(self.args.api_capacity)
        rate = float(self.args.api_rate)
        with self.lock:
            now = time.monotonic()
            self.tokens = min(cap, self.tokens + (now - self.refilled_at) * rate)
            self.refilled_at = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                fail = self.rng.random() < self.args.api_fail
                return True, self.tokens, 0.0, fail
            wait = (1.0 - self.tokens) / rate if rate > 0 else 3600.0
            return False, self.tokens, wait, False


WINDOW_HEADERS = ("express", "express-draft-6", "express-draft-7", "fastify", "flexible")


def validate_window(spec):
    """Check a fixed-window /_limit payload; return its window."""
    limit, window, kind = spec.get("limit"), spec.get("window"), spec.get("as", "express")
    for name, v in (("limit", limit), ("window", window)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ValueError("limit: %s must be a positive number" % name)
    if kind not in WINDOW_HEADERS:
        raise ValueError("limit: 'as' must be one of %s" % ", ".join(WINDOW_HEADERS))
    retry_after = spec.get("retry_after", True)
    if not isinstance(retry_after, bool):
        raise ValueError("limit: retry_after must be a boolean for a window")
    return {"window": float(window), "limit": int(limit), "as": kind, "retry_after": retry_after,
            "hits": 0, "reset_at": 0.0, "ok": 0, "limited": 0}


def window_headers(w, now, allowed):
    """The headers a fixed-window limiter of the kind w["as"] sends."""
    kind, limit = w["as"], w["limit"]
    remaining = max(0, limit - w["hits"])
    left_ms = max(0.0, (w["reset_at"] - now) * 1000)
    window_s = math.ceil(w["window"])
    retry = None
    if kind == "express":
        # express-rate-limit's setLegacyHeaders and setRetryAfterHeader
        headers = [("X-RateLimit-Limit", str(limit)), ("X-RateLimit-Remaining", str(remaining)),
                   ("Date", email.utils.formatdate(now, usegmt=True)),
                   ("X-RateLimit-Reset", str(math.ceil(w["reset_at"])))]
        retry = str(math.ceil(left_ms / 1000))
    elif kind == "express-draft-6":
        headers = [("RateLimit-Policy", "%d;w=%d" % (limit, window_s)),
                   ("RateLimit-Limit", str(limit)), ("RateLimit-Remaining", str(remaining))]
        reset = math.ceil(left_ms / 1000)
        if reset:
            headers.append(("RateLimit-Reset", str(reset)))
        retry = str(reset)
    elif kind == "express-draft-7":
        reset = math.ceil(left_ms / 1000)
        headers = [("RateLimit-Policy", "%d;w=%d" % (limit, window_s)),
                   ("RateLimit", "limit=%d, remaining=%d, reset=%d" % (limit, remaining, reset))]
        retry = str(reset)
    elif kind == "fastify":
        # @fastify/rate-limit: timeLeftInSeconds = Math.ceil(ttl / 1000)
        left = math.ceil(left_ms / 1000)
        headers = [("x-ratelimit-limit", str(limit)), ("x-ratelimit-remaining", str(remaining)),
                   ("x-ratelimit-reset", str(left)), ("Date", email.utils.formatdate(now, usegmt=True))]
        retry = str(left)
    else:  # flexible
        headers = [("X-RateLimit-Limit", str(limit)), ("X-RateLimit-Remaining", str(remaining)),
                   ("X-RateLimit-Reset", str(math.ceil(w["reset_at"]))),
                   ("Date", email.utils.formatdate(now, usegmt=True))]
        retry = num_str(round(left_ms) / 1000)
    if not allowed and w["retry_after"]:
        headers.append(("Retry-After", retry))
    return headers


def validate_limit(spec):
    """Check a /_limit payload; return its bucket. Raises ValueError."""
    if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
        raise ValueError("limit needs a path")
    if "window" in spec:
        return validate_window(spec)
    rate, burst = spec.get("rate"), spec.get("burst", 1)
    for name, v in (("rate", rate), ("burst", burst)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ValueError("limit: %s must be a positive number" % name)
    retry_after = spec.get("retry_after")
    if retry_after is not None and not isinstance(retry_after, str):
        raise ValueError("limit: retry_after must be a string")
    return {"rate": float(rate), "burst": float(burst), "retry_after": retry_after,
            "tokens": float(burst), "at": time.monotonic(), "ok": 0, "limited": 0}


def num_str(x):
    """Format a number for a header: 5.0 -> "5", 2.5 -> "2.5"."""
    return str(int(x)) if float(x).is_integer() else str(x)


def step_bytes(s):
    """Encode a body string from a script.

    The control body is decoded with surrogateescape (see read_json), so the
    bytes a spec put into a step body come back out unchanged, even when
    they are not valid UTF-8.
    """
    return s.encode("utf-8", "surrogateescape")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive by default
    disable_nagle_algorithm = True  # slow/chunked writes go out at once
    server_version = "ratewise-test-server"
    sys_version = ""

    # --- plumbing -----------------------------------------------------

    def setup(self):
        super().setup()
        self.conn_id = "%s:%d" % self.client_address[:2]
        self.conn_seq = 0

    def parse_request(self):
        # Called right after the request line was read: that is our `t`.
        self.t_start = time.monotonic()
        self.wall_start = time.time()
        self.conn_seq += 1
        return super().parse_request()

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass  # no per-request noise on stderr

    def do_CONNECT(self):
        """A tunnel, as an HTTPS proxy makes one: logged (path "CONNECT",
        the target in "query"), then bytes relayed both ways until either
        side closes. Only to 127.0.0.1: this is a test server."""
        state = self.server.state
        host, _, port = self.path.rpartition(":")
        with state.lock:
            state.active += 1
        try:
            state.record({
                "seq": None, "path": "CONNECT", "query": self.path, "method": "CONNECT",
                "headers": {k.lower(): v for k, v in self.headers.items()}, "body": "",
                "conn": self.conn_id, "conn_seq": self.conn_seq, "t": self.t_start,
                "wall": self.wall_start, "active": 0, "proxied": True,
                "proxy_auth": "proxy-authorization" in {k.lower() for k in self.headers.keys()},
            })
            if host not in ("127.0.0.1", "localhost") or not port.isdigit():
                self.respond(403, b"only loopback tunnels", (), "text/plain")
                return
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                self.respond(502, b"cannot connect", (), "text/plain")
                return
            self.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            sockets = [self.connection, upstream]
            try:
                while True:
                    readable, _, _ = select.select(sockets, [], [], 30)
                    if not readable:
                        break
                    for sock in readable:
                        data = sock.recv(65536)
                        if not data:
                            return
                        (upstream if sock is self.connection else self.connection).sendall(data)
            finally:
                upstream.close()
        finally:
            with state.lock:
                state.active -= 1

    def __getattr__(self, name):
        # handle_one_request looks up do_<METHOD>; accept every method.
        if name.startswith("do_"):
            return self.dispatch
        raise AttributeError(name)

    def read_body(self):
        """Read the request body: Content-Length or chunked."""
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            parts = []
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    break
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Skip trailers up to the empty line.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)  # CRLF after the chunk data
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def wait(self, seconds):
        """Sleep up to `seconds`; return early if the client goes away.

        Ending early keeps `active` honest and frees the thread when a client
        times out on a delayed or hanging request. A client that only shuts
        down its sending side also counts as gone.
        """
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            try:
                readable, _, _ = select.select([self.connection], [], [], remaining)
                if not readable:
                    continue
                if self.connection.recv(1, socket.MSG_PEEK) == b"":
                    return False  # EOF: client closed
            except (OSError, ValueError):
                return False
            # Data arrived (a pipelined request): we cannot watch for EOF any
            # more without busy-looping, so just sleep out the rest.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return True

    def answering(self):
        """The request's record says when its handler last began to send
        (``t_answer``): a request the client makes once it has the answer
        arrives after that, so ``max_active`` does not count the two as
        handled at once, however late this thread gets to run again."""
        rec = getattr(self, "rec", None)
        if rec is not None:
            with self.server.state.lock:  # /_log serializes the records under it
                rec["t_answer"] = time.monotonic()

    def write(self, data):
        self.answering()
        self.wfile.write(data)

    def head(self, status, headers):
        """Status line + headers (list of (name, value)), not yet flushed."""
        self.send_response_only(status)
        for name, value in headers:
            # send_header also sets close_connection on "Connection: close".
            self.send_header(name, value)
        self.answering()
        self.end_headers()

    def respond(self, status, body=b"", headers=(), content_type=None):
        headers = list(headers)
        names = {n.lower() for n, _ in headers}
        if content_type and "content-type" not in names:
            headers.append(("Content-Type", content_type))
        if "content-length" not in names and "transfer-encoding" not in names:
            headers.append(("Content-Length", str(len(body))))
        if self.close_connection and "connection" not in names:
            headers.append(("Connection", "close"))
        # end_headers flushes the header buffer; send the body right after.
        self.head(status, headers)
        if self.command != "HEAD" and body:
            self.write(body)

    def respond_json(self, status, obj, headers=()):
        body = json.dumps(obj).encode("ascii")
        self.respond(status, body, headers, "application/json")

    def close_now(self, rst=False):
        """Close the TCP connection from inside the handler."""
        self.answering()
        self.close_connection = True
        if rst:
            # Linger {on, 0}: close() discards everything and sends RST.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            # rfile holds a reference to the socket (makefile); close it first
            # or socket.close() would not really close the descriptor. The
            # later shutdown/close by socketserver then fail harmlessly.
            self.rfile.close()
            self.connection.close()

    # --- request dispatch ---------------------------------------------

    def dispatch(self):
        state = self.server.state
        raw_path = self.path
        proxied = raw_path.startswith("http://")
        if proxied:  # absolute form: the client takes us for its proxy
            raw_path = "/" + raw_path.split("/", 3)[3] if raw_path.count("/") >= 3 else "/"
        path, _, query = raw_path.partition("?")
        self.rec = None
        body = self.read_body()

        if path.startswith("/_"):
            self.control(path, query, body)
            return

        headers = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = headers[key] + ", " + value if key in headers else value

        with state.lock:
            state.active += 1
            active = state.active
        try:
            rec = {
                "seq": None,  # set by state.record
                "path": path,
                "query": query,
                "method": self.command,
                "headers": headers,
                "body": body.decode("latin-1"),
                "t": self.t_start,
                "wall": self.wall_start,
                "conn": self.conn_id,
                "conn_seq": self.conn_seq,
                "active": active,
                "proxied": proxied,
                "proxy_auth": "proxy-authorization" in headers,
            }
            self.rec = rec
            step = state.record(rec)
            if step is not None:
                self.scripted(step)
            elif path in state.limits:
                self.limited(state.limits[path], rec)
            elif path in state.llm:
                llm_mock.serve(self, state.llm[path], body)
            elif path == "/echo":
                self.respond_json(200, {
                    "method": self.command, "path": path, "query": query,
                    "headers": headers, "body": rec["body"],
                })
            elif path == "/api" or path.startswith("/api/"):
                self.api(path, rec["seq"])
            else:
                self.respond(200, b"ok", (), "text/plain")
        finally:
            with state.lock:
                state.active -= 1

    # --- control endpoints --------------------------------------------

    def control(self, path, query, body):
        state = self.server.state
        try:
            if path == "/_script" and self.command == "POST":
                spec = read_json(body)
                steps = validate_script(spec)
                with state.lock:
                    state.scripts[spec["path"]] = {"steps": steps, "next": 0}
                self.respond_json(200, {"ok": True})
            elif path == "/_log" and self.command == "GET":
                want = parse_qs(query).get("path", [None])[0]
                with state.lock:
                    recs = [r for r in state.log if want is None or r["path"] == want]
                    out = json.dumps(recs)  # a list: "[]" when empty
                self.respond(200, out.encode("ascii"), (), "application/json")
            elif path == "/_limit" and self.command == "POST":
                spec = read_json(body)
                bucket = validate_limit(spec)
                with state.lock:
                    state.limits[spec["path"]] = bucket
                self.respond_json(200, {"ok": True})
            elif path == "/_limit" and self.command == "GET":
                self.counts_of(state.limits, query, "limit",
                               lambda bucket: {"ok": bucket["ok"], "limited": bucket["limited"]})
            elif path == "/_llm" and self.command == "POST":
                spec = read_json(body)
                mock = llm_mock.validate(spec)
                with state.lock:
                    state.llm[spec["path"]] = mock
                self.respond_json(200, {"ok": True})
            elif path == "/_llm" and self.command == "GET":
                self.counts_of(state.llm, query, "llm limits", lambda mock: mock.counts())
            elif path == "/_reset" and self.command == "POST":
                state.reset()
                self.respond_json(200, {"ok": True})
            else:
                self.respond_json(404, {"ok": False, "error": "no such control endpoint: %s %s" % (self.command, path)})
        except ValueError as e:  # includes json.JSONDecodeError
            self.respond_json(400, {"ok": False, "error": str(e)})

    def counts_of(self, registry, query, what, counts):
        """Answers what the limit set on ?path= counted (counts(limit), made
        under the state's lock), or 404."""
        state = self.server.state
        want = parse_qs(query).get("path", [None])[0]
        with state.lock:
            limit = registry.get(want)
            out = counts(limit) if limit is not None else None
        if out is None:
            self.respond_json(404, {"ok": False, "error": "no %s on %s" % (what, want)})
        else:
            self.respond_json(200, out)

    # --- scripted responses --------------------------------------------

    def scripted(self, step):
        action = step.get("action", "respond")
        delay = float(step.get("delay", 0))
        status = int(step.get("status", 302 if action == "redirect" else 200))
        body = step_bytes(step.get("body", ""))
        headers = []
        for name, value in (step.get("headers") or {}).items():
            values = value if isinstance(value, list) else [value]
            headers.extend((name, str(v)) for v in values)
        codings = step.get("encoding") or []
        if isinstance(codings, str):
            codings = [codings]
        stream_coder = None
        if action == "stream" and codings:
            # Each chunk compressed as it goes out, flushed (Z_SYNC_FLUSH),
            # so that a client can decode it before the next one comes.
            stream_coder = compressor(codings[0])
        elif "zeros" in step:
            body = encode_zeros(codings, int(step["zeros"]))
        else:
            for coding in codings:
                body = encode(coding, body)
        if codings:
            headers.append(("Content-Encoding", ", ".join(CODING_NAMES.get(c, c) for c in codings)))
        if "cut" in step:
            # The encoded body less its last `cut` bytes, sent with a
            # Content-Length that matches: a truncated body that only its
            # decoder can tell.
            body = body[:max(0, len(body) - int(step["cut"]))]

        if action == "hang":
            self.wait(float(step.get("delay", 3600)))
            self.close_now()
            return

        if delay > 0 and not self.wait(delay):
            self.close_now()  # client gave up while we were waiting
            return

        if action == "drop":
            self.close_now()
        elif action == "reset":
            self.close_now(rst=True)
        elif action == "garbage":
            self.write(b"this is not http\r\n\r\n")
            self.close_now()
        elif action == "slow":
            interval = float(step.get("interval", 1))
            self.head(status, headers + [("Content-Length", str(len(body)))])
            if self.command != "HEAD":
                for i in range(len(body)):
                    time.sleep(interval)
                    self.write(body[i:i + 1])
        elif action == "reset_body":
            # Headers and the first `sent` bytes (default: half) of a body
            # whose Content-Length promises all of it, then a TCP RST.
            sent = int(step.get("sent", len(body) // 2))
            self.head(status, headers + [("Content-Length", str(len(body)))])
            self.write(body[:sent])
            self.wfile.flush()
            time.sleep(0.05)  # let the partial body leave before the RST
            self.close_now(rst=True)
        elif action == "raw":
            # The body's bytes, as they are, for the whole answer (status
            # line and headers included); then the connection closes.
            self.write(body)
            self.close_now()
        elif action == "truncate":
            self.head(status, headers + [("Content-Length", str(len(body) + 1000))])
            self.write(body)
            self.close_now()
        elif action == "stream":
            self.head(status, headers + [("Transfer-Encoding", "chunked")])
            self.wfile.flush()
            for pause, text in step.get("chunks", []):
                if pause > 0 and not self.wait(float(pause)):
                    return
                data = step_bytes(text)
                if stream_coder is not None:
                    data = stream_coder.compress(data) + stream_coder.flush(zlib.Z_SYNC_FLUSH)
                self.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            end = step.get("end", "finish")
            if end == "reset":
                time.sleep(0.05)
                self.close_now(rst=True)
            elif end == "hang":
                self.wait(3600)
                self.close_now()
            else:
                if stream_coder is not None and end != "unfinished":
                    data = stream_coder.flush()
                    self.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.write(b"0\r\n\r\n")
        elif action == "endless":
            self.endless(status, headers, step)
        elif action == "chunked_forever":
            interval = float(step.get("interval", 0.2))
            self.head(status, headers + [("Transfer-Encoding", "chunked")])
            # Ends when a write fails because the client went away.
            while True:
                self.write(b"6\r\nchunk\n\r\n")
                time.sleep(interval)
        else:  # respond, redirect
            if action == "redirect":
                headers.append(("Location", str(step.get("location", "/"))))
            self.respond(status, body, headers)

    def endless(self, status, headers, step):
        """A chunked body that goes on until the client leaves (or ``cap``)."""
        data = step_bytes(step["body"]) if step.get("body") else b"x" * 65536
        interval = float(step.get("interval", 0))
        cap = int(step.get("cap", 1 << 30))
        chunk = b"%x\r\n%s\r\n" % (len(data), data)
        rec = self.rec
        sent, gone = 0, False
        try:
            self.head(status, headers + [("Transfer-Encoding", "chunked")])
            self.wfile.flush()
            while sent < cap:
                if interval > 0 and not self.wait(interval):
                    gone = True
                    break
                self.write(chunk)
                self.wfile.flush()
                sent += len(data)
            else:
                self.write(b"0\r\n\r\n")
        except OSError:  # CLIENT_GONE and the like: the client went away
            gone = True
        with self.server.state.lock:
            rec["sent"], rec["gone"] = sent, gone
        if gone:
            self.close_now()

    # --- demo rate-limited API ----------------------------------------

    def limited(self, bucket, rec):
        if "window" in bucket:
            self.windowed(bucket, rec)
            return
        with self.server.state.lock:
            now = time.monotonic()
            bucket["tokens"] = min(bucket["burst"], bucket["tokens"] + (now - bucket["at"]) * bucket["rate"])
            bucket["at"] = now
            allowed = bucket["tokens"] >= 1.0
            if allowed:
                bucket["tokens"] -= 1.0
            bucket["ok" if allowed else "limited"] += 1
            rec["limited"] = not allowed
        if allowed:
            self.respond(200, b"ok", (), "text/plain")
        else:
            headers = [("Retry-After", bucket["retry_after"])] if bucket["retry_after"] is not None else []
            self.respond(429, b"slow down", headers, "text/plain")

    def windowed(self, w, rec):
        with self.server.state.lock:
            now = time.time()
            if w["reset_at"] <= now:
                w["hits"], w["reset_at"] = 0, now + w["window"]
            w["hits"] += 1
            allowed = w["hits"] <= w["limit"]
            w["ok" if allowed else "limited"] += 1
            rec["limited"] = not allowed
            headers = window_headers(w, now, allowed)
        if allowed:
            self.respond(200, b"ok", headers, "text/plain")
        else:
            self.respond(429, b"Too many requests, please try again later.", headers, "text/plain")

    def api(self, path, seq):
        args = self.server.state.args
        allowed, tokens, wait, fail = self.server.state.take_token()
        limit = ("x-ratelimit-limit", num_str(args.api_capacity))
        if not allowed:
            self.respond_json(429, {"ok": False, "error": "rate limited"}, [
                ("Retry-After", str(max(1, math.ceil(wait)))),
                limit,
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", str(math.ceil(time.time() + wait))),
            ])
        elif fail:
            self.respond_json(503, {"ok": False, "error": "unavailable"})
        else:
            self.respond_json(200, {"ok": True, "path": path, "n": seq}, [
                limit,
                ("x-ratelimit-remaining", str(math.floor(tokens))),
            ])


def read_json(body):
    # surrogateescape: step bodies may hold arbitrary bytes (see step_bytes).
    return json.loads(body.decode("utf-8", "surrogateescape"))


# A step's encoding: the coding names a step may give, and what each sends
# as its Content-Encoding ("deflate-raw" is deflate without the zlib
# wrapper, which some servers send and clients accept as "deflate").
CODINGS = ("gzip", "deflate", "deflate-raw", "br", "zstd")
CODING_NAMES = {"deflate-raw": "deflate"}
STREAM_CODINGS = ("gzip", "deflate", "deflate-raw")


def compressor(coding):
    """A zlib compressor for a coding of STREAM_CODINGS."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "deflate-raw": -zlib.MAX_WBITS}[coding]
    return zlib.compressobj(6, zlib.DEFLATED, wbits)


def encode(coding, body):
    """body compressed with one coding of CODINGS."""
    if coding in STREAM_CODINGS:
        c = compressor(coding)
        return c.compress(body) + c.flush()
    # Python's standard library has neither br nor zstd: Debian's brotli
    # and zstd commands (make deps installs them).
    command = ["brotli", "-c"] if coding == "br" else ["zstd", "-c", "-q"]
    return subprocess.run(command, input=body, stdout=subprocess.PIPE, check=True).stdout


def encode_zeros(codings, n):
    """n zero bytes compressed with codings (a bomb), made a MiB at a time:
    never n bytes in memory."""
    if not codings:
        return bytes(n)
    first, rest = codings[0], codings[1:]
    if first in STREAM_CODINGS:
        c, zeros, parts = compressor(first), bytes(1 << 20), []
        for at in range(0, n, len(zeros)):
            parts.append(c.compress(zeros[:min(len(zeros), n - at)]))
        parts.append(c.flush())
        body = b"".join(parts)
    else:
        command = "head -c %d /dev/zero | %s" % (n, "brotli -c" if first == "br" else "zstd -c -q")
        body = subprocess.run(["sh", "-c", command], stdout=subprocess.PIPE, check=True).stdout
    for coding in rest:
        body = encode(coding, body)
    return body


def validate_script(spec):
    """Check a /_script payload; return its steps. Raises ValueError."""
    if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
        raise ValueError("script needs a string 'path'")
    steps = spec.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ValueError("script needs a non-empty 'steps' array")
    for i, step in enumerate(steps, 1):
        if not isinstance(step, dict):
            raise ValueError("step %d is not an object" % i)
        action = step.get("action", "respond")
        if action not in ACTIONS:
            raise ValueError("step %d: unknown action %r" % (i, action))
        if not isinstance(step.get("body", ""), str):
            raise ValueError("step %d: body must be a string" % i)
        if not isinstance(step.get("headers") or {}, dict):
            raise ValueError("step %d: headers must be an object" % i)
        codings = step.get("encoding") or []
        codings = [codings] if isinstance(codings, str) else codings
        for coding in codings:
            if coding not in CODINGS:
                raise ValueError("step %d: unknown encoding %r (one of %s)" % (i, coding, ", ".join(CODINGS)))
        if action == "stream" and codings and (len(codings) != 1 or codings[0] not in STREAM_CODINGS):
            raise ValueError("step %d: a stream's encoding is one of %s" % (i, ", ".join(STREAM_CODINGS)))
        for key in ("status", "delay", "interval", "sent", "cap", "cut", "zeros"):
            if key in step:
                float(step[key])  # raises ValueError if not a number
    return steps


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # listen backlog: bursts of many connections
    allow_reuse_address = True
    tls = None  # an ssl.SSLContext when serving HTTPS

    def finish_request(self, request, client_address):
        # The TLS handshake in the connection's own thread, as a real server
        # does it: done in accept() (a wrapped listening socket), it served
        # the handshakes of a burst of connections one after another.
        if self.tls is not None:
            request = self.tls.wrap_socket(request, server_side=True)
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, CLIENT_GONE) or (isinstance(exc, OSError) and exc.errno == 9):
            return  # client went away, or we closed the socket on purpose
        if isinstance(exc, ssl.SSLError):
            return  # a handshake the client refused (a certificate it rejects)
        super().handle_error(request, client_address)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--api-capacity", type=float, default=5.0)
    p.add_argument("--api-rate", type=float, default=5.0)
    p.add_argument("--api-fail", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", help="require a client certificate signed by this CA (PEM)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="exit when the parent process dies (so a crashed "
                        "test run never leaves a server behind)")
    args = p.parse_args()

    # os._exit: handler threads may be sleeping or blocked; never wait for them.
    def die(*_):
        os._exit(0)
    signal.signal(signal.SIGTERM, die)
    signal.signal(signal.SIGINT, die)

    httpd = Server(("127.0.0.1", args.port), Handler)
    httpd.state = State(args)
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(args.tls_client_ca)
        httpd.tls = ctx

    if args.exit_with_parent:
        parent = os.getppid()

        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(0)
        threading.Thread(target=watch, daemon=True).start()

    print("listening %d %d" % (httpd.server_address[1], os.getpid()), flush=True)
    httpd.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    main()
