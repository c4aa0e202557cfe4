#!/usr/bin/env python3
"""Fuzzes the router's intake: N malformed messages — bad JSON, wrong types,
huge fields, invalid UTF-8, control characters, ids and hints with #, *, .
and spaces, wrong versions, unknown routing keys, random bytes, bad cancels
and reroutes, hostile AMQP properties and headers (extreme timestamps, the
producer's own user_id, CC/BCC naming internal queues, expiration,
priority, tables nested 15,000 deep, empty keys, headers that fill the frame, long and
invalid-UTF-8 short strings), and
malformed agent replies — interleaved with valid requests (with hostile
properties too), against the real router, sender and an instant agent on
the local broker. Checks: no service crashed;
every bad message or reply got exactly one dead letter with the expected
code (matched by its message_id), carrying none of the properties a dead
letter must not keep; every valid request ended replied (or, for hints naming
no target, failed with unknown_target). Prints the tallies; exit 1 on any
mismatch.

    python3 scripts/evidence/fuzz.py [--count 10000] [--valid-every 10] [--seed 1]
"""
import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

import pika

# pika encodes nested tables by recursion; the fuzz sends some 15,000 deep.
sys.setrecursionlimit(100_000)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def malformed(rng, n):
    """(routing_key, body bytes, type property or None, expected code)."""
    good_id = f"fz-{n}"
    kind = rng.randrange(16)
    if kind == 0:
        return "dispatch.request", b'{"id": "' + good_id.encode() + b'", "input": "trunc', None, "invalid_json"
    if kind == 1:
        return "dispatch.request", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\xff", None, "invalid_json"
    if kind == 2:  # invalid UTF-8 inside a JSON string
        return "dispatch.request", b'{"id": "' + good_id.encode() + b'", "input": "caf\xc3\x28 \xed\xa0\x80"}', None, "invalid_json"
    if kind == 3:
        return "dispatch.request", json.dumps({"id": rng.randrange(10**6), "input": "x"}).encode(), None, "invalid_request"
    if kind == 4:
        return "dispatch.request", json.dumps({"id": good_id, "input": rng.choice([42, None, [], {}, True])}).encode(), None, "invalid_request"
    if kind == 5:
        bad = rng.choice(["a#b", "a*b", "a b", "", "x" * 129, "é", "a/b", "a\u0000b"])
        return "dispatch.request", json.dumps({"id": bad + str(n) if bad else bad, "input": "hello"}).encode(), None, "invalid_request"
    if kind == 6:
        return "dispatch.request", json.dumps({"id": good_id, "input": "y" * 4001}).encode(), None, "invalid_request"
    if kind == 7:
        return "dispatch.request", json.dumps({"id": good_id, "input": "z" * 70_000}).encode(), None, "too_large"
    if kind == 8:
        return "dispatch.request", json.dumps({"id": good_id, "input": "ok"}).encode(), rng.choice(
            ["frontdesk.dispatch.request.v2", "v0", "frontdesk.dispatch.request"]), "unsupported_version"
    if kind == 9:
        return rng.choice(["dispatch.requests", "dispatch", "status.x", "dispatch.request.v1"]), json.dumps(
            {"id": good_id, "input": "ok"}).encode(), None, "invalid_request"
    if kind == 10:
        return "dispatch.cancel", json.dumps(rng.choice([{}, {"id": 5}, {"id": "a#b"}, {"id": good_id, "reason": 7}])).encode(), None, "invalid_request"
    if kind == 11:
        return "dispatch.cancel", b"{cancel", None, "invalid_request"  # a malformed cancel, JSON or not (CONTRACT, Cancel)
    if kind == 12:
        return "dispatch.reroute", json.dumps(rng.choice([{"id": good_id}, {"id": good_id, "project": 1, "target": "x"},
                                                           {"project": "acme", "target": "ops"}])).encode(), None, "invalid_request"
    if kind == 13:
        return "dispatch.reroute", json.dumps({"id": good_id, "project": rng.choice(["acme", "nope", "ac.me"]),
                                               "target": rng.choice(["nowhere", "o#ps", "*"])}).encode(), None, "unknown_target"
    if kind == 14:
        return "dispatch.request", json.dumps([good_id, "input"]).encode(), None, "invalid_request"
    return "dispatch.request", json.dumps({"id": good_id, "input": "fine", "createdAt": "yesterday"}).encode(), None, "invalid_request"


