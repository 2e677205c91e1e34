"""A stand-in OpenAI-compatible streaming server for the serving tests (stdlib only, starts in ~50 ms).

It honours flags like a real server and can misbehave on purpose::

    python standin_server.py --port 30001 --tokens-per-second 200 --startup-delay 0.5
        [--ttft-ms 5] [--max-running-requests N] [--context-length N] [--crash-after S] [--hang]
        [--oom-at-start] [--oom-under-load] [--print-argv FILE] [--reject-field NAME ...] [--slot-log FILE]
        [--stall-request K --stall-ms MS] [--cancel-on-new] [--ignore-eos-ignored N] [--no-usage]
        [--tokens-per-chunk K] [--slow-first N --slow-first-ms MS] [--pid-file FILE]

Each request streams ``max_tokens`` tokens, one SSE chunk each, at exactly ``--tokens-per-second`` per request
(paced against the request's own start, so the rate does not drift). With ``--max-running-requests N`` at most N
requests stream at a time, the others wait in arrival order (a FIFO queue of N slots); ``--slot-log`` appends one
line per request, the seconds it waited for a slot and held it, so a test knows the service time the queue ran at.
``--stall-request K`` (repeatable) makes the K-th completion request (1-based, counting every one the server got,
the warm-up's included) wait ``--stall-ms`` more for its first token, holding its slot: one slow request (a long
prefill, a busy host's stall).
The misbehaviours of real servers, each an option: ``--cancel-on-new`` ends every stream in flight when a new
request arrives (no token more, the stream just ends); ``--ignore-eos-ignored N`` accepts ``ignore_eos`` and stops
after N tokens anyway; ``--no-usage`` streams no token counts, and ``--tokens-per-chunk K`` puts K tokens (``tok``
words) in one text chunk; ``--slow-first N`` makes the first N requests slower to their first token, the first by
``--slow-first-ms`` and each next one by less (a cold server warming up). The last token's chunk carries
``finish_reason: length`` (``--no-finish-reason``: none); a stream cut by ``--cancel-on-new`` ends with ``[DONE]``
alone (no finish_reason, no usage), as a server cancelling a stream does. ``--empty-text-every K`` sends every K-th
token's chunk with empty text, ``--empty-answer-every K`` answers every K-th request with one empty-text token and
``finish_reason: stop``, ``--stream-token-ids`` puts each chunk's token ids in it.
``/health`` answers 503 until the start-up delay is over, then 200; ``--hang`` never becomes ready. An unknown flag
is an argparse error (``unrecognized arguments``, exit 2), like SGLang.

A request with ``stream: false`` gets one JSON answer whose completion is a deterministic function of its prompt
(token i is a hash of the prompt and i; the text is the tokens as words), with ``token_ids`` when it asks for
``return_token_ids`` (SGLang's field): what the greedy check compares. ``--quantize`` stands in for a knob that
changes numbers: it serves 1.3x faster, and for every prompt of an even number of characters its completion
diverges at token ``max_tokens // 2`` (so a greedy check of those prompts agrees on half their tokens).
"""

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="stand-in OpenAI-compatible server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", default="standin")
    p.add_argument("--tokens-per-second", type=float, default=1000.0)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--max-running-requests", type=int, default=0)
    p.add_argument(
        "--context-length",
        type=int,
        default=0,
        help="a cap; above 65536 tokens/s halve (like the indexer cost in the seed)",
    )
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e4m3", "bf16"], default="auto")
    p.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    p.add_argument("--enable-fast-path", action="store_true")
    p.add_argument("--crash-after", type=float, default=None, help="exit with a traceback S seconds after ready")
    p.add_argument("--hang", action="store_true", help="never become ready")
    p.add_argument("--oom-at-start", action="store_true")
    p.add_argument("--oom-under-load", action="store_true")
    p.add_argument("--print-argv", default=None, help="write sys.argv as JSON to this file")
    p.add_argument("--slot-log", default=None, help="append `waited_s held_s` per request to this file")
    p.add_argument(
        "--batch-slowdown",
        type=float,
        default=0.0,
        help="a batch shares the decode: with N running, each streams at rate / (1 + X (N - 1))",
    )
    p.add_argument(
        "--quantize",
        action="store_true",
        help="1.3x faster, and greedy completions of even-length prompts diverge half-way",
    )
    p.add_argument(
        "--spawn-worker",
        default=None,
        help="start a worker process in the server's group that ignores "
        "SIGTERM (as a busy GPU worker may) and write its pid to this file",
    )
    p.add_argument(
        "--stall-request",
        type=int,
        action="append",
        default=[],
        help="the K-th completion request (1-based, warm-up included) waits --stall-ms more for its first token",
    )
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument(
        "--reject-field",
        action="append",
        default=[],
        help="answer HTTP 422 to a request carrying this field (a strict server, e.g. ignore_eos)",
    )
    p.add_argument(
        "--cancel-on-new",
        action="store_true",
        help="a new completion request ends every stream in flight at once, without a token more (a "
        "server that cancels in-flight streams on a new request)",
    )
    p.add_argument(
        "--ignore-eos-ignored",
        type=int,
        default=0,
        metavar="N",
        help="accept ignore_eos but stop every completion after N tokens (a model reaching EOS)",
    )
    p.add_argument("--no-usage", action="store_true", help="never send token counts (usage) in a stream")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="stream this many tokens in one text chunk")
    p.add_argument(
        "--slow-first",
        type=int,
        default=0,
        metavar="N",
        help="the first N completion requests wait --slow-first-ms more for their first token (a cold "
        "server: compiling, caches filling)",
    )
    p.add_argument("--slow-first-ms", type=float, default=300.0)
    p.add_argument(
        "--ignore-token-ids",
        action="store_true",
        help="accept return_token_ids and send no token ids (a server ignoring the field)",
    )
    p.add_argument("--pid-file", default=None, help="write the server's pid to this file when ready")
    p.add_argument(
        "--empty-text-every",
        type=int,
        default=0,
        metavar="K",
        help="every K-th token chunk carries empty text (a token with no printable text of its own)",
    )
    p.add_argument(
        "--empty-answer-every",
        type=int,
        default=0,
        metavar="K",
        help="every K-th completion request generates one token with empty text, then finish_reason stop",
    )
    p.add_argument(
        "--stream-token-ids",
        action="store_true",
        help="each chunk carries its token ids (`token_ids`), the server's own token information",
    )
    p.add_argument("--no-finish-reason", action="store_true", help="never send a finish_reason")
    p.add_argument(
        "--sigkill-self-after",
        type=float,
        default=None,
        metavar="S",
        help="S seconds after ready, SIGKILL itself (a kill from outside the tuner: an operator, a job)",
    )
    p.add_argument(
        "--die-on-request",
        type=int,
        default=None,
        metavar="N",
        help="the N-th completion request's connection is reset, and --die-delay-s later the server SIGKILLs itself "
        "(a crash seen by a client before the process has exited)",
    )
    p.add_argument("--die-delay-s", type=float, default=0.3)
    return p.parse_args(argv)


