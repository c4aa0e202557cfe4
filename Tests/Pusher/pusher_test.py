#!/usr/bin/env python3
"""frontdesk-pusher against an HTTP/2 APNs stand-in over TLS (apns_standin.py,
a throw-away CA), with the real router, sender and agents on the local broker:

  1. the seed's dispatch with a token registered before its first event:
     pushes in seq order on one HTTP/2 connection, the contract's headers, a
     JWT that verifies with the public key, priority 10 for each new state and
     5 for preview-only updates, `end` last with a dismissal date, ≤ 4 KB;
  2. a burst of 40 progress replies while APNs is slow: only the newest
     pending update goes out (fewer pushes than events), the end still last;
  3. 410 drops the token (no push after it); 429 and 503 back off and the end
     still arrives; 400 is counted with APNs' reason;
  4. a token APNs answers 500 each time, while other pushes go through, is
     retried with back-off for FRONTDESK_APNS_GIVE_UP_S, then let go (its
     events acked) and counted, and not tried again;
  5. a reroute in the same state is pushed at priority 10;
  6. a malformed registration gets one dead letter from frontdesk-pusher;
  7. kill -9 of the acting pusher mid-stream: the standby replica takes over
     and the end arrives; a token registered before the kill is not lost.

Exit 0 when all pass, 1 otherwise.

    python3 Tests/Pusher/pusher_test.py
"""
import json
import os
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "evidence"))
import apns_standin  # noqa: E402
import harness  # noqa: E402

BUNDLE = "com.example.frontdesk"
SEED = "Reply to Lisa about the AGM agenda — short, confirm 14:00"


wait = harness.wait


class Broker:
    """A publisher and a status subscriber (every event, by dispatch)."""

    def __init__(self, url):
        self.url = url
        self.connection = harness.connect(url)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.events = {}
        self.lock = threading.Lock()
        self.watcher = threading.Thread(target=self.watch, daemon=True)
        self.watcher.start()

    def watch(self):
        connection = harness.connect(self.url)
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "frontdesk.status", "status.#")

        def on_message(ch, method, properties, body):
            e = json.loads(body)
            with self.lock:
                self.events.setdefault(e["dispatchId"], []).append(e)
        channel.basic_consume(queue, on_message, auto_ack=True)
        channel.start_consuming()

    def publish(self, key, body, message_id=None):
        self.channel.basic_publish("frontdesk.commands", key, json.dumps(body).encode() if not isinstance(body, bytes) else body,
                                   pika.BasicProperties(content_type="application/json", delivery_mode=2, message_id=message_id))

    def register(self, dispatch_id, token, environment="sandbox"):
        self.publish("dispatch.activity", {"id": dispatch_id, "pushToken": token, "environment": environment})

    def dispatch(self, dispatch_id, input, project=None, target=None):
        body = {"id": dispatch_id, "input": input}
        if project:
            body.update(project=project, target=target)
        self.publish("dispatch.request", body)

    def states(self, dispatch_id):
        with self.lock:
            return [e["state"] for e in self.events.get(dispatch_id, [])]


def burst_agent(url, queue, count, stop):
    """An agent that answers each task with `count` progress replies at once, then the final."""
    connection = harness.connect(url)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.basic_qos(prefetch_count=1)

    def on_task(ch, method, properties, body):
        task = json.loads(body)
        text = ""
        for i in range(count):
            text += f"line {i}\n"
            reply = {"dispatchId": task["dispatchId"], "attempt": task["attempt"], "kind": "progress", "text": text, "etaMs": 1000}
            ch.basic_publish("", "frontdesk.replies", json.dumps(reply).encode(), pika.BasicProperties(content_type="application/json"))
        final = {"dispatchId": task["dispatchId"], "attempt": task["attempt"], "kind": "final", "text": text + "done"}
        ch.basic_publish("", "frontdesk.replies", json.dumps(final).encode(), pika.BasicProperties(content_type="application/json"))
        ch.basic_ack(method.delivery_tag)
    channel.basic_consume(queue, on_task)
    while not stop.is_set():
        connection.process_data_events(time_limit=0.2)
    connection.close()


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def pushed(port):
    """Pushes APNs took (200) from one pusher, by its metrics."""
    return sum(float(line.split()[-1]) for line in metrics(port).splitlines()
               if line.startswith('frontdesk_pusher_pushes_total{status="200"}'))


def ended(standin, token):
    return any(r["body"].get("aps", {}).get("event") == "end" and r["status"] == 200 for r in standin.for_token(token))


