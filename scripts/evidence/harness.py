"""Shared pieces of the evidence scripts (fuzz.py, chaos.py): a vhost of
their own on the local broker, the services as processes, and an
independent status subscriber. Standard library + pika only."""
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
import urllib.parse
import subprocess
import threading
import time
import uuid

import pika

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("FRONTDESK_BIN", os.path.join(REPO, ".build", "debug"))
BASE = os.environ.get("FRONTDESK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5682/%2f")
ROUTES = os.path.join(REPO, "Shared", "FrontDeskModel", "Resources", "routes.example.json")


def ctl(*args):
    """rabbitmqctl against the local broker (or, with FRONTDESK_CLUSTER=1, node 1 of the local cluster)."""
    command = ["bash", os.path.join(REPO, "scripts", "broker.sh"), "ctl"]
    if os.environ.get("FRONTDESK_CLUSTER") == "1":
        command = ["bash", os.path.join(REPO, "scripts", "cluster.sh"), "ctl", "1"]
    subprocess.run([*command, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Vhost:
    """A fresh vhost, deleted on exit."""

    def __init__(self, label):
        self.name = f"frontdesk-{label}-{uuid.uuid4().hex[:6]}"
        ctl("add_vhost", self.name)
        ctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        self.url = ",".join(u.rsplit("/", 1)[0] + "/" + self.name for u in BASE.split(","))

    def delete(self):
        try:
            ctl("delete_vhost", self.name)
        except subprocess.CalledProcessError:
            pass


class Service:
    """One service process that can be killed and started again."""

    def __init__(self, executable, url, port, log_dir, extra_env=None):
        self.executable, self.url, self.port, self.log_dir = executable, url, port, log_dir
        self.extra_env = extra_env or {}
        self.process = None
        self.starts = 0

    def start(self):
        # FRONTDESK_TEST_LOG_LEVEL: the services' level (warning unless set; CI keeps info).
        env = dict(os.environ, AMQP_URL=self.url, FRONTDESK_HTTP_PORT=str(self.port), FRONTDESK_ROUTES=ROUTES,
                   FRONTDESK_LOG_LEVEL=os.environ.get("FRONTDESK_TEST_LOG_LEVEL", "warning"), **self.extra_env)
        log = open(os.path.join(self.log_dir, f"{self.executable}-{self.port}.log"), "ab")
        self.process = subprocess.Popen([os.path.join(BIN, self.executable)], env=env, stdout=log, stderr=log)
        self.starts += 1

    def kill9(self):
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                # Past the services' 20 s grace, so that a stop that hangs leaves
                # its "grace period over" line in the log; before their 5 s last
                # deadline, every thread's stack beside it (gdb, if there is one).
                return self.process.wait(timeout=22)
            except subprocess.TimeoutExpired:
                self.dump_threads()
            try:
                return self.process.wait(timeout=8)
            except subprocess.TimeoutExpired:
                self.process.kill()
                return None
        return self.process.returncode if self.process else None

    def dump_threads(self):
        """Every thread's stack of a process that does not stop, into <executable>-<port>.threads.txt."""
        if not shutil.which("gdb") or self.process.poll() is not None:
            return
        path = os.path.join(self.log_dir, f"{self.executable}-{self.port}.threads.txt")
        with open(path, "wb") as out:
            try:
                subprocess.run(["gdb", "-p", str(self.process.pid), "-batch", "-ex", "thread apply all bt 40"],
                               stdout=out, stderr=subprocess.STDOUT, timeout=60)
            except subprocess.TimeoutExpired:
                pass

    def crashed(self):
        """True when the process ended on its own (not by us) with a signal or error."""
        return self.process is not None and self.process.poll() not in (None, 0)


def free_port():
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port):
    """A service's /readyz answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def metric(port, name):
    """The value of an unlabelled metric on a service's /metrics, or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
    except OSError:
        return None
    return None


def wait(what, condition, timeout=30.0, every=0.05):
    """Polls `condition()` until it is truthy; raises with `what` at the deadline."""
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def user_of(url):
    """The login of an AMQP URL: what a producer may set as its user_id."""
    return urllib.parse.unquote(urllib.parse.urlparse(url).username or "guest")


def connect(url, attempts=60):
    """`url` may list several nodes of a cluster, comma-separated: pika tries each in turn."""
    for i in range(attempts):
        try:
            return pika.BlockingConnection([pika.URLParameters(u + "?heartbeat=30") for u in url.split(",")])
        except pika.exceptions.AMQPConnectionError:
            if i == attempts - 1:
                raise
            time.sleep(0.5)


class StatusSubscriber(threading.Thread):
    """Reads every status event from a durable quorum queue of its own (so a
    broker restart loses nothing) and keeps each dispatch's history."""

    def __init__(self, url, queue="evidence.status"):
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.lock = threading.Lock()
        self.events = {}  # id -> [(seq, state, event, seen_at)]
        self.stopping = False
        connection = connect(url)
        channel = connection.channel()
        channel.exchange_declare("frontdesk.status", "topic", durable=True)
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(queue, "frontdesk.status", "status.#")
        connection.close()

    def run(self):
        while not self.stopping:
            try:
                connection = connect(self.url)
                channel = connection.channel()
                channel.basic_qos(prefetch_count=500)
                for method, properties, body in channel.consume(self.queue, inactivity_timeout=0.5):
                    if self.stopping:
                        break
                    if method is None:
                        continue
                    event = json.loads(body)
                    with self.lock:
                        self.events.setdefault(event["dispatchId"], []).append(
                            (event["seq"], event["state"], event, time.time()))
                    channel.basic_ack(method.delivery_tag)
                connection.close()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.5)

    def snapshot(self):
        with self.lock:
            return {k: list(v) for k, v in self.events.items()}

    def terminal(self, ids):
        snap = self.snapshot()
        return sum(1 for i in ids if any(s in ("replied", "failed", "cancelled") for _, s, _, _ in snap.get(i, [])))


