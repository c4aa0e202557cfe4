#!/usr/bin/env python3
"""The web Live Activity in a real browser (Debian's chromium + chromium-driver,
headless), against the real gateway, router, sender and reference agents on
the local broker:

  1. the seed's request: best guess while typing, then routing → sending →
     replied, with preview lines appearing while it streams;
  2. Cancel of a slow one: the card ends `cancelled`, the dispatch too;
  3. the browser's own offline: a request typed offline waits in the page with
     its best guess, Edit › changes the route, and on reconnect it goes out
     with its id and is delivered to the chosen target; a dispatch queued for
     an offline target is rerouted from Edit › (targets with presence);
  4. a reload mid-stream: the card resumes from its last seq and ends replied;
  5. Cancel of a request waiting offline: it never leaves the page, while
     another queued with it goes out on reconnect;
  6. the gateway away while the browser is online: the request waits in the
     page and goes out by itself when the gateway is back (no reload).

Exit 0 when all pass; 1 with the failed step otherwise. Screenshots of the
states go to --screenshots (docs/screenshots to refresh the docs).

    python3 Tests/Browser/live_activity_test.py [--screenshots DIR]
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "evidence"))
import harness  # noqa: E402
import webdriver  # noqa: E402

SEED = "Reply to Lisa about the AGM agenda — short, confirm 14:00"
TOKEN = "browser-test-token-5d1e"


def card_state(c, selector=".activity"):
    return c.js(f"const a = document.querySelector({json.dumps(selector)}); return a ? a.dataset.state : null")


def card_of(c, dispatch_id):
    return f'.activity[data-id="{dispatch_id}"]'


class Gateway:
    def __init__(self, port):
        self.port = port

    def get(self, path):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, {}


def seed_request(c, base, shots):
    c.get(base + "/#token=" + TOKEN)
    c.type("#request-input", SEED)
    guess = c.wait("the best guess while typing",
                   lambda: c.js("const g = document.getElementById('guess'); return !g.hidden && g.textContent"))
    assert "Yemaya / Board Prep" in guess, guess
    c.screenshot(os.path.join(shots, "typing.png"))
    # Every state the card takes, recorded in the page as it changes.
    c.js("""window.__states = [];
        new MutationObserver((records) => { for (const r of records) {
            if (r.target.classList.contains('activity') && r.oldValue) window.__states.push(r.oldValue); } })
        .observe(document.getElementById('activities'),
                 {subtree: true, attributes: true, attributeOldValue: true, attributeFilter: ['data-state']});""")
    c.click("#dispatch")
    seen_states, previews = [], []
    deadline = time.time() + 30
    while time.time() < deadline:
        snap = c.js("""const a = document.querySelector('.activity');
            return a ? {state: a.dataset.state, preview: a.querySelector('.preview').innerText,
                        echo: a.querySelector('.echo').textContent, route: a.querySelector('.route').textContent,
                        eta: a.querySelector('.eta').hidden ? null : a.querySelector('.eta').textContent} : null""")
        if snap:
            if not seen_states or seen_states[-1] != snap["state"]:
                seen_states.append(snap["state"])
            if snap["preview"] and (not previews or previews[-1] != snap["preview"]):
                previews.append(snap["preview"])
            if snap["state"] == "sending" and snap["eta"] and len(previews) == 2:
                c.screenshot(os.path.join(shots, "sending.png"))
            if snap["state"] == "replied":
                assert snap["echo"] == SEED, snap["echo"]
                assert snap["route"] == "Yemaya · Board Prep", snap["route"]
                break
        time.sleep(0.03)
    assert seen_states and seen_states[-1] == "replied", f"states seen: {seen_states}"
    taken = c.js("return window.__states") + ["replied"]
    shown = [x for i, x in enumerate(taken) if i == 0 or taken[i - 1] != x]
    assert shown[:2] == ["drafted", "routing"] and shown[-2:] == ["sending", "replied"], f"states shown: {shown}"
    assert len(previews) >= 3, f"preview lines appeared one by one: {previews}"
    c.screenshot(os.path.join(shots, "replied.png"))
    return f"states {shown}, {len(previews)} preview updates"


def cancel_slow(c, base, gateway, shots):
    c.get(base + "/")
    c.type("#request-input", "@acme/ops restart the staging server")
    c.click("#dispatch")
    dispatch_id = c.wait("the card", lambda: c.js("const a = document.querySelector('.activity'); return a && a.dataset.id"))
    c.wait("sending", lambda: card_state(c, card_of(c, dispatch_id)) == "sending")
    asked = time.time()
    c.click(card_of(c, dispatch_id) + " .cancel")
    c.wait("cancelled", lambda: card_state(c, card_of(c, dispatch_id)) == "cancelled", timeout=5)
    took = time.time() - asked
    assert took < 1.5, f"cancelled after {took:.2f} s"
    status, latest = gateway.get(f"/v1/dispatches/{dispatch_id}")
    assert status == 200 and latest["state"] == "cancelled", (status, latest.get("state"))
    c.screenshot(os.path.join(shots, "cancelled.png"))
    return f"cancelled {took * 1000:.0f} ms after the click"


def offline_then_edit(c, base, gateway, shots):
    c.get(base + "/")
    c.wait("targets cached", lambda: c.js("return localStorage.getItem('fd.targets') !== null"))
    c.offline(True)
    c.wait("the page to see it is offline", lambda: c.js("return document.getElementById('network').dataset.online === 'false'"))
    c.type("#request-input", "Draft the grant report for Marcus")
    c.wait("an offline best guess", lambda: c.js("const g = document.getElementById('guess'); return !g.hidden && g.textContent"))
    c.click("#dispatch")
    dispatch_id = c.wait("the queued card", lambda: c.js(
        "const a = document.querySelector('.activity.local'); return a && a.dataset.id"))
    card = card_of(c, dispatch_id)
    text = c.js(f"return document.querySelector({json.dumps(card)}).innerText")
    assert "will dispatch on reconnect" in text and "Best guess: Yemaya / Fundraising" in text and "Drafted" in text, text
    c.screenshot(os.path.join(shots, "queued-offline.png"))
    # Nothing left the page.
    assert gateway.get(f"/v1/dispatches/{dispatch_id}")[0] == 404
    # Edit › picks another route while still offline.
    c.click(card + " .edit")
    c.wait("the targets", lambda: c.js(f"return document.querySelectorAll({json.dumps(card + ' .targets button')}).length > 0"))
    c.screenshot(os.path.join(shots, "edit.png"))
    c.click(card + ' .targets button[data-project="yemaya"][data-target="board-prep"]')
    c.wait("the new best guess", lambda: "Yemaya / Board Prep" in c.js(f"return document.querySelector({json.dumps(card)}).innerText"))
    c.offline(False)
    c.wait("replied at board-prep after reconnect", lambda: card_state(c, card) == "replied", timeout=30)
    status, latest = gateway.get(f"/v1/dispatches/{dispatch_id}")
    assert status == 200 and latest["target"]["id"] == "board-prep", (status, latest)
    assert c.js("return JSON.parse(localStorage.getItem('fd.outbox') || '[]').length") == 0

    # Queued at the server for an offline target: Edit › shows presence and reroutes.
    c.type("#request-input", "@acme/legal review the contract")
    c.click("#dispatch")
    queued_id = c.wait("a queued card", lambda: c.js(
        "const a = document.querySelector('.activity[data-state=\"queued\"]:not(.local)'); return a && a.dataset.id"))
    card = card_of(c, queued_id)
    c.click(card + " .edit")
    c.wait("presence", lambda: c.js(f"return document.querySelectorAll({json.dumps(card + ' .targets .dot.online')}).length > 0"))
    legal = c.js(f"return document.querySelector({json.dumps(card + ' .targets button[data-target=legal] .parked')}).textContent")
    assert "offline" in legal, legal
    c.click(card + ' .targets button[data-project="yemaya"][data-target="board-prep"]')
    c.wait("replied after the reroute", lambda: card_state(c, card) == "replied", timeout=30)
    status, latest = gateway.get(f"/v1/dispatches/{queued_id}")
    assert latest["target"]["id"] == "board-prep", latest
    return "offline request sent on reconnect to the edited route; a queued one rerouted"


def outbox_length(c):
    return c.js("return JSON.parse(localStorage.getItem('fd.outbox') || '[]').length")


def offline_cancel(c, base, gateway, shots):
    c.get(base + "/")
    c.wait("targets cached", lambda: c.js("return localStorage.getItem('fd.targets') !== null"))
    c.offline(True)
    c.wait("the page to see it is offline", lambda: c.js("return document.getElementById('network').dataset.online === 'false'"))
    ids = []
    for text in ["Draft the grant report for Marcus", "Reply to Lisa about the AGM minutes"]:
        c.type("#request-input", text)
        c.click("#dispatch")
        ids.append(c.wait(f"the queued card for {text!r}", lambda: c.js(
            f"const a = [...document.querySelectorAll('.activity.local')].find(x => !{json.dumps(ids)}.includes(x.dataset.id)); return a && a.dataset.id")))
    dropped, kept = ids
    c.click(card_of(c, dropped) + " .cancel")
    c.wait("the cancelled card", lambda: card_state(c, card_of(c, dropped)) == "cancelled", timeout=5)
    assert outbox_length(c) == 1, outbox_length(c)
    c.offline(False)
    # The outbox goes out in order: once the kept one has replied, the flush is past the cancelled one.
    c.wait("the kept one replied", lambda: card_state(c, card_of(c, kept)) == "replied", timeout=30)
    assert gateway.get(f"/v1/dispatches/{dropped}")[0] == 404, "a request cancelled offline was sent"
    assert card_state(c, card_of(c, dropped)) == "cancelled"
    assert outbox_length(c) == 0, outbox_length(c)
    return "a request cancelled while it waited offline never left the page; the other went out"


def gateway_away(c, base, gateway, shots, service):
    c.get(base + "/")
    c.wait("the page to be online", lambda: c.js("return document.getElementById('network').dataset.online === 'true'"))
    service.stop()
    # The browser is online, but its gateway is gone: the request waits in the page.
    c.type("#request-input", "Reply to Lisa about the AGM agenda")
    c.click("#dispatch")
    dispatch_id = c.wait("the queued card", lambda: c.js("const a = document.querySelector('.activity.local'); return a && a.dataset.id"))
    assert outbox_length(c) == 1, outbox_length(c)
    service.start()
    # No "online" event comes (the browser never went offline): the page tries again by itself.
    c.wait("replied once the gateway is back", lambda: card_state(c, card_of(c, dispatch_id)) == "replied", timeout=40)
    status, latest = gateway.get(f"/v1/dispatches/{dispatch_id}")
    assert status == 200 and latest["state"] == "replied", (status, latest.get("state"))
    assert outbox_length(c) == 0, outbox_length(c)
    return "a request typed while the gateway was away went out when it came back, with no reload"


def reload_mid_stream(c, base, gateway, shots):
    c.get(base + "/")
    c.type("#request-input", SEED)
    c.click("#dispatch")
    dispatch_id = c.wait("the card", lambda: c.js("const a = document.querySelector('.activity'); return a && a.dataset.id"))
    card = card_of(c, dispatch_id)
    c.wait("a preview line", lambda: c.js(
        f"const a = document.querySelector({json.dumps(card)}); return a && a.dataset.state === 'sending' && a.querySelector('.preview').innerText.length > 0"))
    c.js("location.reload()")
    c.wait("the card after the reload", lambda: c.js(f"return document.querySelector({json.dumps(card)}) !== null"))
    resumed = card_state(c, card)
    c.wait("replied after the reload", lambda: card_state(c, card) == "replied", timeout=30)
    count = c.js(f"return document.querySelectorAll({json.dumps(card)}).length")
    assert count == 1, f"{count} cards for one dispatch"
    status, latest = gateway.get(f"/v1/dispatches/{dispatch_id}")
    assert status == 200 and latest["state"] == "replied"
    return f"resumed in state {resumed}, ended replied"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screenshots", default=None, help="folder for the screenshots (default: a temporary one)")
    args = parser.parse_args()
    shots = os.path.abspath(args.screenshots or tempfile.mkdtemp(prefix="frontdesk-shots-"))
    log_dir = tempfile.mkdtemp(prefix="frontdesk-browser-")
    vhost = harness.Vhost("browser")
    tokens = os.path.join(log_dir, "tokens.json")
    with open(tokens, "w") as f:
        json.dump({hashlib.sha256(TOKEN.encode()).hexdigest(): "u-browser"}, f)
    gw_port = webdriver.free_port()
    services = [
        harness.Service("frontdesk-router", vhost.url, webdriver.free_port(), log_dir),
        harness.Service("frontdesk-sender", vhost.url, webdriver.free_port(), log_dir),
        harness.Service("frontdesk-gateway", vhost.url, webdriver.free_port(), log_dir,
                        {"FRONTDESK_GATEWAY_PORT": str(gw_port), "FRONTDESK_GATEWAY_TOKENS": tokens}),
    ]
    agents = []
    chrome = None
    failed = False
    try:
        for s in services:
            s.start()
        for target, delay in [("yemaya/board-prep", "450"), ("acme/ops", "20000")]:
            env = dict(os.environ, AMQP_URL=vhost.url)
            log = open(os.path.join(log_dir, f"agent-{target.replace('/', '-')}.log"), "ab")
            agents.append(harness.subprocess.Popen(
                [os.path.join(harness.BIN, "frontdesk"), "agent", "--target", target, "--delay-ms", delay], env=env, stdout=log, stderr=log))
        gateway = Gateway(gw_port)
        harness.wait("the gateway to be ready", lambda: harness.ready(services[2].port))
        # Both agents online before the browser starts.
        deadline = time.time() + 30
        while True:
            status, body = gateway.get("/v1/targets")
            online = {t["id"] for p in body.get("projects", []) for t in p["targets"] if t["online"]}
            if {"board-prep", "ops"} <= online:
                break
            if time.time() > deadline:
                raise AssertionError(f"agents not online: {online}")
            time.sleep(0.2)
        chrome = webdriver.Chrome()
        base = f"http://127.0.0.1:{gw_port}"
        steps = [
            ("the seed's request, routing to replied", lambda: seed_request(chrome, base, shots)),
            ("cancel of a slow one", lambda: cancel_slow(chrome, base, gateway, shots)),
            ("the offline path with Edit", lambda: offline_then_edit(chrome, base, gateway, shots)),
            ("a reload mid-stream", lambda: reload_mid_stream(chrome, base, gateway, shots)),
            ("cancel of a request waiting offline", lambda: offline_cancel(chrome, base, gateway, shots)),
            ("the gateway away and back", lambda: gateway_away(chrome, base, gateway, shots, services[2])),
        ]
        for name, step in steps:
            start = time.time()
            try:
                detail = step()
                print(f"browser: ok   {name} ({time.time() - start:.1f} s): {detail}")
            except Exception as e:  # noqa: BLE001 - reported, then the run fails
                failed = True
                print(f"browser: FAIL {name}: {e}")
                traceback.print_exc()
                try:
                    chrome.screenshot(os.path.join(shots, "failure.png"))
                except Exception:  # noqa: BLE001
                    pass
            for s in services:
                if s.crashed():
                    failed = True
                    print(f"browser: FAIL {s.executable} ended on its own (logs in {log_dir})")
        print(f"browser: screenshots in {shots}")
    finally:
        if chrome:
            chrome.quit()
        for a in agents:
            a.terminate()
            a.wait()
        for s in services:
            s.stop()
        vhost.delete()
    if failed:
        print(f"browser: service logs in {log_dir}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
