"""An APNs stand-in for the tests: HTTP/2 over TLS (Python `h2`), with a
throw-away CA. It records every request (headers, body, arrival) and
answers by the device token's first characters:

  410…  → 410 {"reason": "Unregistered"}
  429…  → 429 {"reason": "TooManyRequests"} with `retry-after: 2` the first
          two times, then 200
  400…  → 400 {"reason": "BadDeviceToken"}
  403…  → 403 {"reason": "ExpiredProviderToken"}, however fresh the token
  503…  → 503 the first time, then 200
  500…  → 500 {"reason": "InternalServerError"}, always
  slow… → 200 after 300 ms (so that updates pile up behind one in flight)
  else  → 200

Checks each request's provider token (ES256 JWT) with the public key."""
import base64
import json
import os
import socket
import ssl
import subprocess
import threading
import time

import h2.config
import h2.connection
import h2.events
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature


def make_pki(folder):
    """A CA, a server certificate for localhost signed by it, and an APNs-like EC P-256 key (.p8)."""
    def run(*args):
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder)
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", "-days", "2", "-subj", "/CN=frontdesk test APNs CA")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(folder, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "AuthKey_TEST.p8")
    return {k: os.path.join(folder, v) for k, v in
            {"ca": "ca.pem", "cert": "server.pem", "key": "server.key", "p8": "AuthKey_TEST.p8"}.items()}


RETRY_AFTER_S = 2  # what a 429 asks for: longer than the pusher's own first back-offs (0.5 s, then 1 s)


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StandIn(threading.Thread):
    def __init__(self, pki):
        super().__init__(daemon=True)
        with open(pki["p8"], "rb") as f:
            self.public_key = serialization.load_pem_private_key(f.read(), password=None).public_key()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pki["cert"], pki["key"])
        self.context.set_alpn_protocols(["h2"])
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.requests = []  # dicts: path, headers, body, at, status, jwt_ok, connection
        self.seen = {}  # token → answers so far
        self.connections = 0

    def run(self):
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(raw,), daemon=True).start()

    def verify(self, bearer):
        try:
            header, claims, signature = bearer.split(".")
            raw = b64url_decode(signature)
            der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
            self.public_key.verify(der, f"{header}.{claims}".encode(), ec.ECDSA(hashes.SHA256()))
            h, c = json.loads(b64url_decode(header)), json.loads(b64url_decode(claims))
            return h.get("alg") == "ES256" and h.get("kid") == "KEYID12345" and c.get("iss") == "TEAMID1234" \
                and abs(c.get("iat", 0) - time.time()) < 3700
        except (ValueError, InvalidSignature, KeyError):
            return False

    def answer_for(self, token):
        with self.lock:
            n = self.seen.get(token, 0)
            self.seen[token] = n + 1
        if token.startswith("410"):
            return 410, {"reason": "Unregistered", "timestamp": int(time.time() * 1000)}, 0
        if token.startswith("429") and n < 2:
            return 429, {"reason": "TooManyRequests"}, 0
        if token.startswith("400"):
            return 400, {"reason": "BadDeviceToken"}, 0
        if token.startswith("403"):
            return 403, {"reason": "ExpiredProviderToken"}, 0
        if token.startswith("503") and n < 1:
            return 503, {"reason": "ServiceUnavailable"}, 0
        if token.startswith("500"):
            return 500, {"reason": "InternalServerError"}, 0
        if token.startswith("5"):  # "slow…" is no hex: slow tokens start with 5 and a second 5
            return 200, None, 0.3 if token.startswith("55") else 0
        return 200, None, 0

    def serve(self, raw):
        try:
            sock = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        with self.lock:
            self.connections += 1
            connection_number = self.connections
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        streams = {}
        send_lock = threading.Lock()

        def respond(stream_id, status, body, delay):
            if delay:
                time.sleep(delay)
            data = json.dumps(body).encode() if body else b""
            with send_lock:
                headers = [(":status", str(status))] + ([("content-type", "application/json")] if data else []) \
                    + ([("retry-after", str(RETRY_AFTER_S))] if status == 429 else [])
                conn.send_headers(stream_id, headers, end_stream=not data)
                if data:
                    conn.send_data(stream_id, data, end_stream=True)
                try:
                    sock.sendall(conn.data_to_send())
                except OSError:
                    pass

        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            with send_lock:
                events = conn.receive_data(data)
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    streams[event.stream_id] = {"headers": dict(event.headers), "body": b""}
                elif isinstance(event, h2.events.DataReceived):
                    streams[event.stream_id]["body"] += event.data
                    with send_lock:
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    s = streams.pop(event.stream_id)
                    path = s["headers"].get(":path", "")
                    token = path.rsplit("/", 1)[-1]
                    status, body, delay = self.answer_for(token)
                    bearer = s["headers"].get("authorization", "").removeprefix("bearer ")
                    record = {"path": path, "headers": s["headers"], "body": json.loads(s["body"] or b"{}"), "at": time.time(),
                              "status": status, "jwt_ok": self.verify(bearer), "connection": connection_number, "token": token}
                    with self.lock:
                        self.requests.append(record)
                    threading.Thread(target=respond, args=(event.stream_id, status, body, delay), daemon=True).start()
            with send_lock:
                try:
                    sock.sendall(conn.data_to_send())
                except OSError:
                    break
        sock.close()

    def for_token(self, token):
        with self.lock:
            return [r for r in self.requests if r["token"] == token]

    def close(self):
        self.listener.close()