class Server:
    def __init__(self, args):
        self.args = args
        self.ready = False
        self.started = time.monotonic()
        rate = args.tokens_per_second
        if args.context_length and args.context_length > 65536:
            rate /= 2
        if args.enable_fast_path:
            rate *= 1.5
        if args.quantize:
            rate *= 1.3
        self.rate = rate
        self.sem = asyncio.Semaphore(args.max_running_requests) if args.max_running_requests else None
        self.requests = 0
        self.running = 0
        self.generation = 0
        """Bumped by every completion request with --cancel-on-new: a stream of an older generation stops."""

    async def handle(self, reader, writer):
        try:
            request_line = await reader.readline()
            if not request_line:
                return
            method, path, _ = request_line.decode().split(" ", 2)
            headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            if path in ("/health", "/v1/models") and method == "GET":
                if not self.ready:
                    await self.respond(writer, 503, {"status": "starting"})
                elif path == "/health":
                    await self.respond(writer, 200, {"status": "ok"})
                else:
                    await self.respond(writer, 200, {"object": "list", "data": [{"id": self.args.model_path}]})
            elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                await self.stream(writer, json.loads(body or b"{}"), chat=path.endswith("chat/completions"))
            else:
                await self.respond(writer, 404, {"error": "not found"})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def respond(self, writer, code, obj):
        data = json.dumps(obj).encode()
        reason = {200: "OK", 404: "Not Found", 422: "Unprocessable Entity", 503: "Service Unavailable"}.get(
            code, "Error"
        )
        writer.write(
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def stream(self, writer, req, chat):
        if not self.ready:
            await self.respond(writer, 503, {"error": "not ready"})
            return
        unexpected = sorted(set(req) & set(self.args.reject_field))
        if unexpected:
            await self.respond(writer, 422, {"detail": f"Unexpected fields in the request: {set(unexpected)}"})
            return
        self.requests += 1
        if self.args.die_on_request is not None and self.requests == self.args.die_on_request:
            writer.transport.abort()  # the client sees a reset connection now, the process goes a moment later
            await asyncio.sleep(self.args.die_delay_s)
            os.kill(os.getpid(), 9)
        if req.get("stream") is False:
            await self.respond(writer, 200, self.completion(req, chat))
            return
        if self.args.oom_under_load and self.requests == 1:
            print("Traceback (most recent call last):", flush=True)
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        n = int(req.get("max_tokens") or 16)
        if self.args.ignore_eos_ignored:
            n = min(n, self.args.ignore_eos_ignored)
        stall = self.args.stall_ms / 1000 if self.requests in self.args.stall_request else 0.0
        if self.requests <= self.args.slow_first:  # slowest first, then less and less: a server warming up
            stall += self.args.slow_first_ms / 1000 * (self.args.slow_first - self.requests + 1) / self.args.slow_first
        self.generation += 1
        generation = self.generation
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Connection: close\r\n\r\n"
        )
        arrived = time.monotonic()
        counted = False
        if self.sem is not None:
            await self.sem.acquire()
        try:
            start = time.monotonic()
            if self.args.ttft_ms or stall:
                await asyncio.sleep(self.args.ttft_ms / 1000 + stall)
            first = time.monotonic()
            self.running += 1
            counted = True
            due = first
            per_chunk = max(1, self.args.tokens_per_chunk)
            sent = 0
            cut = False
            empty_answer = bool(self.args.empty_answer_every) and self.requests % self.args.empty_answer_every == 0
            if empty_answer:
                n = 1
            for i in range(n):
                if self.args.cancel_on_new and self.generation != generation:
                    cut = True
                    break  # a newer request came: this stream ends here
                sent += 1
                if self.args.batch_slowdown:
                    # a batch shares the decode: more running requests, more tokens in all, fewer for each
                    if i:
                        due += (1 + self.args.batch_slowdown * (self.running - 1)) / self.rate
                    delay = due - time.monotonic()
                else:
                    # token i is due at first + i / rate: pace against the start, not the previous token
                    delay = first + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if sent % per_chunk and i < n - 1:
                    continue  # several tokens to one chunk: the chunk goes with its last token
                k = sent % per_chunk or per_chunk
                words = "tok " * k
                if empty_answer or (self.args.empty_text_every and sent % self.args.empty_text_every == 0):
                    words = ""
                choice = {"index": 0, "delta": {"content": words}} if chat else {"index": 0, "text": words}
                if self.args.stream_token_ids:
                    choice["token_ids"] = list(range(sent - k, sent))
                if i == n - 1 and not self.args.no_finish_reason:
                    choice["finish_reason"] = "stop" if empty_answer else "length"
                event = {
                    "id": "x",
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "choices": [choice],
                }
                writer.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                await writer.drain()
            if not self.args.no_usage and not cut:
                usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": sent}}
                writer.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
            if self.args.slot_log:
                with open(self.args.slot_log, "a") as f:
                    f.write(f"{start - arrived:.6f} {time.monotonic() - start:.6f}\n")
        finally:
            self.running -= counted
            if self.sem is not None:
                self.sem.release()

    def completion(self, req, chat):
        """The deterministic greedy completion of the request's prompt (see the module docstring)."""
        prompt = req.get("prompt")
        if chat:
            prompt = "\n".join(str(m.get("content", "")) for m in req.get("messages") or [])
        prompt = str(prompt or "")
        n = int(req.get("max_tokens") or 16)
        ids = [int(hashlib.sha256(f"{prompt}|{i}".encode()).hexdigest()[:6], 16) % 1000 for i in range(n)]
        if self.args.quantize and len(prompt) % 2 == 0:
            ids = ids[: n // 2] + [(t + 1) % 1000 for t in ids[n // 2 :]]
        text = "".join(f" w{t}" for t in ids)
        choice = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        if req.get("return_token_ids") and not self.args.ignore_token_ids:
            choice["token_ids"] = ids
        return {
            "id": "x",
            "object": "chat.completion" if chat else "text_completion",
            "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
        }


async def main_async(args):
    server = Server(args)
    srv = await asyncio.start_server(server.handle, args.host, args.port, reuse_address=True, backlog=512)
    print(f"stand-in listening on {args.host}:{args.port}", flush=True)
    if args.oom_at_start:
        print("Traceback (most recent call last):", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 GiB", flush=True)
        sys.exit(1)
    if args.hang:
        await asyncio.Event().wait()
    if args.startup_delay:
        await asyncio.sleep(args.startup_delay)
    server.ready = True
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(str(os.getpid()))
    print("The server is fired up and ready to roll!", flush=True)
    if args.sigkill_self_after is not None:
        await asyncio.sleep(args.sigkill_self_after)
        os.kill(os.getpid(), 9)
    if args.crash_after is not None:
        await asyncio.sleep(args.crash_after)
        print("Traceback (most recent call last):", flush=True)
        print("RuntimeError: stand-in crashed on purpose", flush=True)
        os._exit(1)
    async with srv:
        await srv.serve_forever()


def main():
    args = parse_args()
    if args.spawn_worker:
        import subprocess

        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, sys, time; signal.signal(signal.SIGTERM, "
                "signal.SIG_IGN); open(sys.argv[1], 'w').write(str(__import__('os').getpid())); "
                "time.sleep(3600)",
                args.spawn_worker,
            ]
        )
    if args.print_argv:
        with open(args.print_argv, "w") as f:
            json.dump(sys.argv, f)
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
