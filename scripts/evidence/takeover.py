#!/usr/bin/env python3
"""How long a sender takeover takes with a long status log: the router, a
leading sender and a warm standby on the local broker; N dispatches go
through an instant agent (their events fill the status log); then the
leader is killed -9 and, at that instant, a dispatch for a target without
agents is sent. Prints the time until the new leader has queued it.

    python3 scripts/evidence/takeover.py [--dispatches 20000]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import pika

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatches", type=int, default=20000)
    args = parser.parse_args()
    logs = tempfile.mkdtemp(prefix="takeover-")
    vhost = harness.Vhost("takeover")
    router, leader, standby = (harness.Service(name, vhost.url, port, logs) for name, port in
                               [("frontdesk-router", 9601), ("frontdesk-sender", 9602), ("frontdesk-sender", 9603)])
    agent = None
    try:
        router.start()
        leader.start()
        while harness.metric(9602, "frontdesk_sender_leader") != 1:
            time.sleep(0.1)
        standby.start()
        while not harness.ready(9603):  # connected, its topology declared: a standby reading the log
            time.sleep(0.1)
        agent = subprocess.Popen([os.path.join(harness.BIN, "frontdesk"), "agent", "--target", "yemaya/board-prep", "--instant"],
                                 env=dict(os.environ, AMQP_URL=vhost.url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        status = harness.StatusSubscriber(vhost.url)
        status.start()
        connection = harness.connect(vhost.url)
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(args.dispatches):
            channel.basic_publish("frontdesk.commands", "dispatch.request", json.dumps(
                {"id": f"t-{i}", "input": "x", "project": "yemaya", "target": "board-prep"}).encode(), pika.BasicProperties(delivery_mode=2))
        deadline = time.time() + 600
        while status.terminal([f"t-{i}" for i in range(0, args.dispatches, max(1, args.dispatches // 100))]) < 100 and time.time() < deadline:
            time.sleep(0.5)
        while channel.queue_declare("frontdesk.sender.inbox", passive=True).method.message_count > 0:
            time.sleep(0.5)
        leader.kill9()
        killed = time.time()
        channel.basic_publish("frontdesk.commands", "dispatch.request", json.dumps(
            {"id": "probe", "input": "x", "project": "acme", "target": "legal"}).encode(), pika.BasicProperties(delivery_mode=2))
        while not any(state == "queued" for _, state, _, _ in status.snapshot().get("probe", [])):
            if time.time() - killed > 60:
                print("takeover: the probe was not queued within 60 s")
                sys.exit(1)
            time.sleep(0.005)
        print(f"takeover: {args.dispatches} dispatches in the log; a dispatch sent at the kill was queued by the new leader "
              f"{time.time() - killed:.2f} s after it")
    finally:
        if agent:
            agent.terminate()
            agent.wait()
        for s in (router, leader, standby):
            s.stop()
        vhost.delete()


if __name__ == "__main__":
    main()
