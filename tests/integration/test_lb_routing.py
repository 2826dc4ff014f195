"""The lb's routing on a real nginx with its JavaScript module: a conversation keeps its host, whatever the client.

nginx runs the site and the affinity script exactly as the lb role renders them, in front of three loopback
backends that answer with their own name (and 429 when told they are full, or nothing once stopped). What is
checked is where each request lands: the model plays no part here (tests/e2e/test_affinity.py has the fleet).
"""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from ops.host.lb import set_drained
from tests.nginx_site import NJS_MODULE, Nginx
from tests.prereq import require, require_tools


class Backend:
    """A service host stand-in: answers every request with its name. Chat requests get a 429 while it is ``busy``
    and the load balancer bounds their wait (X-Vlfleet-Max-Wait), as the service does when its queued work is over
    the bound; always while it is ``full`` (its queue is)."""

    def __init__(self, name: str, port: int = 0):
        self.name, self.busy, self.full, self.seen = name, False, False, []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                backend.seen.append((self.path, dict(self.headers)))
                bounded = "X-Vlfleet-Max-Wait" in self.headers
                refused = self.command == "POST" and (backend.full or (backend.busy and bounded))
                status = 429 if refused else 200
                body = json.dumps({"host": backend.name}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Served-By", backend.name)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def backends():
    started = [Backend(f"h{i}") for i in (1, 2, 3)]
    yield started
    for b in started:
        b.stop()


def _upstreams(backends, drained=()) -> list[dict]:
    return [{"name": b.name, "address": "127.0.0.1", "port": b.port, "down": b.name in drained} for b in backends]


@pytest.fixture
def lb(tmp_path, backends):
    require_tools("nginx")
    require(NJS_MODULE.is_file(), f"needs nginx's JavaScript module {NJS_MODULE} (libnginx-mod-http-js)")
    port = _free_port()
    nginx = Nginx(tmp_path, _upstreams(backends), lb_listen_port=port, lb_fail_timeout=1).start()
    nginx.url = f"http://127.0.0.1:{port}"
    yield nginx
    nginx.stop()


def _free_port() -> int:
    with socket.socket() as sock:  # closed again before nginx binds it
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _png(colour: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), colour).save(buf, format="PNG")
    return buf.getvalue()


def _opening(i: int) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(_png((i, 2 * i, 3 * i))).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": f"What is in picture {i}?"}]}]