def check_seed(b, standin):
    token = "aa01" * 8
    b.register("p-1", token)
    # Right away: events that reach the pusher before the token does are pushed once it arrives.
    b.dispatch("p-1", SEED)
    wait("the end push for p-1", lambda: ended(standin, token))
    pushes = standin.for_token(token)
    seqs = [r["body"]["aps"]["content-state"]["seq"] for r in pushes]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"seqs in order, once each: {seqs}"
    states = [r["body"]["aps"]["content-state"]["state"] for r in pushes]
    assert states[-1] == "replied" and "sending" in states, states
    for r in pushes:
        h = r["headers"]
        assert h.get("apns-push-type") == "liveactivity", h
        assert h.get("apns-topic") == f"{BUNDLE}.push-type.liveactivity", h
        assert r["jwt_ok"], "the provider token verifies with the public key"
        assert len(json.dumps(r["body"]).encode()) <= 4096
        assert r["path"] == f"/3/device/{token}"
    previous = None
    for r in pushes:
        state = r["body"]["aps"]["content-state"]["state"]
        expected = "10" if state != previous or state in ("replied", "failed", "cancelled") else "5"
        assert r["headers"]["apns-priority"] == expected, (state, previous, r["headers"]["apns-priority"])
        previous = state
    last = pushes[-1]["body"]["aps"]
    assert last["event"] == "end" and last["dismissal-date"] > last["timestamp"], last
    assert all(p["body"]["aps"]["event"] == "update" for p in pushes[:-1])
    assert len({r["connection"] for r in pushes}) == 1, "one HTTP/2 connection"
    sending = [p["body"]["aps"] for p in pushes if p["body"]["aps"]["content-state"].get("etaMs")]
    assert all(a["stale-date"] <= a["timestamp"] + a["content-state"]["etaMs"] / 1000 + 11 for a in sending), "stale after the ETA"
    return f"{len(pushes)} pushes, states {states}, priorities {[r['headers']['apns-priority'] for r in pushes]}"


def check_burst(b, standin):
    token = "55" + "ab" * 15  # slow answers: updates pile up behind the one in flight
    b.register("p-2", token)
    b.dispatch("p-2", "the contract", "acme", "legal")
    wait("the end push for p-2", lambda: ended(standin, token), timeout=60)
    pushes = standin.for_token(token)
    events = b.states("p-2")
    seqs = [r["body"]["aps"]["content-state"]["seq"] for r in pushes]
    assert seqs == sorted(seqs), seqs
    assert len(pushes) < len(events) / 2, f"{len(pushes)} pushes for {len(events)} events"
    assert pushes[-1]["body"]["aps"]["event"] == "end"
    return f"{len(events)} status events, {len(pushes)} pushes"


def check_failures(b, standin, pusher_port):
    gone, busy, down, bad = "410a" + "00" * 14, "429a" + "00" * 14, "503a" + "00" * 14, "400a" + "00" * 14
    expired = "403a" + "00" * 14  # a fresh token called expired (a clock off): renewing would not help
    for dispatch_id, token in [("p-3", gone), ("p-4", busy), ("p-5", down), ("p-6", bad), ("p-10", expired)]:
        b.register(dispatch_id, token)
    for dispatch_id in ["p-3", "p-4", "p-5", "p-6", "p-10"]:
        b.dispatch(dispatch_id, SEED)
    wait("the end after 429s", lambda: ended(standin, busy), timeout=60)
    wait("the end after a 503", lambda: ended(standin, down), timeout=60)
    wait("p-3, p-6 and p-10 replied", lambda: all("replied" in b.states(d) for d in ["p-3", "p-6", "p-10"]))
    # Every event of p-3 has been through the pusher once p-7's end (later, same target) was pushed.
    marker = "aa02" * 8
    b.register("p-7", marker)
    b.dispatch("p-7", SEED)
    wait("p-7's end", lambda: ended(standin, marker))
    assert len(standin.for_token(gone)) == 1, f"after a 410, nothing more: {len(standin.for_token(gone))} requests"
    busy_requests = standin.for_token(busy)
    assert [r["status"] for r in busy_requests][:3] == [429, 429, 200], [r["status"] for r in busy_requests]
    # Each 429's Retry-After is waited out (the pusher's own back-off alone would be 0.25–0.5 s, then 0.5–1 s).
    gaps = [b["at"] - a["at"] for a, b in zip(busy_requests, busy_requests[1:3])]
    assert all(gap >= apns_standin.RETRY_AFTER_S - 0.1 for gap in gaps), f"Retry-After {apns_standin.RETRY_AFTER_S} s not waited out: gaps {gaps}"
    text = metrics(pusher_port)
    assert 'frontdesk_pusher_rejected_total{reason="BadDeviceToken"}' in text, "400 counted with its reason"
    assert 'frontdesk_pusher_pushes_total{status="410"} 1' in text
    # Each of p-10's updates tried once, counted, then let go: not retried for ever.
    wait("p-10's end tried", lambda: any(r["body"].get("aps", {}).get("event") == "end" for r in standin.for_token(expired)))
    refused = len(standin.for_token(expired))
    wait("p-10's refusals counted", lambda: f'frontdesk_pusher_rejected_total{{reason="ExpiredProviderToken"}} {refused}' in metrics(pusher_port))
    assert 0 < refused <= len(b.states("p-10")), f"{refused} requests for {len(b.states('p-10'))} events"
    return (f"410: 1 request; 429: {len(busy_requests)} requests, {min(gaps):.2f} s or more apart (Retry-After), end delivered; "
            f"503 retried; 400 counted; "
            f"403 ExpiredProviderToken: {refused} requests for {len(b.states('p-10'))} events, counted")


