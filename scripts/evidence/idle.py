#!/usr/bin/env python3
"""What the router and the sender cost while nothing is dispatched: both on
a vhost of their own on the local broker, an instant agent (the relay's C
loop) on every target, then each process's CPU time and context switches
(all its threads, from /proc) over a few seconds, and the broker's CPU time
over the same seconds.

    FRONTDESK_BIN=.build/release python3 scripts/evidence/idle.py [--seconds 20]
        [--routes FILE] [--no-agents]

Needs a release build (pipeline-c-relay is the agent). /proc counts CPU in
10 ms ticks: over 20 s a figure is good to about 0.5 CPU-ms a second.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def switches(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{tid}/status"):
                if "ctxt_switches" in line:
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that ended
    return total


def broker_pid():
    """The local broker's Erlang VM (its node name is in its environment)."""
    out = subprocess.run(["pgrep", "beam.smp"], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            if b"RABBITMQ_NODENAME=frontdesk-local@" in open(f"/proc/{pid}/environ", "rb").read():
                return int(pid)
        except OSError:
            pass
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--routes", default=harness.ROUTES)
    parser.add_argument("--no-agents", action="store_true")
    args = parser.parse_args()
    harness.ROUTES = os.path.abspath(args.routes)
    table = json.load(open(harness.ROUTES))
    vhost = harness.Vhost("idle")
    logs = tempfile.mkdtemp(prefix="frontdesk-idle-")
    services, agents = [], []
    try:
        router = harness.Service("frontdesk-router", vhost.url, harness.free_port(), logs)
        sender = harness.Service("frontdesk-sender", vhost.url, harness.free_port(), logs)
        services = [router, sender]
        for s in services:
            s.start()
        for s in services:
            harness.wait(f"{s.executable} ready", lambda s=s: harness.ready(s.port), timeout=60)
        harness.wait("the sender leads", lambda: harness.metric(sender.port, "frontdesk_sender_leader") == 1, timeout=120)
        if not args.no_agents:
            url = urllib.parse.urlparse(vhost.url.split(",")[0])
            user, password = urllib.parse.unquote(url.username), urllib.parse.unquote(url.password)
            host, port = url.hostname, url.port or 5672
            for p in table["projects"]:
                for t in p["targets"]:
                    agents.append(subprocess.Popen(
                        [os.path.join(harness.BIN, "pipeline-c-relay"), host, str(port), user, password, vhost.name,
                         "--agent", f"frontdesk.agent.{p['id']}.{t['id']}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(5)  # settle: agents seen online, park consumers started
        broker = broker_pid()
        pids = {s.executable: s.process.pid for s in services}
        before = {k: (cpu_ticks(p), switches(p)) for k, p in pids.items()}
        broker_before = cpu_ticks(broker) if broker else None
        time.sleep(args.seconds)
        after = {k: (cpu_ticks(p), switches(p)) for k, p in pids.items()}
        broker_after = cpu_ticks(broker) if broker else None
        targets = sum(len(p["targets"]) for p in table["projects"])
        print(f"idle for {args.seconds:.0f} s, {targets} targets, {len(agents)} agents")
        for k in pids:
            cpu = (after[k][0] - before[k][0]) * 10 / args.seconds
            sw = (after[k][1] - before[k][1]) / args.seconds
            print(f"{k}: {cpu:.2f} CPU-ms a second, {sw:.0f} context switches a second")
        if broker:
            print(f"broker: {(broker_after - broker_before) * 10 / args.seconds:.2f} CPU-ms a second")
    finally:
        for a in agents:
            a.terminate()
        for s in services:
            s.stop()
        vhost.delete()


if __name__ == "__main__":
    main()