def _chat(lb, messages: list[dict], **extra) -> requests.Response:
    r = requests.post(lb.url + "/v1/chat/completions", json={"messages": messages, **extra}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _follow_up(opening: list[dict], n: int) -> list[dict]:
    history = list(opening)
    for k in range(n):
        history += [{"role": "assistant", "content": f"answer {k}"}, {"role": "user", "content": f"and {k}?"}]
    return history


def test_a_stateless_conversation_keeps_its_host_and_conversations_spread(lb):
    placed = {}
    for i in range(12):
        hosts = {_chat(lb, _follow_up(_opening(i), n)).json()["host"] for n in range(4)}
        assert len(hosts) == 1, f"conversation {i} was answered by {hosts}"
        placed[i] = hosts.pop()
    # twelve conversations over three hosts: every host holds some, none holds them all
    assert set(placed.values()) == {"h1", "h2", "h3"}, placed


def test_the_web_ui_form_and_an_api_client_asking_the_same_share_a_host(lb):
    for i in range(6):
        png = _png((i, 2 * i, 3 * i))
        form = requests.post(lb.url + "/chat", data={"question": f"What is in picture {i}?"},
                             files={"image": ("a.png", png, "image/png")}, timeout=30)
        api = _chat(lb, _opening(i))
        assert form.headers["X-Affinity-Key"] == api.headers["X-Affinity-Key"]
        assert form.json()["host"] == api.json()["host"]
        # the web UI sends the key back with each follow-up (and its question alone): same host
        follow = requests.post(lb.url + "/chat", data={"question": "and the colours?", "session": "s"},
                               files={"image": ("a.png", png, "image/png")},
                               headers={"X-Affinity-Key": form.headers["X-Affinity-Key"]}, timeout=30)
        assert follow.json()["host"] == form.json()["host"]


def test_an_explicit_key_or_user_decides_and_other_requests_are_balanced(lb, backends):
    by_key = {_chat(lb, _opening(n), user="alice").json()["host"] for n in range(6)}
    assert len(by_key) == 1  # one user's conversations: one host
    got = [requests.get(lb.url + "/healthz", timeout=30).json()["host"] for _ in range(6)]
    assert set(got) == {"h1", "h2", "h3"}, got  # no key: least_conn over all of them
    # the wait bound goes to the hosts with chat requests only
    chat_headers = [h for path, h in backends[0].seen + backends[1].seen + backends[2].seen if path != "/healthz"]
    assert chat_headers and all(h.get("X-Vlfleet-Max-Wait") == "10" for h in chat_headers)
    assert all("X-Vlfleet-Max-Wait" not in h for path, h in backends[0].seen if path == "/healthz")


def test_a_busy_host_spills_its_turn_to_the_next_host_and_keeps_its_keys(lb, backends):
    first = _chat(lb, _opening(1))
    home = next(b for b in backends if b.name == first.json()["host"])
    home.busy = True
    spilled = [_chat(lb, _follow_up(_opening(1), n)) for n in (1, 2, 3)]
    assert {r.json()["host"] for r in spilled} - {home.name} == {r.json()["host"] for r in spilled}
    assert len({r.json()["host"] for r in spilled}) == 1  # the ring's next host: one place for the overflow too
    assert {r.headers["X-Vlfleet-Route"] for r in spilled} == {"spill"}
    home.busy = False
    # a 429 is not a failure of the host: the next turn is back home at once, not after fail_timeout
    back = _chat(lb, _follow_up(_opening(1), 4))
    assert back.json()["host"] == home.name and back.headers["X-Vlfleet-Route"] == "affinity"


def test_every_host_busy_queues_on_the_least_busy_and_every_host_full_is_a_429(lb, backends):
    for b in backends:
        b.busy = True
    r = _chat(lb, _opening(1))
    assert r.headers["X-Vlfleet-Route"] == "overflow"  # no bound on the last try: a host queues it
    for b in backends:
        b.full = True
    for i in range(4):  # over and over: a full host is never taken for a dead one (no 502)
        r = requests.post(lb.url + "/v1/chat/completions", json={"messages": _opening(i)}, timeout=30)
        assert r.status_code == 429 and r.json()["host"], r.text


def test_a_drained_host_moves_only_its_own_conversations(lb, backends):
    placed = {i: _chat(lb, _opening(i)).json()["host"] for i in range(12)}
    gone = Counter(placed.values()).most_common(1)[0][0]
    text, drained = set_drained((lb.dir / "site.conf").read_text(), [gone], [])
    assert text == lb.write(_upstreams(backends, drained=[gone])) and drained == [gone]
    lb.reload()
    moved = {i: _chat(lb, _opening(i)).json()["host"] for i in range(12)}
    for i, host in placed.items():
        if host == gone:
            assert moved[i] != gone
        else:
            assert moved[i] == host, f"conversation {i} moved from {host} to {moved[i]} though {host} stayed"
    lb.write(_upstreams(backends))
    lb.reload()
    assert {i: _chat(lb, _opening(i)).json()["host"] for i in range(12)} == placed  # back where they were


def test_a_stopped_host_loses_no_request_and_its_keys_come_back(lb, backends):
    placed = {i: _chat(lb, _opening(i)).json()["host"] for i in range(9)}
    victim = backends[0]
    port = victim.port
    victim.stop()
    during = {i: _chat(lb, _opening(i)).json()["host"] for i in range(9)}  # each a 200 (_chat asserts it)
    assert victim.name not in during.values()
    assert all(during[i] == h for i, h in placed.items() if h != victim.name)
    backends[0] = Backend(victim.name, port)
    deadline = time.monotonic() + 15  # lb_fail_timeout=1: nginx tries the host again after a second
    while time.monotonic() < deadline:
        if {i: _chat(lb, _opening(i)).json()["host"] for i in range(9)} == placed:
            break
        time.sleep(0.5)
    assert {i: _chat(lb, _opening(i)).json()["host"] for i in range(9)} == placed


def test_affinity_off_renders_least_conn_alone_without_the_javascript_module(tmp_path, backends):
    require_tools("nginx")
    nginx = Nginx(tmp_path, _upstreams(backends), lb_affinity=False)
    text = (tmp_path / "site.conf").read_text()
    assert "js_import" not in text and "hash " not in text and "vlfleet_affinity" not in text
    done = nginx.test()
    assert done.returncode == 0, done.stderr