def counter(port, name):
    """The value of an unlabelled counter in a pusher's metrics (0 when absent)."""
    for line in metrics(port).splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return 0


def unacked(vhost, queue):
    command = ["bash", os.path.join(harness.REPO, "scripts", "broker.sh"), "ctl", "list_queues", "-p", vhost,
               "name", "messages_unacknowledged", "--silent"]
    out = harness.subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return next((int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == [queue]), None)


def check_give_up(b, standin, pusher_port, vhost):
    """A token APNs never takes (500 each time) while others' pushes go through: retried with back-off
    for FRONTDESK_APNS_GIVE_UP_S, then let go (its status events acked) and counted."""
    broken = "500a" + "00" * 14
    b.register("p-12", broken)
    b.dispatch("p-12", SEED)
    wait("p-12 replied", lambda: "replied" in b.states("p-12"))
    # Another dispatch's end goes through meanwhile: APNs is up, the token is the trouble.
    marker = "aa05" * 8
    b.register("p-13", marker)
    b.dispatch("p-13", SEED)
    wait("p-13's end", lambda: ended(standin, marker))
    wait("p-12 given up", lambda: counter(pusher_port, "frontdesk_pusher_given_up_total") == 1, timeout=60)
    tried = standin.for_token(broken)
    spread = tried[-1]["at"] - tried[0]["at"]
    assert spread >= GIVE_UP_S - 0.5, f"tried for {spread:.1f} s only"
    assert all(r["status"] == 500 for r in tried)
    wait("nothing held unacked", lambda: unacked(vhost, "frontdesk.pusher.status") == 0)
    # Nothing more for it once let go: another dispatch's end goes through, p-12's token sees no request.
    later = "aa07" * 8
    b.register("p-14", later)
    b.dispatch("p-14", SEED)
    wait("p-14's end", lambda: ended(standin, later))
    assert len(standin.for_token(broken)) == len(tried), "retried after it was let go"
    return (f"{len(tried)} requests over {spread:.1f} s of 500s while others went through, then given up, "
            "counted and acked; later pushes unaffected")


def check_reroute(b, standin):
    token = "aa04" * 8
    b.register("p-11", token)
    b.dispatch("p-11", "the contract", "acme", "ops")  # no agent: queued
    lines = lambda: [r["body"]["aps"]["content-state"].get("routeLine", "") for r in standin.for_token(token)]
    wait("p-11 queued on acme/ops pushed", lambda: any("Ops" in line for line in lines()))
    b.publish("dispatch.reroute", {"id": "p-11", "project": "home", "target": "family"})
    wait("the new route pushed", lambda: any("Family" in line for line in lines()))
    moved = next(r for r in standin.for_token(token) if "Family" in r["body"]["aps"]["content-state"].get("routeLine", ""))
    assert moved["body"]["aps"]["content-state"]["state"] == "queued", moved["body"]
    assert moved["headers"]["apns-priority"] == "10", f"a new route is news: {moved['headers']['apns-priority']}"
    b.publish("dispatch.cancel", {"id": "p-11", "reason": "user"})
    wait("p-11's end", lambda: ended(standin, token))
    return f"queued, rerouted to {moved['body']['aps']['content-state']['routeLine']!r} at priority 10, cancelled"


def check_dead_letter(b):
    b.publish("dispatch.activity", {"id": "p-x", "pushToken": "not hex"}, message_id="bad-registration-1")
    channel = b.connection.channel()

    def find():
        method, properties, body = channel.basic_get("frontdesk.dead", auto_ack=False)
        if method is None:
            return None
        channel.basic_nack(method.delivery_tag, requeue=True) if properties.message_id != "bad-registration-1" else channel.basic_ack(method.delivery_tag)
        return properties if properties.message_id == "bad-registration-1" else None
    properties = wait("the dead letter", find)
    h = properties.headers
    assert h["x-frontdesk-error"] == "invalid_request" and h["x-frontdesk-service"] == "frontdesk-pusher", h
    return f"dead-lettered: {h['x-frontdesk-reason']}"