def hostile_properties(rng, mid, kind, user):
    """Properties a hostile or merely unusual producer sets; the services must
    neither copy them nor trip over them."""
    nested = {"leaf": "x"}
    for _ in range(rng.randrange(1, 40)):
        nested = {"n": nested, "list": [1, "two", {"deep": [nested.get("leaf", 0)]}]}
    headers = {rng.choice(["CC", "BCC", "cc"]): [rng.choice(["frontdesk.replies", "frontdesk.sender.inbox", "frontdesk.dead"])],
               "x-nested": nested, "x-big": "h" * rng.choice([0, 255, 5000]), "x-num": rng.choice([-(2**63), 2**63 - 1, 0]),
               # An empty key is legal AMQP; rabbitmq-c's amqp_read_message refuses it.
               "": {"": "empty keys"},
               # Not UTF-8: read as U+FFFD, three bytes a byte, the key is
               # 765 bytes, past what a short string carries.
               b"\xff" * 255: {b"\xfe" * 200: "keys that grow when read"}}
    shape = rng.random()
    if shape < 0.05:
        # Nested 15,000 deep (6 bytes a level): following it all overflows a reader's stack.
        chain = {}
        for _ in range(15_000):
            chain = {"": chain}
        headers["x-chain"] = chain
    properties = pika.BasicProperties(
        message_id=mid, type=kind, delivery_mode=2, content_type="application/json",
        timestamp=rng.choice([0, 1, 2**63 - 1, 2**64 - 1]), user_id=user, headers=headers,
        expiration=rng.choice([None, "600000", "4294967295"]), priority=rng.choice([None, 0, 9, 255]),
        reply_to=rng.choice([None, "frontdesk.replies", "r" * 255]), correlation_id=rng.choice([None, "c" * 255, b"\xff" * 255]),
        app_id=rng.choice([None, b"caf\xc3\x28\xed\xa0\x80", "a" * 255]))
    if 0.05 <= shape < 0.15:
        # Headers that fill the frame but for a few bytes: a dead letter that
        # copied them all and added its own four would fit no frame.
        used = len(b"".join(properties.encode()))
        headers["x-fill"] = "f" * (FRAME_MAX - FRAME_OVERHEAD - used - len("x-fill") - 6 - rng.randrange(0, 64))
    return properties


# pika's and the broker's frame size, and what a content header frame takes besides the properties.
FRAME_MAX = 131_072
FRAME_OVERHEAD = 7 + 12 + 1


def bad_reply(rng, n):
    """(body bytes, type property or None, expected code) of a reply that is none."""
    kind = rng.randrange(6)
    if kind == 0:
        return b"{not json", None, "invalid_json"
    if kind == 1:
        return json.dumps({"attempt": 1, "kind": "final"}).encode(), None, "invalid_request"
    if kind == 2:
        return json.dumps({"dispatchId": f"r-{n}", "attempt": rng.choice([0, -1, 1e300, 2**63, "1", None]), "kind": "final"}).encode(), None, "invalid_request"
    if kind == 3:
        return json.dumps({"dispatchId": f"r-{n}", "attempt": 1, "kind": "maybe"}).encode(), None, "invalid_request"
    if kind == 4:
        return json.dumps({"dispatchId": f"r-{n}", "attempt": 1, "kind": "final"}).encode(), "frontdesk.reply.v2", "unsupported_version"
    return json.dumps({"dispatchId": f"r-{n}", "attempt": 1, "kind": "final", "text": "t" * 300_000}).encode(), None, "too_large"


