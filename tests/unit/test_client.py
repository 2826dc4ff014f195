"""ops/host/client.py against a loopback server that answers what a broken service would: the SSE reader's bounds and
error events, the error message of a non-200 answer, a /readyz wait that gives up. tests/integration/test_client.py
runs it against the real service."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ops.host import client

ANSWERS = {
    "/error": [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n', b'data: {"error": {"message": "boom"}}\n\n'],
    "/no-done": [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'] * 3,
    "/done": [b": keep-alive\n\n", b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', b"data: [DONE]\n\n"],
}
READYZ = {"status": 503, "body": {"ready": False, "reason": "loading"}}


class _SSE(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/chat/completions":  # chat(): the answer named by the request's X-Answer header
            self.path = self.headers.get("X-Answer", "")
        if self.path == "/plain-error":
            return self._json(502, b"<html>bad gateway</html>")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in ANSWERS[self.path]:
            self.wfile.write(chunk)
            self.wfile.flush()

    def do_GET(self):
        if self.path.startswith("/slow-body/"):  # a 503's headers now, its body after the client's read timeout
            self.send_response(503)
            self.send_header("Content-Length", "40")
            self.end_headers()
            self.wfile.flush()
            time.sleep(1.0)
            with contextlib.suppress(OSError):  # the client may have gone
                self.wfile.write(b"{}".ljust(40))
            return
        self._json(READYZ["status"], json.dumps(READYZ["body"]).encode())

    def _json(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def sse_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SSE)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join(5)


def _events(port: int, path: str, bound: float = 30, max_lines: int = 1000) -> tuple[list[dict], client.Events]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, "{}", {"Content-Type": "application/json"})
    events = client.Events(conn.getresponse(), time.perf_counter(), bound, max_lines)
    return list(events), events


def test_events_end_at_done(sse_server):
    got, events = _events(sse_server, "/done")
    assert events.done and got == [{"choices": [{"delta": {"content": "hi"}}]}]


def test_an_error_event_breaks_the_stream(sse_server):
    with pytest.raises(client.ChatError, match="stream error: boom"):
        _events(sse_server, "/error")


def test_a_stream_past_its_bound_breaks(sse_server):
    with pytest.raises(client.ChatError, match=r"no \[DONE\] within 2 lines"):
        _events(sse_server, "/no-done", max_lines=2)


def test_a_stream_that_ends_without_done_is_not_done(sse_server):
    got, events = _events(sse_server, "/no-done")
    assert len(got) == 3 and not events.done


def _chat(port: int, answer: str) -> client.Answer:
    return client.chat(f"http://127.0.0.1:{port}", {"stream": True}, timeout=10, headers={"X-Answer": answer})


def test_chat_keeps_the_text_before_a_stream_error(sse_server):
    a = _chat(sse_server, "/error")
    assert a.status == 200 and a.error == "stream error: boom" and a.text == "a" and a.chunks == 1 and not a.done
    with pytest.raises(client.ChatError, match="boom"):
        a.check()


def test_chat_of_a_stream_without_done_is_not_done_but_has_its_tokens(sse_server):
    a = _chat(sse_server, "/no-done")
    assert a.error is None and not a.done and a.text == "aaa" and 0 < a.first_token_s <= a.last_token_s <= a.total_s


def test_a_non_json_error_body_is_quoted(sse_server):
    a = _chat(sse_server, "/plain-error")
    assert a.status == 502 and a.error == "HTTP 502: <html>bad gateway</html>"


def test_a_refused_connection_is_the_answer_error():
    from tests.servers import free_port

    a = client.chat(f"http://127.0.0.1:{free_port()}", {"stream": True}, timeout=5)
    assert a.status is None and a.error.startswith("ConnectionRefusedError")
    with pytest.raises(client.ChatError, match="ConnectionRefusedError"):
        a.check()


def test_wait_ready_gives_up_naming_the_last_answer(sse_server):
    started = time.monotonic()
    with pytest.raises(client.NotReady, match=r"not ready after 0.6 s \(last /readyz: HTTP 503: .*loading"):
        client.wait_ready(f"http://127.0.0.1:{sse_server}", timeout=0.6, interval=0.1)
    assert time.monotonic() - started < 5


def test_wait_ready_stops_at_once_when_the_engine_gave_up(sse_server, monkeypatch):
    monkeypatch.setitem(READYZ, "body", {"ready": False, "failed": True, "reason": "model failed to load"})
    with pytest.raises(client.NotReady, match="will not become ready: model failed to load"):
        client.wait_ready(f"http://127.0.0.1:{sse_server}", timeout=60)


def test_wait_ready_stops_when_the_server_is_gone(sse_server):
    with pytest.raises(client.NotReady, match="exited"):
        client.wait_ready(f"http://127.0.0.1:{sse_server}", timeout=60, alive=lambda: "the service exited")


def test_a_status_whose_body_is_late_is_still_the_answer(sse_server):
    # A service compiling its model sent a 503's headers and its body only later: /readyz is "not ready yet", and a
    # wait goes on until its own bound (run24's bench lost a section to the TimeoutError this raised).
    url = f"http://127.0.0.1:{sse_server}/slow-body"
    assert client.readyz(url + "/readyz", timeout=0.3) == {"status": 503, "body": "", "error": None}
    assert client.get(url + "/metrics", timeout=0.3) == (503, b"")
    with pytest.raises(client.NotReady, match=r"not ready after 1 s \(last /readyz: HTTP 503"):
        client.wait_ready(url, timeout=1, interval=0.1)