def check_histories(snapshot, ids, late=None):
    """Every id: exactly one terminal state, nothing after it, seq only growing.
    Returns (tallies, problems). With `late` (a list), an event that arrives
    after a higher seq of its dispatch is noted there instead of counted as
    a problem (surfaces drop it, as the contract says; it happens when a
    publisher's window is cut by a node failure and published again)."""
    tallies = {"replied": 0, "failed": 0, "cancelled": 0, "lost": 0}
    problems = []
    for i in ids:
        history = snapshot.get(i, [])
        # Re-published events (same seq, same state) are duplicates a surface drops.
        distinct = sorted({(seq, state) for seq, state, _, _ in history})
        terminals = [(seq, state) for seq, state in distinct if state in ("replied", "failed", "cancelled")]
        if not terminals:
            tallies["lost"] += 1
            problems.append(f"{i}: no terminal state (saw {distinct})")
            continue
        if len({state for _, state in terminals}) > 1 or len(terminals) > 1:
            problems.append(f"{i}: {len(terminals)} terminal events {terminals}; all: {distinct}")
        tallies[terminals[0][1]] += 1
        last_seq = terminals[-1][0]
        after = [(seq, state) for seq, state in distinct if seq > last_seq]
        if after:
            problems.append(f"{i}: events after the terminal one: {after}")
        seqs = [seq for seq, _ in distinct]
        if len(seqs) != len(set(seqs)):
            problems.append(f"{i}: one seq with two states: {distinct}")
        # In arrival order every new event has a higher seq than all before it
        # (a re-sent event, same seq and state, is a duplicate surfaces drop).
        seen, highest = set(), 0
        for seq, state, _, _ in history:
            if (seq, state) in seen:
                continue
            if seq <= highest:
                (late if late is not None else problems).append(f"{i}: seq went from {highest} to {seq} ({state})")
            seen.add((seq, state))
            highest = max(highest, seq)
    return tallies, problems
