"""The rate limits of two LLM APIs, as their rate-limit pages describe them.

Used by server.py (``POST /_llm``); standard library only. Each model of a
mocked path has its own limits, kept as continuously refilled token buckets
that hold ``hold`` seconds of each per-minute limit (both providers say a
per-minute limit may be enforced over shorter intervals).

* ``openai`` (``/v1/chat/completions``): requests (RPM) and tokens (TPM).
  A request is counted against TPM when it is admitted, as the prompt's
  characters / 4 plus ``max_tokens`` (or ``max_completion_tokens``, else the
  model's ``default_max_tokens``), times ``n``, and never corrected.
  Every answer has ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``,
  the reset as a Go duration ("1s", "6m0s": the time until the bucket is
  full again).
* ``anthropic`` (``/v1/messages``): requests (RPM), input tokens (ITPM) and
  output tokens (OTPM). The input is counted at admission as the server
  tokenizes it (characters / ``chars_per_token``), ``max_tokens`` against
  OTPM; when the answer ends, what it did not use is given back to OTPM.
  Every answer has ``anthropic-ratelimit-{requests,input-tokens,
  output-tokens,tokens}-{limit,remaining,reset}``, the reset in RFC 3339.

A refused request gets 429 with ``retry-after`` (whole seconds, rounded up)
and the provider's error body, and takes nothing from any bucket.

An answer uses a share of its ``max_tokens`` between ``use_min`` and
``use_max``, drawn from a hash of the request's body (the same request
always uses the same), and is written at ``speed`` tokens a second (0: at
once), each token as ``output_chars`` characters of text (1 unless given;
4 is the providers' rule of thumb, which a client estimating a broken
stream's output from its text reads back). With ``"stream": true`` in the request it is sent as the provider's
server-sent events: OpenAI's chunks (with the usage chunk when
``stream_options.include_usage`` asks), Anthropic's ``message_start`` ...
``message_delta`` (the output's usage) ``message_stop``.

``GET /_llm?path=`` answers, by model: ``ok`` and ``limited`` (requests),
``counted`` (tokens counted per limit, corrections included), ``used``
(input and output tokens the answers reported) and ``first`` / ``last``
(the server's monotonic seconds of the first and last admission).
"""

import datetime
import hashlib
import json
import math
import threading
import time

PROVIDERS = {
    "openai": ("requests", "tokens"),
    "anthropic": ("requests", "input_tokens", "output_tokens"),
}
# The configuration's name of each limit, per minute.
LIMIT_OPTION = {"requests": "rpm", "tokens": "tpm", "input_tokens": "itpm", "output_tokens": "otpm"}


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def validate(spec):
    """Check a /_llm payload; return the path's mock. Raises ValueError."""
    if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
        raise ValueError("llm: needs a path")
    provider = spec.get("provider")
    if provider not in PROVIDERS:
        raise ValueError("llm: provider must be one of %s" % ", ".join(sorted(PROVIDERS)))
    models = spec.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError("llm: models must name at least one model")
    hold = spec.get("hold", 60)
    if not _positive(hold) or hold > 60:
        raise ValueError("llm: hold must be a number of seconds in (0, 60]")
    for name in ("use_min", "use_max"):
        v = spec.get(name, 0.1 if name == "use_min" else 1.0)
        if not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ValueError("llm: %s must be in (0, 1]" % name)
    for name in ("speed", "chars_per_token", "default_max_tokens", "output_chars"):
        v = spec.get(name)
        if v is not None and not (_positive(v) or (name == "speed" and v == 0)):
            raise ValueError("llm: %s must be a positive number" % name)
    return LLMMock(spec)


def go_duration(seconds):
    """OpenAI's reset: a Go duration such as 1s, 250ms or 6m0s."""
    if seconds < 1:
        return "%dms" % math.ceil(seconds * 1000)
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return "%dm%ds" % (minutes, secs) if minutes else "%ds" % secs