def check_takeover(b, standin, pushers):
    token = "aa03" * 8
    b.register("p-8", token)
    b.dispatch("p-8", SEED, "yemaya", "fundraising")  # the slow agent: about 4 s of progress
    wait("the first push for p-8", lambda: standin.for_token(token))
    # The first pusher acts (the single active consumer is the first to attach); the second stands by.
    assert pushed(pushers[0].port) > 0 and pushed(pushers[1].port) == 0, "the first replica acts, the second stands by"
    pushers[0].kill9()
    wait("the end push for p-8 after the kill", lambda: ended(standin, token), timeout=60)
    assert pushed(pushers[1].port) > 0, "the standby took over"
    later = "aa06" * 8
    b.register("p-9", later)
    b.dispatch("p-9", SEED)
    wait("p-9's end from the replica left", lambda: ended(standin, later))
    return f"killed the acting pusher after {len(standin.for_token(token))} push(es); the end arrived; the replica serves new tokens"


def check_clean_stop(pushers):
    # The replica left has a live HTTP/2 connection to the stand-in: a SIGTERM stops its
    # consumers, returns what it holds, ends the APNs client and exits 0, promptly.
    live = pushers[1]
    started = time.monotonic()
    code = live.stop()
    took = time.monotonic() - started
    assert code == 0, f"the pusher exited with {code} on SIGTERM"
    assert took < 10, f"the pusher took {took:.1f} s to stop"
    return f"exit 0 in {took:.2f} s"


def main():
    work = tempfile.mkdtemp(prefix="frontdesk-pusher-")
    pki = apns_standin.make_pki(work)
    standin = apns_standin.StandIn(pki)
    standin.start()
    vhost = harness.Vhost("pusher")
    apns_env = {
        "FRONTDESK_APNS_URL": f"https://localhost:{standin.port}", "FRONTDESK_APNS_CA_FILE": pki["ca"],
        "FRONTDESK_APNS_KEY_FILE": pki["p8"], "FRONTDESK_APNS_KEY_ID": "KEYID12345", "FRONTDESK_APNS_TEAM_ID": "TEAMID1234",
        "FRONTDESK_APNS_BUNDLE_ID": BUNDLE, "FRONTDESK_APNS_GIVE_UP_S": str(GIVE_UP_S),
    }
    services = [harness.Service("frontdesk-router", vhost.url, free_port(), work),
                harness.Service("frontdesk-sender", vhost.url, free_port(), work)]
    pushers = [harness.Service("frontdesk-pusher", vhost.url, free_port(), work, apns_env) for _ in range(2)]
    agents, stop = [], threading.Event()
    failed = False
    try:
        for s in services + pushers[:1]:
            s.start()
        wait("the first pusher ready", lambda: ready(pushers[0].port))
        pushers[1].start()
        wait("the second pusher ready", lambda: ready(pushers[1].port))
        for target, delay in [("yemaya/board-prep", "100"), ("yemaya/fundraising", "1000")]:
            log = open(os.path.join(work, f"agent-{target.replace('/', '-')}.log"), "ab")
            agents.append(harness.subprocess.Popen([os.path.join(harness.BIN, "frontdesk"), "agent", "--target", target, "--delay-ms", delay],
                                                   env=dict(os.environ, AMQP_URL=vhost.url), stdout=log, stderr=log))
        threading.Thread(target=burst_agent, args=(vhost.url, "frontdesk.agent.acme.legal", 40, stop), daemon=True).start()
        b = Broker(vhost.url)
        acting_port = pushers[0].port
        for name, step in [("the seed's dispatch pushed in order", lambda: check_seed(b, standin)),
                           ("a burst under slow APNs is coalesced", lambda: check_burst(b, standin)),
                           ("410, 429, 503 and 400", lambda: check_failures(b, standin, acting_port)),
                           ("a token APNs never takes is given up", lambda: check_give_up(b, standin, acting_port, vhost.name)),
                           ("a reroute in the same state is pushed at priority 10", lambda: check_reroute(b, standin)),
                           ("a malformed registration is dead-lettered", lambda: check_dead_letter(b)),
                           ("kill -9 of the acting pusher", lambda: check_takeover(b, standin, pushers)),
                           ("SIGTERM stops the pusher cleanly", lambda: check_clean_stop(pushers))]:
            try:
                print(f"pusher: ok   {name}: {step()}")
            except Exception as e:  # noqa: BLE001 - reported, then the run fails
                failed = True
                print(f"pusher: FAIL {name}: {e}")
                traceback.print_exc()
    finally:
        stop.set()
        for a in agents:
            a.terminate()
            a.wait()
        for s in pushers + services:
            s.stop()
        standin.close()
        vhost.delete()
    if failed:
        print(f"pusher: logs in {work}")
    sys.exit(1 if failed else 0)


free_port = harness.free_port
GIVE_UP_S = 5  # past the 429 check's two Retry-After waits (2 s each, the run of failures 2 s long) and the 503 one's 0.5 s
ready = harness.ready


if __name__ == "__main__":
    main()
