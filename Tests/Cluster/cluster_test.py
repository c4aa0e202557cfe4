#!/usr/bin/env python3
"""Front Desk on the local 3-node RabbitMQ cluster (scripts/cluster.sh): the
router, two sender replicas and the agents get every node's address in
AMQP_URL. In the middle of a run of dispatches, kill -9 the node with the
most of the services' connections, bring it back, then kill another; then
kill the node that holds the sender's leadership lock and keep it down until
a dispatch sent after that kill has replied (at most 40 s). With
`--partitions 4 --senders 1,2,4` the sender's work is split by route and the
run starts with one sender replica, adds a second at 30% of the run and two
more at 55%, while the nodes are killed; at the end the replicas must lead
every partition once. Checks: every dispatch ends in exactly one terminal state, nothing is lost,
nothing follows the end, one state per seq. Events that arrive after a higher
seq of their dispatch are counted and printed, not failed: when a node dies
under the router's window, the router publishes its events again after the
sender's (surfaces drop them, as the contract says).

    python3 Tests/Cluster/cluster_test.py [--dispatches 900] [--rate 30] [--partitions 4 --senders 1,2,4]

Starts the cluster if it does not run (and stops it after).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(REPO, "scripts", "cluster.sh")
os.environ["FRONTDESK_CLUSTER"] = "1"
os.environ["FRONTDESK_TEST_AMQP_URL"] = ",".join(f"amqp://guest:guest@127.0.0.1:{p}/%2f" for p in (5691, 5692, 5693))
sys.path.insert(0, os.path.join(REPO, "scripts", "evidence"))
import harness  # noqa: E402
import pika  # noqa: E402

TARGETS = [("yemaya", "board-prep"), ("acme", "ops")]
# Seconds the cluster is whole before the node lost for good is killed.
SETTLE_BEFORE_LOSS = 10
# With four partitions: one target in each (partitions 0, 1, 2 and 3 of the example table).
PARTITIONED_TARGETS = [("yemaya", "board-prep"), ("acme", "legal"), ("yemaya", "fundraising"), ("home", "family")]


def cluster(*args):
    return subprocess.run(["bash", CLUSTER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


class Agent(threading.Thread):
    """Always online, answering at once; reconnects to any node when its node goes."""

    def __init__(self, url, target):
        super().__init__(daemon=True)
        self.url, self.target, self.stopping = url, target, False

    def run(self):
        queue = "frontdesk.agent." + ".".join(self.target)
        while not self.stopping:
            try:
                connection = harness.connect(self.url, attempts=4)
                channel = connection.channel()
                channel.basic_qos(prefetch_count=50)
                for method, properties, body in channel.consume(queue, inactivity_timeout=0.2):
                    if self.stopping:
                        break
                    if method is None:
                        continue
                    task = json.loads(body)
                    channel.basic_publish("", properties.reply_to or "frontdesk.replies", json.dumps({
                        "dispatchId": task["dispatchId"], "attempt": task["attempt"], "kind": "final", "text": "done"}).encode(),
                        pika.BasicProperties(delivery_mode=2, content_type="application/json", correlation_id=task["dispatchId"]))
                    channel.basic_ack(method.delivery_tag)
                connection.close()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.3)


def connections_by_node(vhost):
    """How many of the vhost's connections each node holds (by the node's AMQP port), the services'
    alarm probes (which carry no work) left out."""
    for n in (1, 2, 3):
        out = subprocess.run(["bash", CLUSTER, "ctl", str(n), "list_connections", "vhost", "port", "client_properties", "--silent"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            continue
        counts = {}
        for line in out.stdout.splitlines():
            parts = line.split("\t", 2)
            if len(parts) == 3 and parts[0] == vhost and parts[1].isdigit() and "(alarm probe)" not in parts[2]:
                node = int(parts[1]) - 5690
                counts[node] = counts.get(node, 0) + 1
        return counts
    return {}


def partitions_led(service):
    """How many partitions a sender replica says it leads (its metrics), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{service.port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("frontdesk_sender_partitions_led "):
                    return int(float(line.split()[1]))
    except (OSError, ValueError):
        return None
    return None


def lock_node(vhost):
    """The node holding the sender's leadership lock (frontdesk.sender.lock, partition 0's), or None."""
    for n in (1, 2, 3):
        out = subprocess.run(["bash", CLUSTER, "ctl", str(n), "list_queues", "-p", vhost, "name", "pid", "--silent"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            continue
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "frontdesk.sender.lock" and "frontdesk-c" in parts[1]:
                return int(parts[1].split("frontdesk-c", 1)[1][0])
    return None


def queue_snapshot(vhost, nodes):
    """Each queue's type, leader, members and online members, and the streams'
    writers and offsets, as one of `nodes` says: for a takeover that is slow."""
    lines = [f"queues and streams at {time.strftime('%H:%M:%S')}"]
    for n in nodes:
        out = subprocess.run(["bash", CLUSTER, "ctl", str(n), "list_queues", "-p", vhost, "name", "type", "leader",
                              "members", "online", "messages", "--silent"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            continue
        lines += out.stdout.splitlines()
        for stream in ("frontdesk.status.log", "frontdesk.router.decisions", "frontdesk.sender.commands"):
            st = subprocess.run(["bash", CLUSTER, "streams", str(n), "stream_status", "-p", vhost, stream,
                                 "--formatter", "json", "--silent"], capture_output=True, text=True, timeout=60)
            lines.append(f"{stream}: {(st.stdout or st.stderr).strip()}")
        break
    return lines


def kill(node, which, kills, begin):
    """kill -9 `node`; a kill that did not happen is noted as failed (the run then fails)."""
    result = cluster("kill", str(node))
    if result.returncode != 0:
        kills.append((f"{which}: FAILED", node, result.stderr.strip()[-200:], round(time.time() - begin, 1)))


def back(node, which, kills, begin):
    """Every node running again; a start that failed is noted as failed (the run then fails)."""
    result = cluster("start")
    if result.returncode != 0:
        kills.append((f"{which}: FAILED", node, result.stderr.strip()[-200:], round(time.time() - begin, 1)))
    else:
        kills.append((which, node, None, round(time.time() - begin, 1)))


def chaos(vhost, begin, kills, first_at, gap, url, status, down_result, snapshot):
    """Kill -9 the node with the most of the run's connections, bring it back,
    then another; then kill the node that holds the sender's leadership lock
    and keep it down until a dispatch sent after the kill has replied."""
    time.sleep(max(0, begin + first_at - time.time()))
    spared = set()
    for which in ("first", "second"):
        counts = connections_by_node(vhost)
        node = max((n for n in (1, 2, 3) if n not in spared), key=lambda n: counts.get(n, 0))
        kill(node, which, kills, begin)
        kills.append((which, node, counts.get(node, 0), round(time.time() - begin, 1)))
        spared.add(node)
        time.sleep(2)
        back(node, f"{which} back", kills, begin)  # every node running before the next
        time.sleep(gap)
    # A node lost for good: RabbitMQ keeps its consumers as "suspected down",
    # so nothing may wait for them (the sender's leadership once did).
    # First the node brought back last gets time to catch up. (The router's
    # publishes were once nacked for 42 s after a kill 2.8 s after a restart;
    # with this wait it happened again once: the cause is still open.)
    time.sleep(SETTLE_BEFORE_LOSS)
    node = lock_node(vhost) or 1
    kill(node, "third", kills, begin)
    killed_at = time.time()
    kills.append(("third, kept down", node, "holds the lock", round(killed_at - begin, 1)))
    probe = "cl-while-down"
    body = json.dumps({"id": probe, "input": "sent while a node is down", "project": TARGETS[0][0], "target": TARGETS[0][1]}).encode()
    deadline = killed_at + 40
    while time.time() < deadline and not down_result:
        try:
            connection = harness.connect(url)
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("frontdesk.commands", "dispatch.request", body,
                                  pika.BasicProperties(content_type="application/json", delivery_mode=2))
            connection.close()
            break
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(0.5)
    snapshot_at = killed_at + 20
    while time.time() < deadline:
        history = status.snapshot().get(probe, [])
        if any(state == "replied" for _, state, _, _ in history):
            down_result.append(round(time.time() - killed_at, 1))
            break
        if snapshot_at and time.time() >= snapshot_at:
            # Slow: what the broker says of the vhost's queues while the node is still down.
            snapshot_at = None
            snapshot.extend(queue_snapshot(vhost, [n for n in (1, 2, 3) if n != node]))
        time.sleep(0.2)
    back(node, "third back", kills, begin)


def dump_status_log(url, ids, path):
    """What the status log stream says of `ids` (a failure's dispatches), written
    to `path` and returned as lines: each entry's type, message id and, for a
    status event, seq and state. Tells whether a lost or repeated event was in
    the log a new sender leader reads."""
    wanted, lines = set(ids), []
    # The senders' heartbeats would keep an inactivity timeout from ever
    # passing: the caller stops the services first, and this bounds the read.
    deadline = time.time() + 90
    try:
        connection = harness.connect(url)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        for method, properties, body in channel.consume("frontdesk.status.log", arguments={"x-stream-offset": "first"},
                                                        inactivity_timeout=3):
            if method is None or time.time() > deadline:
                if method is not None:
                    lines.append("(stopped reading the status log after 90 s)")
                break
            channel.basic_ack(method.delivery_tag)
            mid = properties.message_id or ""
            seq = state = None
            try:
                event = json.loads(body)
                dispatch = event.get("dispatchId") if isinstance(event, dict) else None
                if dispatch in wanted:
                    seq, state = event.get("seq"), event.get("state")
            except ValueError:
                dispatch = None
            if dispatch in wanted or mid.split("/")[0] in wanted or (properties.correlation_id or "") in wanted:
                lines.append(f"{mid} type={properties.type} user={properties.user_id} rk={method.routing_key} seq={seq} state={state}")
        connection.close()
    except (pika.exceptions.AMQPError, OSError) as e:
        lines.append(f"(reading the status log failed: {e})")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatches", type=int, default=900)
    parser.add_argument("--rate", type=float, default=30)
    parser.add_argument("--partitions", type=int, default=1, help="FRONTDESK_SENDER_PARTITIONS")
    parser.add_argument("--senders", default="2", help="sender replicas: N from the start, or 1,2,4 to grow during the run")
    args = parser.parse_args()
    steps = [int(n) for n in args.senders.split(",")]
    targets = PARTITIONED_TARGETS if args.partitions == 4 else TARGETS
    started = cluster("status").returncode != 0
    if started:
        result = cluster("start")
        if result.returncode != 0:
            print("cluster: cannot start the local cluster:", result.stderr[-500:])
            sys.exit(1)
    logs = tempfile.mkdtemp(prefix="frontdesk-cluster-")
    vhost = harness.Vhost("cluster")
    env = {"FRONTDESK_RETRY_BASE_MS": "200", "FRONTDESK_RETRY_MAX_MS": "2000", "FRONTDESK_REPLY_TIMEOUT_S": "10",
           "FRONTDESK_MAX_ATTEMPTS": "20", "FRONTDESK_SENDER_PARTITIONS": str(args.partitions)}
    senders = [harness.Service("frontdesk-sender", vhost.url, 9502 + i, logs, env) for i in range(steps[-1])]
    services = [harness.Service("frontdesk-router", vhost.url, 9501, logs, env)] + senders
    agents, failed = [], False
    try:
        for s in services[:1 + steps[0]]:
            s.start()
        time.sleep(3)  # let the services declare the topology before the subscriber binds
        status = harness.StatusSubscriber(vhost.url)
        status.start()
        agents = [Agent(vhost.url, t) for t in targets]
        for a in agents:
            a.start()
        ids = [f"cl-{i}" for i in range(args.dispatches)]
        kills = []
        begin = time.time()
        down_result, snapshot = [], []
        killer = threading.Thread(
            target=chaos,
            args=(vhost.name, begin, kills, args.dispatches / args.rate * 0.2, 2, vhost.url, status, down_result, snapshot),
            daemon=True)
        killer.start()
        # More sender replicas during the run: at 30% and 55% of it.
        growth = list(zip([0.30, 0.55], steps[1:]))
        publisher = harness.connect(vhost.url)
        channel = publisher.channel()
        channel.confirm_delivery()
        for k, dispatch_id in enumerate(ids):
            delay = begin + k / args.rate - time.time()
            if delay > 0:
                time.sleep(delay)
            if growth and k >= growth[0][0] * len(ids):
                _, count = growth.pop(0)
                for s in senders:
                    if s.process is None and sum(1 for x in senders if x.process is not None) < count:
                        s.start()
                kills.append((f"senders now {count}", None, None, round(time.time() - begin, 1)))
            target = targets[k % len(targets)]
            body = json.dumps({"id": dispatch_id, "input": f"cluster run {k}", "project": target[0], "target": target[1]}).encode()
            while True:  # the same id again after a failure: the router de-duplicates
                try:
                    channel.basic_publish("frontdesk.commands", "dispatch.request", body,
                                          pika.BasicProperties(content_type="application/json", delivery_mode=2))
                    break
                except (pika.exceptions.AMQPError, OSError):
                    time.sleep(0.2)
                    try:
                        publisher = harness.connect(vhost.url)
                        channel = publisher.channel()
                        channel.confirm_delivery()
                    except (pika.exceptions.AMQPError, OSError):
                        pass
        killer.join(timeout=180)
        deadline = time.time() + 240
        while status.terminal(ids) < len(ids) and time.time() < deadline:
            time.sleep(0.5)
        late = []
        tallies, problems = harness.check_histories(status.snapshot(), ids, late=late)
        crashed = [s.executable for s in services if s.crashed()]
        shared = True
        if args.partitions > 1:
            # Every partition led once by the replicas, evenly, once they have settled.
            settle = time.time() + 30
            led = []
            while time.time() < settle:
                led = [partitions_led(s) for s in senders]
                if None not in led and sum(led) == args.partitions and max(led) - min(led) <= 1:
                    break
                time.sleep(0.5)
            shared = None not in led and sum(led) == args.partitions and max(led) - min(led) <= 1
            print(f"cluster: {args.partitions} partitions over {len(senders)} sender replicas, led {led}"
                  + ("" if shared else " — NOT each partition once, evenly"))
        print(f"cluster: {len(ids)} dispatches at {args.rate}/s over 3 nodes; kills (which, node, its connections, at s): {kills}")
        print(f"cluster: {tallies}; problems: {len(problems)}; services that exited on their own: {crashed or 'none'}")
        print(f"cluster: events that arrived after a higher seq of their dispatch (surfaces drop them): {len(late)} "
              f"{late[:3] if late else ''}")
        for p in problems[:10]:
            print("  " + p)
        if problems:
            for s in services:  # nothing more is written to the log while it is read
                s.stop()
            bad = [p.split(":", 1)[0] for p in problems[:10]]
            for line in dump_status_log(vhost.url, bad, os.path.join(logs, "status-log.txt"))[:60]:
                print("  log: " + line)
        print("cluster: with the lock's node kept down, a dispatch sent after the kill replied "
              + (f"{down_result[0]} s after the kill" if down_result else "NOT within 40 s"))
        if snapshot:
            with open(os.path.join(logs, "queues.txt"), "w") as f:
                f.write("\n".join(snapshot) + "\n")
            for line in snapshot:
                print("  " + line)
        failed_steps = [k for k in kills if "FAILED" in k[0]]
        if failed_steps:
            print(f"cluster: kills or starts that failed: {failed_steps}")
        failed = bool(failed_steps) or bool(problems) or tallies["lost"] > 0 or bool(crashed) \
            or len(kills) - len(failed_steps) < 6 + len(steps) - 1 or not down_result \
            or not shared
        print("cluster: " + ("FAIL" if failed else "passed — one terminal state each, none lost, no seq with two states"))
    finally:
        for a in agents:
            a.stopping = True
        for s in services:
            s.stop()
        cluster("start")  # every node back before the vhost goes
        vhost.delete()
        if started:
            cluster("stop")
    if failed:
        print(f"cluster: logs in {logs}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
