#!/usr/bin/env python3
"""Gateway benchmark: N open event streams (default 1,000), each on its own
dispatch, and the latency of a status event to its client, against a
baseline measured in the same run: the same events read straight from the
broker by an AMQP subscriber bound to frontdesk.status (what the gateway
adds on top of the fan-out). Also the gateway's memory per open stream.

  1. N dispatches are posted to the gateway for a target without agents
     (they wait, queued); N streams are opened, one per dispatch; the
     gateway's RSS before and after gives the memory per stream.
  2. Steady: half the dispatches are cancelled at --rate a second (one
     `cancelled` event each).
  3. Burst: an instant agent for the target comes online: every other
     dispatch is delivered and replies, two events each, all at once.
  4. For each event: arrival at its SSE client and at the AMQP subscriber,
     minus the event's own `at` (set when the sender published it).

Prints p50/p99 of both, their ratio, and the memory figures; exit 1 if
events went missing.

    python3 Benchmarks/GatewayBench/gateway_bench.py [--streams 1000]
"""
import argparse
import hashlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "evidence"))
import harness  # noqa: E402

USERS = 25  # 40 streams each, as many users' phones and tabs would hold


def token(i):
    return f"bench-token-{i % USERS}"


free_port = harness.free_port


def at_ms(event):
    return datetime.strptime(event["at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=None).timestamp() * 1000 - time.timezone * 1000


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else float("nan")


def delay_buckets(port):
    """The gateway's own histogram: from an event's `at` to the gateway reading it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("frontdesk_gateway_event_delay_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[le] = float(line.split()[-1])
    return out


def bucket_percentile(before, after, p):
    counts = [(float("inf") if le == "+Inf" else float(le), after[le] - before.get(le, 0)) for le in after]
    counts.sort()
    total = counts[-1][1] if counts else 0
    for le, c in counts:
        if total and c >= p * total:
            return le * 1000
    return float("nan")


def post(port, body, i):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/dispatches", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token(i)}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status


class Streams(threading.Thread):
    """N SSE clients on non-blocking sockets, one thread; records each event's arrival."""

    def __init__(self, port, ids):
        super().__init__(daemon=True)
        self.selector = selectors.DefaultSelector()
        self.arrivals = {}  # (id, seq) -> (arrival ms, event)
        self.buffers = {}
        self.open = 0
        self.lock = threading.Lock()
        for i, dispatch_id in enumerate(ids):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"GET /v1/dispatches/{dispatch_id}/events HTTP/1.0\r\nAuthorization: Bearer {token(i)}\r\n\r\n".encode())
            s.setblocking(False)
            self.selector.register(s, selectors.EVENT_READ, dispatch_id)
            self.buffers[s] = b""
            self.open += 1

    def run(self):
        while self.open:
            for key, _ in self.selector.select(timeout=1):
                s = key.fileobj
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                now = time.time() * 1000
                if not chunk:
                    self.selector.unregister(s)
                    s.close()
                    self.open -= 1
                    continue
                buffer = self.buffers[s] + chunk
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    data = b"\n".join(line[6:] for line in block.split(b"\n") if line.startswith(b"data: "))
                    if data:
                        event = json.loads(data)
                        with self.lock:
                            self.arrivals[(event["dispatchId"], event["seq"])] = (now, event)
                self.buffers[s] = buffer


class Direct(threading.Thread):
    """The baseline: an AMQP subscriber on frontdesk.status."""

    def __init__(self, url, routing_key):
        super().__init__(daemon=True)
        self.connection = harness.connect(url)
        self.channel = self.connection.channel()
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.channel.queue_bind(self.queue, "frontdesk.status", routing_key)
        self.arrivals = {}

    def run(self):
        def on_message(channel, method, properties, body):
            now = time.time() * 1000
            event = json.loads(body)
            self.arrivals[(event["dispatchId"], event["seq"])] = (now, event)
        self.channel.basic_consume(self.queue, on_message, auto_ack=True)
        try:
            self.channel.start_consuming()
        except Exception:  # noqa: BLE001 - the connection is closed at the end
            pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=200, help="cancels a second in the steady phase")
    args = parser.parse_args()
    n = args.streams
    log_dir = tempfile.mkdtemp(prefix="frontdesk-gwbench-")
    vhost = harness.Vhost("gwbench")
    tokens = os.path.join(log_dir, "tokens.json")
    with open(tokens, "w") as f:
        json.dump({hashlib.sha256(token(i).encode()).hexdigest(): f"u-bench-{i}" for i in range(USERS)}, f)
    gw_port = free_port()
    gateway = harness.Service("frontdesk-gateway", vhost.url, free_port(), log_dir,
                              {"FRONTDESK_GATEWAY_PORT": str(gw_port), "FRONTDESK_GATEWAY_TOKENS": tokens})
    services = [harness.Service("frontdesk-router", vhost.url, free_port(), log_dir),
                harness.Service("frontdesk-sender", vhost.url, free_port(), log_dir), gateway]
    agent = None
    direct = None
    ok = True
    try:
        for s in services:
            s.start()
        harness.wait("the gateway to be ready", lambda: harness.ready(gateway.port))
        ids = [f"gb-{i}" for i in range(n)]
        for i, dispatch_id in enumerate(ids):
            post(gw_port, {"id": dispatch_id, "input": "review the contract", "project": "acme", "target": "legal"}, i)
        time.sleep(1)  # let the last posts' events settle before the memory baseline
        before = rss_kib(gateway.process.pid)
        streams = Streams(gw_port, ids)
        streams.start()
        deadline = time.time() + 60
        while len(streams.arrivals) < 3 * n and time.time() < deadline:  # drafted, routing, queued each
            time.sleep(0.1)
        after = rss_kib(gateway.process.pid)
        read_before = delay_buckets(gateway.port)
        direct = Direct(vhost.url, "status.acme.legal.*")
        direct.start()
        time.sleep(0.5)
        start_count = len(streams.arrivals)
        publisher = harness.connect(vhost.url)
        commands = publisher.channel()
        steady_ids = ids[: n // 2]
        begin = time.time()
        for k, dispatch_id in enumerate(steady_ids):
            delay = begin + k / args.rate - time.time()
            if delay > 0:
                time.sleep(delay)
            commands.basic_publish("frontdesk.commands", "dispatch.cancel", json.dumps({"id": dispatch_id, "reason": "bench"}).encode())
        deadline = time.time() + 30
        while sum(1 for v in streams.arrivals.values() if v[1]["state"] == "cancelled") < len(steady_ids) and time.time() < deadline:
            time.sleep(0.1)
        publisher.close()
        agent = subprocess.Popen([os.path.join(harness.BIN, "frontdesk"), "agent", "--target", "acme/legal", "--instant"],
                                 env=dict(os.environ, AMQP_URL=vhost.url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while streams.open and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        read_after = delay_buckets(gateway.port)
        live = {k: v for k, v in streams.arrivals.items() if v[1]["state"] in ("sending", "replied", "cancelled")}

        def latencies(states):
            sse, base = [], []
            for key, (arrived, event) in live.items():
                if event["state"] in states and key in direct.arrivals:
                    sse.append(arrived - at_ms(event))
                    base.append(direct.arrivals[key][0] - at_ms(event))
            return sse, base
        missing = sum(1 for k in direct.arrivals if k not in streams.arrivals)
        replied = sum(1 for v in streams.arrivals.values() if v[1]["state"] in ("replied", "cancelled"))
        print(f"gateway-bench: {n} streams open, {start_count} history events replayed, {len(live)} live events, "
              f"{replied} ended, {streams.open} streams still open, {missing} events the streams missed")
        print(f"gateway-bench: memory: gateway RSS {before / 1024:.1f} MiB before the streams, {after / 1024:.1f} MiB with them: "
              f"{(after - before) / max(1, n):.1f} KiB per stream")
        for label, states in [(f"steady, {args.rate}/s", ("cancelled",)), ("burst", ("sending", "replied"))]:
            sse, base = latencies(states)
            p50s, p99s, p50b, p99b = percentile(sse, 0.5), percentile(sse, 0.99), percentile(base, 0.5), percentile(base, 0.99)
            print(f"gateway-bench: {label}: status event → client over {len(sse)} events: SSE via the gateway p50 {p50s:.1f} ms, "
                  f"p99 {p99s:.1f} ms; AMQP subscriber (baseline) p50 {p50b:.1f} ms, p99 {p99b:.1f} ms; "
                  f"ratio p50 {p50s / max(p50b, 0.001):.2f}, p99 {p99s / max(p99b, 0.001):.2f}")
        print(f"gateway-bench: inside the gateway, event at → read from the broker: p50 ≤ {bucket_percentile(read_before, read_after, 0.5):.1f} ms, "
              f"p99 ≤ {bucket_percentile(read_before, read_after, 0.99):.1f} ms (histogram bucket bounds)")
        if missing or replied < n or streams.open:
            ok = False
    finally:
        if agent:
            agent.terminate()
            agent.wait()
        if direct:
            try:
                direct.connection.add_callback_threadsafe(direct.channel.stop_consuming)
            except Exception:  # noqa: BLE001
                pass
        for s in services:
            s.stop()
        vhost.delete()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
