"""A loopback HTTP server for fetch tests: static files with Range support, and the slice of the Hugging Face
hub protocol that ``huggingface_hub.snapshot_download`` speaks (``/api/models/<repo>/revision/<rev>`` and
``/<repo>/resolve/<commit>/<file>``), so the real client code runs against it through ``HF_ENDPOINT``.

Faults on demand: ``truncate_once`` cuts the first response for a path after half its bytes (with the full
Content-Length announced), as a dropped connection does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class HubRepo:
    directory: Path
    sha: str
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit

    def files(self) -> list[str]:
        return sorted(p.relative_to(self.directory).as_posix() for p in self.directory.rglob("*") if p.is_file())


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased


class LoopbackServer:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.repos: dict[str, HubRepo] = {}
        self.token: str | None = None  # when set, hub requests need "Authorization: Bearer <token>"
        self.truncate_once: set[str] = set()
        self.requests: list[Request] = []
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet test output
                pass

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._lock:
                    server.requests.append(Request(self.command, self.path, headers))
                path = self.path.split("?", 1)[0]
                if path in server.files:
                    return self._send_bytes(path, server.files[path], head, {})
                if m := re.fullmatch(r"/api/models/(.+?/.+?)/revision/([^/]+)", path):
                    return self._api(m.group(1), m.group(2))
                if m := re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", path):
                    return self._resolve(m.group(1), m.group(2), m.group(3), head)
                self._status(404, {"error": "not found"})

            def _authorised(self) -> bool:
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    self._status(401, {"error": "Invalid credentials"})
                    return False
                return True

            def _repo_commit(self, repo: str, rev: str) -> tuple[HubRepo, str] | None:
                hub = server.repos.get(repo)
                if hub is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self._json_body({"error": "Repository not found"})
                    return None
                commit = hub.sha if rev == hub.sha else hub.refs.get(rev)
                if commit is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RevisionNotFound")
                    self._json_body({"error": "Invalid rev id"})
                    return None
                return hub, commit

            def _api(self, repo: str, rev: str) -> None:
                if not self._authorised():
                    return
                found = self._repo_commit(repo, rev)
                if found:
                    hub, commit = found
                    self._status(200, {"id": repo, "modelId": repo, "sha": commit, "private": False,
                                       "siblings": [{"rfilename": f} for f in hub.files()]})

            def _resolve(self, repo: str, rev: str, name: str, head: bool) -> None:
                if not self._authorised():
                    return
                found = self._repo_commit(repo, rev)
                if not found:
                    return
                hub, commit = found
                file = hub.directory / name
                if not file.is_file():
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    return self._json_body({"error": "Entry not found"})
                data = file.read_bytes()
                self._send_bytes(self.path.split("?", 1)[0], data, head,
                                 {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})

            def _send_bytes(self, key: str, data: bytes, head: bool, headers: dict[str, str]) -> None:
                start = 0
                if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
                    start = int(m.group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                body = data[start:]
                cut = False
                if not head and key in server.truncate_once:
                    with server._lock:
                        server.truncate_once.discard(key)
                    body, cut = body[: len(body) // 2], True
                    self.send_header("Connection", "close")
                self.end_headers()
                if head:
                    return
                with server._lock:  # counted before sending: the client may finish before this thread resumes
                    server.bytes_sent += len(body)
                self.wfile.write(body)
                if cut:
                    self.wfile.flush()
                    self.close_connection = True

            def _status(self, code: int, body: dict) -> None:
                self.send_response(code)
                self._json_body(body)

            def _json_body(self, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(raw)

        return Handler