def rfc3339(seconds_from_now):
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _text_of(content):
    """The characters of a message's content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class Bucket:
    """A continuously refilled bucket of `hold` seconds of a per-minute limit."""

    def __init__(self, per_minute, hold):
        self.limit = float(per_minute)
        self.rate = self.limit / 60.0
        self.capacity = self.rate * hold
        self.level = self.capacity
        self.at = time.monotonic()

    def refill(self, now):
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_for(self, cost):
        """Seconds until `cost` fits (inf when it never can)."""
        if cost > self.capacity:
            return math.inf
        return max(0.0, (cost - self.level) / self.rate)

    def until_full(self):
        return (self.capacity - self.level) / self.rate


class LLMMock:
    def __init__(self, spec):
        self.provider = spec["provider"]
        self.limits = PROVIDERS[self.provider]
        self.hold = float(spec.get("hold", 60))
        self.use_min = float(spec.get("use_min", 0.1))
        self.use_max = float(spec.get("use_max", 1.0))
        self.speed = float(spec.get("speed") or 0)
        self.chars_per_token = float(spec.get("chars_per_token") or 4)
        self.default_max_tokens = int(spec.get("default_max_tokens") or 4096)
        self.output_chars = int(spec.get("output_chars") or 1)
        self.lock = threading.Lock()
        self.models = {}
        for model, limits in spec["models"].items():
            buckets = {}
            for limit in self.limits:
                per_minute = limits.get(LIMIT_OPTION[limit]) if isinstance(limits, dict) else None
                if not _positive(per_minute):
                    raise ValueError("llm: model %s needs a positive %s" % (model, LIMIT_OPTION[limit]))
                buckets[limit] = Bucket(per_minute, self.hold)
            self.models[model] = {
                "buckets": buckets, "ok": 0, "limited": 0, "first": None, "last": None,
                "counted": {limit: 0 for limit in self.limits},
                "used": {"input": 0, "output": 0},
            }

    # --- what a request costs ------------------------------------------

    def _request_text(self, req):
        parts = []
        system = req.get("system")
        if system is not None:
            parts.append(_text_of(system))
        for message in req.get("messages") or []:
            if isinstance(message, dict):
                parts.append(_text_of(message.get("content")))
        return "".join(parts)

    def _max_tokens(self, req):
        for name in ("max_tokens", "max_completion_tokens"):
            v = req.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return self.default_max_tokens

    def _output(self, body, max_tokens):
        """The tokens the answer uses: a share of max_tokens from the body's hash."""
        h = int.from_bytes(hashlib.sha256(body).digest()[:8], "big") / 2.0 ** 64
        share = self.use_min + (self.use_max - self.use_min) * h
        return max(1, int(round(max_tokens * share)))

    def costs(self, req):
        """What admission takes from each limit, and what the answer will hold."""
        chars = len(self._request_text(req))
        max_tokens = self._max_tokens(req)
        n = req.get("n", 1) if self.provider == "openai" else 1
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        if self.provider == "openai":
            prompt = math.ceil(chars / 4)
            return {"requests": 1, "tokens": (prompt + max_tokens) * n}, prompt, max_tokens, n
        tokens_in = max(1, math.ceil(chars / self.chars_per_token))
        return {"requests": 1, "input_tokens": tokens_in, "output_tokens": max_tokens}, tokens_in, max_tokens, n

    # --- admission and its correction ----------------------------------

    def admit(self, model, costs):
        """(True, headers) with the costs taken, or (False, headers, wait, limit)."""
        m = self.models[model]
        with self.lock:
            now = time.monotonic()
            for b in m["buckets"].values():
                b.refill(now)
            waits = {limit: m["buckets"][limit].wait_for(costs[limit]) for limit in self.limits}
            binding = max(waits, key=lambda k: waits[k])
            if waits[binding] > 0:
                m["limited"] += 1
                return False, self._headers(m), waits[binding], binding
            for limit in self.limits:
                m["buckets"][limit].level -= costs[limit]
                m["counted"][limit] += costs[limit]
            m["ok"] += 1
            m["first"] = now if m["first"] is None else m["first"]
            m["last"] = now
            return True, self._headers(m), 0, None

    def settle(self, model, output_taken, output_used, tokens_in):
        """The end of an answer: Anthropic gives back the output not used."""
        m = self.models[model]
        with self.lock:
            m["used"]["input"] += tokens_in
            m["used"]["output"] += output_used
            if self.provider == "anthropic":
                b = m["buckets"]["output_tokens"]
                b.refill(time.monotonic())
                back = output_taken - output_used
                b.level = min(b.capacity, b.level + back)
                m["counted"]["output_tokens"] -= back

    def _headers(self, m):
        out = []
        b = m["buckets"]
        if self.provider == "openai":
            for limit in self.limits:
                out += [("x-ratelimit-limit-" + limit, "%d" % b[limit].limit),
                        ("x-ratelimit-remaining-" + limit, "%d" % max(0, math.floor(b[limit].level))),
                        ("x-ratelimit-reset-" + limit, go_duration(b[limit].until_full()))]
            return out
        for limit in self.limits:
            name = "anthropic-ratelimit-" + limit.replace("_", "-")
            out += [(name + "-limit", "%d" % b[limit].limit),
                    (name + "-remaining", "%d" % max(0, math.floor(b[limit].level))),
                    (name + "-reset", rfc3339(b[limit].until_full()))]
        # tokens: the most restrictive of input and output
        tight = min(("input_tokens", "output_tokens"), key=lambda k: b[k].level)
        out += [("anthropic-ratelimit-tokens-limit", "%d" % b[tight].limit),
                ("anthropic-ratelimit-tokens-remaining", "%d" % max(0, math.floor(b[tight].level))),
                ("anthropic-ratelimit-tokens-reset", rfc3339(b[tight].until_full()))]
        return out

    def counts(self):
        with self.lock:
            return {model: {k: m[k] for k in ("ok", "limited", "counted", "used", "first", "last")}
                    for model, m in self.models.items()}

    # --- answers --------------------------------------------------------

    def refusal(self, model, wait, limit):
        """The 429's body and retry-after."""
        retry = "%d" % max(1, math.ceil(wait)) if wait != math.inf else "60"
        if self.provider == "openai":
            body = {"error": {"message": "Rate limit reached for %s on %s per min. Please try again in %.3fs."
                              % (model, limit, wait if wait != math.inf else 60),
                              "type": limit, "param": None, "code": "rate_limit_exceeded"}}
        else:
            body = {"type": "error", "error": {"type": "rate_limit_error",
                                               "message": "This request would exceed the rate limit for %s "
                                                          "of your organization for model %s." % (limit, model)}}
        return retry, body

    def answer_body(self, model, tokens_in, used, n):
        if self.provider == "openai":
            return {"id": "chatcmpl-mock", "object": "chat.completion", "model": model,
                    "choices": [{"index": i, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "x" * (used * self.output_chars)}}
                                for i in range(n)],
                    "usage": {"prompt_tokens": tokens_in, "completion_tokens": used * n,
                              "total_tokens": tokens_in + used * n}}
        return {"id": "msg_mock", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": "x" * (used * self.output_chars)}], "stop_reason": "end_turn",
                "usage": {"input_tokens": tokens_in, "output_tokens": used}}

    def stream_events(self, model, tokens_in, used, include_usage):
        """The answer's server-sent events, as (tokens written so far, bytes)."""
        def sse(data, event=None):
            head = ("event: %s\n" % event) if event else ""
            return (head + "data: " + json.dumps(data) + "\n\n").encode("utf-8")
        pieces = max(1, min(used, 8))
        sizes = [used // pieces + (1 if i < used % pieces else 0) for i in range(pieces)]
        if self.provider == "openai":
            yield 0, sse({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": model,
                          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            written = 0
            for size in sizes:
                written += size
                yield written, sse({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": model,
                                    "choices": [{"index": 0, "delta": {"content": "x" * (size * self.output_chars)}}]})
            yield written, sse({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": model,
                                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if include_usage:
                yield written, sse({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": model,
                                    "choices": [], "usage": {"prompt_tokens": tokens_in, "completion_tokens": used,
                                                             "total_tokens": tokens_in + used}})
            yield written, b"data: [DONE]\n\n"
            return
        yield 0, sse({"type": "message_start", "message": {
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": [],
            "usage": {"input_tokens": tokens_in, "output_tokens": 1}}}, "message_start")
        yield 0, sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                     "content_block_start")
        written = 0
        for size in sizes:
            written += size
            yield written, sse({"type": "content_block_delta", "index": 0,
                                "delta": {"type": "text_delta", "text": "x" * (size * self.output_chars)}}, "content_block_delta")
        yield written, sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        yield written, sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                            "usage": {"output_tokens": used}}, "message_delta")
        yield written, sse({"type": "message_stop"}, "message_stop")


def serve(handler, mock, body):
    """Answers one request to a mocked path (handler: server.py's Handler)."""
    try:
        req = json.loads(body.decode("utf-8"))
    except ValueError:
        req = None
    if not isinstance(req, dict) or not isinstance(req.get("model"), str):
        handler.respond_json(400, {"error": {"message": "the body must be a JSON object with a model"}})
        return
    model = req["model"]
    if model not in mock.models:
        handler.respond_json(404, {"error": {"message": "no such model: %s" % model}})
        return
    costs, tokens_in, max_tokens, n = mock.costs(req)
    admitted, headers, wait, limit = mock.admit(model, costs)
    with handler.server.state.lock:
        handler.rec["limited"] = not admitted
    if not admitted:
        retry, err = mock.refusal(model, wait, limit)
        handler.respond_json(429, err, headers + [("retry-after", retry)])
        return
    used = min(mock._output(body, max_tokens), max_tokens)
    taken = costs.get("output_tokens", 0)
    written = 0
    settled = False

    # Settled before the answer's last bytes go out, so that a client that
    # has read it finds it counted; a broken answer is settled too, with
    # what it wrote as what it used.
    def settle(output):
        nonlocal settled
        if not settled:
            settled = True
            mock.settle(model, taken, output, tokens_in)

    try:
        if req.get("stream") is True:
            include_usage = isinstance(req.get("stream_options"), dict) and \
                req["stream_options"].get("include_usage") is True
            handler.head(200, headers + [("Content-Type", "text/event-stream"),
                                         ("Transfer-Encoding", "chunked")])
            for so_far, data in mock.stream_events(model, tokens_in, used, include_usage):
                if mock.speed > 0 and so_far > written and not handler.wait((so_far - written) / mock.speed):
                    return
                written = so_far
                handler.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            settle(written)
            handler.write(b"0\r\n\r\n")
        else:
            if mock.speed > 0 and not handler.wait(used / mock.speed):
                return
            written = used
            settle(written)
            handler.respond_json(200, mock.answer_body(model, tokens_in, used, n), headers)
    finally:
        settle(written)
