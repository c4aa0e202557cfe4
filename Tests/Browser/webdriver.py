"""A minimal W3C WebDriver client for chromedriver (standard library only):
what the browser tests need — sessions, navigation, script, clicks, typing,
screenshots, and Chrome's network emulation for the offline path."""
import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import harness  # scripts/evidence, on the path the browser test sets up

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriverError(Exception):
    pass


class Chrome:
    """chromedriver and one headless Chromium session."""

    def __init__(self, width=460, height=1000):
        driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
        binary = shutil.which("chromium") or "/usr/bin/chromium"
        self.port = free_port()
        self.driver = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while True:
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.time() > deadline:
                    raise WebDriverError("chromedriver did not start")
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},{height}",
                "--force-device-scale-factor=1", "--hide-scrollbars"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"binary": binary, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"{}").get("value", {}) if path != "/session" else json.loads(response.read())["value"]
        except urllib.error.HTTPError as e:
            raise WebDriverError(f"{method} {path}: {e.code} {e.read()[:400]!r}") from None

    def cmd(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self.cmd("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        return self.cmd("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def click(self, css):
        self.cmd("POST", f"/element/{self.find(css)}/click", {})

    def type(self, css, text):
        self.cmd("POST", f"/element/{self.find(css)}/value", {"text": text})

    def screenshot(self, path):
        png = base64.b64decode(self.cmd("GET", "/screenshot"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)

    def element_screenshot(self, css, path):
        png = base64.b64decode(self.cmd("GET", f"/element/{self.find(css)}/screenshot"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)

    def offline(self, offline):
        """The browser's own network: offline makes navigator.onLine false and fails every request."""
        self.cmd("POST", "/goog/cdp/execute", {"cmd": "Network.enable", "params": {}})
        self.cmd("POST", "/goog/cdp/execute", {"cmd": "Network.emulateNetworkConditions", "params": {
            "offline": offline, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}})

    def wait(self, what, condition, timeout=20.0, every=0.05):
        """Polls `condition()` until truthy; raises with `what` at the deadline."""
        return harness.wait(what, condition, timeout, every)

    def quit(self):
        try:
            self.cmd("DELETE", "")
        except Exception:  # noqa: BLE001 - the driver goes anyway
            pass
        self.driver.terminate()
        try:
            self.driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
