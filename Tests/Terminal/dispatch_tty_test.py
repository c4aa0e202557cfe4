#!/usr/bin/env python3
"""`frontdesk dispatch` on a real terminal (a pseudo-terminal), against the
real router, sender and reference agents on the local broker:

  1. the activity redraws in place under its id and the elapsed time ticks;
     `c` cancels it (exit 1, "Cancelled");
  2. Ctrl-C asks whether to cancel; `y` cancels;
  3. Ctrl-C then `n` leaves it running (exit 0) — it is still in flight;
  4. `e` on a queued dispatch edits its route; it then ends replied (exit 0).

Each step waits for what the terminal shows, with a deadline. Exit 0 when
all pass, 1 otherwise.

    python3 Tests/Terminal/dispatch_tty_test.py
"""
import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import termios
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "evidence"))
import harness  # noqa: E402

CLI = os.path.join(harness.BIN, "frontdesk")


class Terminal:
    """`frontdesk ARGS` with a pseudo-terminal as stdin and stdout."""

    def __init__(self, url, *args):
        self.master, slave = pty.openpty()
        env = dict(os.environ, AMQP_URL=url, TERM="xterm", NO_COLOR="1")
        def controlling_terminal():  # a session of its own with the pty as its terminal: Ctrl-C signals it
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen([CLI, *args], stdin=slave, stdout=slave, stderr=subprocess.DEVNULL, env=env, close_fds=True,
                                        preexec_fn=controlling_terminal)
        os.close(slave)
        self.raw = b""

    def pump(self, timeout=0.05):
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                self.raw += os.read(self.master, 65536)
            except OSError:
                pass

    @property
    def text(self):
        return self.raw.decode("utf-8", "replace")

    def wait_for(self, what, pattern, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.pump()
            match = re.search(pattern, self.text)
            if match:
                return match
        raise AssertionError(f"timed out waiting for {what}; the terminal showed: {self.text[-600:]!r}")

    def send(self, keys):
        os.write(self.master, keys)

    def exit_status(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.pump()
            if self.process.poll() is not None:
                self.pump()
                return self.process.returncode
        self.process.kill()
        raise AssertionError(f"still running; the terminal showed: {self.text[-600:]!r}")


def show(url, dispatch_id):
    out = subprocess.run([CLI, "show", dispatch_id, "--json"], env=dict(os.environ, AMQP_URL=url), capture_output=True, timeout=30)
    return json.loads(out.stdout)["latest"] if out.returncode == 0 else None


def cancel_with_c(url):
    t = Terminal(url, "dispatch", "@acme/ops restart the staging server")
    dispatch_id = t.wait_for("the id", r"dispatch ([0-9a-f-]{36})").group(1)
    t.wait_for("sending with keys shown", r"step 2 / 3[\s\S]*c cancel")
    # In place: the cursor goes back up to redraw (CSI n F), and the elapsed time ticks.
    first = t.wait_for("an elapsed time", r"(\d+:\d\d) elapsed").group(1)
    t.wait_for("the elapsed time to tick", r"(?!%s)\d+:\d\d elapsed" % re.escape(first), timeout=5)
    assert re.search(r"\x1b\[\d+F", t.text), "the activity is redrawn in place"
    t.send(b"c")
    t.wait_for("cancelled", r"Cancelled")
    status = t.exit_status()
    assert status == 1, f"exit {status}"
    assert show(url, dispatch_id)["state"] == "cancelled"
    return f"{dispatch_id[:8]} cancelled with c, exit 1; elapsed ticked from {first}"


def interrupt_then(url, answer):
    t = Terminal(url, "dispatch", "@acme/ops rotate the logs")
    dispatch_id = t.wait_for("the id", r"dispatch ([0-9a-f-]{36})").group(1)
    t.wait_for("sending", r"step 2 / 3")
    t.send(b"\x03")
    t.wait_for("the question", r"Cancel dispatch [0-9a-f-]{36}\? \[y/N\]")
    t.send(answer)
    status = t.exit_status()
    latest = show(url, dispatch_id)
    if answer == b"y":
        assert status == 1 and latest["state"] == "cancelled", (status, latest["state"])
        return "Ctrl-C, y: cancelled, exit 1"
    assert status == 0 and "left running" in t.text, (status, t.text[-300:])
    assert latest["state"] == "sending", latest["state"]
    subprocess.run([CLI, "cancel", dispatch_id], env=dict(os.environ, AMQP_URL=url), check=True, capture_output=True)
    return "Ctrl-C, n: left running (still sending), exit 0"


def edit_when_queued(url):
    t = Terminal(url, "dispatch", "@acme/legal review the contract")
    dispatch_id = t.wait_for("the id", r"dispatch ([0-9a-f-]{36})").group(1)
    t.wait_for("queued with the edit key", r"e edit route")
    t.send(b"e")
    t.wait_for("the route prompt", r"New route")
    t.send(b"yemaya/board-prep\r")
    status = t.exit_status(timeout=30)
    latest = show(url, dispatch_id)
    assert status == 0 and latest["state"] == "replied" and latest["target"]["id"] == "board-prep", (status, latest)
    return "queued, e → yemaya/board-prep, replied, exit 0"


def main():
    log_dir = tempfile.mkdtemp(prefix="frontdesk-tty-")
    vhost = harness.Vhost("tty")
    services = [harness.Service(n, vhost.url, p, log_dir) for n, p in [("frontdesk-router", 0), ("frontdesk-sender", 0)]]
    agents = []
    failed = False
    try:
        for s in services:
            s.start()
        for target, delay in [("yemaya/board-prep", "100"), ("acme/ops", "60000")]:
            log = open(os.path.join(log_dir, f"agent-{target.replace('/', '-')}.log"), "ab")
            agents.append(subprocess.Popen([CLI, "agent", "--target", target, "--delay-ms", delay],
                                           env=dict(os.environ, AMQP_URL=vhost.url), stdout=log, stderr=log))
        deadline = time.time() + 30
        while True:
            out = subprocess.run([CLI, "targets", "--json"], env=dict(os.environ, AMQP_URL=vhost.url), capture_output=True)
            rows = json.loads(out.stdout or b"[]") if out.returncode == 0 else []
            if {"board-prep", "ops"} <= {r["target"] for r in rows if r["online"]}:
                break
            if time.time() > deadline:
                raise AssertionError(f"agents not online: {rows}")
            time.sleep(0.2)
        for name, step in [("c cancels", lambda: cancel_with_c(vhost.url)),
                           ("Ctrl-C then y cancels", lambda: interrupt_then(vhost.url, b"y")),
                           ("Ctrl-C then n leaves it running", lambda: interrupt_then(vhost.url, b"n")),
                           ("e edits the route while queued", lambda: edit_when_queued(vhost.url))]:
            try:
                print(f"tty: ok   {name}: {step()}")
            except Exception as e:  # noqa: BLE001 - reported, then the run fails
                failed = True
                print(f"tty: FAIL {name}: {e}")
                traceback.print_exc()
    finally:
        for a in agents:
            a.terminate()
            a.wait()
        for s in services:
            s.stop()
        vhost.delete()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