def valid(rng, n):
    """(routing_key, body, None, expected terminal state, expected error code)."""
    rid = f"fv-{n}" + rng.choice(["", ".dots.ok", ":colon", "_x"])
    text = rng.choice(["Reply to Lisa about the AGM agenda", "ctrl \u0001\u0007\t chars\u001f", "Zoë — ünïcödé 🎉", "a" * 4000])
    body = {"id": rid, "input": text, "project": "yemaya", "target": "board-prep"}
    state, code = "replied", None
    if rng.random() < 0.1:  # hints with #, *, . name no target: failed (unknown_target), no dead letter
        body["project"] = rng.choice(["yem#aya", "*", "yemaya.board"])
        state, code = "failed", "unknown_target"
    return rid, json.dumps(body).encode(), state, code


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--valid-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    vhost = harness.Vhost("fuzz")
    logs = tempfile.mkdtemp(prefix="fuzz-")
    router = harness.Service("frontdesk-router", vhost.url, 9301, logs)
    sender = harness.Service("frontdesk-sender", vhost.url, 9302, logs)
    agent = None
    try:
        router.start()
        sender.start()
        time.sleep(2)
        agent = harness.subprocess.Popen([os.path.join(harness.BIN, "frontdesk"), "agent", "--target", "yemaya/board-prep",
                                          "--instant", "--amqp-url", vhost.url], stderr=harness.subprocess.DEVNULL)
        status = harness.StatusSubscriber(vhost.url)
        status.start()
        dead = {}
        leaks = []  # (message_id, properties a dead letter kept that it must not)
        dead_lock = threading.Lock()

        def read_dead():
            try:
                read_dead_letters()
            except (pika.exceptions.AMQPError, OSError):
                pass  # the vhost is deleted at the end

        def read_dead_letters():
            connection = harness.connect(vhost.url)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=1000)
            for method, properties, _ in channel.consume("frontdesk.dead", inactivity_timeout=0.5):
                if method is None:
                    continue
                headers = properties.headers or {}
                kept = [name for name, value in (("user_id", properties.user_id), ("expiration", properties.expiration),
                                                 ("priority", properties.priority), ("reply_to", properties.reply_to),
                                                 ("app_id", properties.app_id)) if value is not None]
                kept += [h for h in headers if h.upper() in ("CC", "BCC")]
                with dead_lock:
                    dead.setdefault(properties.message_id, []).append(headers.get("x-frontdesk-error"))
                    if kept:
                        leaks.append((properties.message_id, kept))
                channel.basic_ack(method.delivery_tag)

        threading.Thread(target=read_dead, daemon=True).start()
        time.sleep(1)

        connection = harness.connect(vhost.url)
        channel = connection.channel()
        channel.confirm_delivery()
        expected_dead, expected_valid = {}, {}
        started = time.time()
        user = harness.user_of(vhost.url)
        hostile = 0
        for n in range(args.count):
            key, body, kind, code = malformed(rng, n)
            mid = f"bad-{n}"
            if rng.random() < 0.3:
                properties = hostile_properties(rng, mid, kind, user)
                hostile += 1
            else:
                properties = pika.BasicProperties(message_id=mid, type=kind, delivery_mode=2, content_type="application/json")
            channel.basic_publish("frontdesk.commands", key, body, properties)
            expected_dead[mid] = code
            if n % args.valid_every == 0:
                rid, vbody, state, vcode = valid(rng, n)
                properties = pika.BasicProperties(message_id=f"good-{n}", delivery_mode=2, content_type="application/json")
                if rng.random() < 0.5:
                    properties = hostile_properties(rng, f"good-{n}", None, user)
                    hostile += 1
                channel.basic_publish("frontdesk.commands", "dispatch.request", vbody, properties)
                expected_valid[rid] = (state, vcode)
                # An agent's reply that is none: the sender dead-letters it with the reason.
                rbody, rtype, rcode = bad_reply(rng, n)
                rproperties = pika.BasicProperties(message_id=f"reply-{n}", type=rtype, delivery_mode=2, content_type="application/json")
                if rng.random() < 0.3:
                    rproperties = hostile_properties(rng, f"reply-{n}", rtype, user)
                    # Not CC or BCC: on the default exchange they name queues, and the
                    # broker itself would put a copy in frontdesk.dead or the replies.
                    rproperties.headers = {k: v for k, v in rproperties.headers.items() if k.upper() not in ("CC", "BCC")}
                    hostile += 1
                channel.basic_publish("", "frontdesk.replies", rbody, rproperties)
                expected_dead[f"reply-{n}"] = rcode
        connection.close()
        published = time.time() - started

        deadline = time.time() + args.timeout
        while time.time() < deadline:
            with dead_lock:
                got_dead = sum(len(v) for v in dead.values())
            if got_dead >= len(expected_dead) and status.terminal(expected_valid) >= len(expected_valid):
                break
            time.sleep(0.5)
        time.sleep(1)  # anything extra (a second dead letter) arrives now
        elapsed = time.time() - started

        problems = []
        with dead_lock:
            seen = dict(dead)
        by_code = {}
        for mid, code in expected_dead.items():
            got = seen.get(mid, [])
            by_code.setdefault(code, [0, 0])[0] += 1
            if got == [code]:
                by_code[code][1] += 1
            else:
                problems.append(f"{mid}: expected one dead letter {code}, got {got}")
        extra = [m for m in seen if m not in expected_dead]
        if extra:
            problems.append(f"dead letters for valid requests: {extra[:5]}")
        for mid, kept in leaks[:5]:
            problems.append(f"{mid}: the dead letter kept {kept}")
        snapshot = status.snapshot()
        tallies, history_problems = harness.check_histories(snapshot, list(expected_valid))
        problems += history_problems
        for rid, (state, code) in expected_valid.items():
            final = [e for _, s, e, _ in snapshot.get(rid, []) if s in ("replied", "failed", "cancelled")]
            if final and (final[0]["state"] != state or (code and final[0].get("error", {}).get("code") != code)):
                problems.append(f"{rid}: ended {final[0]['state']} {final[0].get('error')}, expected {state} {code}")
        crashed = [s.executable for s in (router, sender) if s.process.poll() is not None]
        if crashed:
            problems.append(f"crashed: {crashed}")

        print(f"fuzz: {len(expected_dead)} malformed + {len(expected_valid)} valid messages, seed {args.seed}; "
              f"published in {published:.1f} s, all settled in {elapsed:.1f} s")
        for code, (want, ok) in sorted(by_code.items()):
            print(f"  {code:20} {ok:6} / {want:6} dead-lettered with the right code, once")
        print(f"  {hostile} messages with hostile properties (timestamps up to 2^64-1, user_id, CC/BCC, expiration, "
              f"priority, tables nested 15,000 deep, empty keys, headers filling the frame, long or invalid-UTF-8 strings); dead letters that kept a property they must not: {len(leaks)}")
        print(f"  valid requests: {tallies['replied']} replied, {tallies['failed']} failed (hints naming no target), "
              f"{tallies['lost']} without an end")
        print(f"  services still running: router {router.process.poll() is None}, sender {sender.process.poll() is None}")
        if problems:
            print(f"fuzz: {len(problems)} problem(s); first ones:")
            for p in problems[:10]:
                print("  " + p)
            return 1
        print("fuzz: passed")
        return 0
    finally:
        if agent:
            agent.terminate()
        router.stop()
        sender.stop()
        vhost.delete()


if __name__ == "__main__":
    sys.exit(main())
