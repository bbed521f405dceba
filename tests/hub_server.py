"""A local stand-in for the Hugging Face Hub's file routes, for the tests of `blazr pull` (no hub is
reachable from CI or these machines, so the routes huggingface_hub and blazr.hub call are served here over
a temp dir of fake repositories: `<root>/<org>/<name>/<files>`).

Routes, as huggingface_hub 2.x calls them (`HF_ENDPOINT` points at `HubServer.endpoint`):
- GET `/api/models/{org}/{name}[/revision/{rev}]` → `{"id", "sha", "siblings": [{"rfilename", "size"}]}`;
  an unknown repository is 404 with `X-Error-Code: RepoNotFound`.
- HEAD / GET `/{org}/{name}/resolve/{rev}/{path}` → small files: 200 with X-Repo-Commit, ETag (a git-style
  sha1), Content-Length; LFS-like files (.gguf, .safetensors): 302 with X-Repo-Commit, X-Linked-Etag (the
  sha256), X-Linked-Size and a Location on a second port (another origin, as the hub's CDN is). An unknown
  file is 404 with `X-Error-Code: EntryNotFound`.
- GET / HEAD `/cdn/{org}/{name}/{path}` on the CDN port: the bytes, with `Range: bytes=N-` answered 206.

Faults: `drop_once` (paths whose next GET sends its full Content-Length, half the bytes, then closes the
connection), `refuse` (every request answered 503 while set; `refuse_after_drop` sets it right after a
drop, so a client's immediate retry fails too). Every request is recorded in `requests` as
(method, path, Range header or None).
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pth", ".onnx", ".msgpack")


class HubState:
    """The repositories served, the request log and the fault switches (shared by both ports)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str, str | None]] = []
        self.drop_once: set[str] = set()
        self.refuse = False
        self.refuse_after_drop = False
        self.cdn_port = 0
        self.lock = threading.Lock()
        self._commits: dict[str, str] = {}  # the repositories do not change while served

    def repo_dir(self, repo: str) -> Path | None:
        d = self.root / repo
        return d if d.is_dir() and len(Path(repo).parts) == 2 else None

    def files(self, repo: str) -> list[str]:
        d = self.root / repo
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())

    def commit(self, repo: str) -> str:
        if repo not in self._commits:
            h = hashlib.sha1()
            for f in self.files(repo):
                h.update(f.encode() + hashlib.sha256((self.root / repo / f).read_bytes()).digest())
            self._commits[repo] = h.hexdigest()
        return self._commits[repo]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # ---------------------------------------------------------------------------------------------- routes

    def _route(self, *, head: bool) -> None:
        state = self.server.state
        path = unquote(urlsplit(self.path).path)
        with state.lock:
            state.requests.append((self.command, path, self.headers.get("Range")))
            refuse = state.refuse
        if refuse:
            return self._send(503, b"busy")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._model_info("/".join(parts[2:4]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), "/".join(parts[4:]), head=head)
        if parts[0] == "cdn" and len(parts) >= 4:
            return self._cdn("/".join(parts[1:3]), "/".join(parts[3:]), path, head=head)
        self._send(404, b"no route")

    def _model_info(self, repo: str) -> None:
        state = self.server.state
        if state.repo_dir(repo) is None:
            return self._send(404, b"not found", {"X-Error-Code": "RepoNotFound"})
        siblings = [
            {"rfilename": f, "size": (state.root / repo / f).stat().st_size} for f in state.files(repo)
        ]
        body = json.dumps({"id": repo, "modelId": repo, "sha": state.commit(repo), "siblings": siblings})
        self._send(200, body.encode(), {"Content-Type": "application/json"})

    def _resolve(self, repo: str, filename: str, *, head: bool) -> None:
        state = self.server.state
        file = state.root / repo / filename
        if state.repo_dir(repo) is None:
            return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, head=head)
        if not file.is_file():
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head=head)
        data = file.read_bytes()
        headers = {"X-Repo-Commit": state.commit(repo)}
        if filename.endswith(_LFS_SUFFIXES):
            headers |= {
                "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{hashlib.sha1(b"lfs pointer " + data).hexdigest()}"',
                "Location": f"http://127.0.0.1:{state.cdn_port}/cdn/{repo}/{filename}",
            }
            return self._send(302, b"", headers, head=True)
        headers["ETag"] = f'"{hashlib.sha1(b"blob " + data).hexdigest()}"'
        self._send(200, data, headers, head=head)

    def _cdn(self, repo: str, filename: str, path: str, *, head: bool) -> None:
        state = self.server.state
        file = state.root / repo / filename
        if not file.is_file():
            return self._send(404, b"", head=head)
        data = file.read_bytes()
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes=") : -1])
        body = data[start:]
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if rng:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        with state.lock:
            drop = not head and path in state.drop_once
            state.drop_once.discard(path)
        if drop:
            return self._drop(body, headers, 206 if rng else 200)
        self._send(206 if rng else 200, body, headers, head=head)

    # ---------------------------------------------------------------------------------------------- replies

    def _send(
        self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False
    ) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _drop(self, body: bytes, headers: dict[str, str], status: int) -> None:
        """The full Content-Length announced, half the bytes sent, the connection closed."""
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        state = self.server.state
        with state.lock:
            state.refuse = state.refuse or state.refuse_after_drop
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a dropped connection is a fault we made
            super().handle_error(request, client_address)


class HubServer:
    """The hub (`endpoint`) and its CDN (another port) over `root`, each on a daemon thread."""

    def __init__(self, root: Path) -> None:
        self.state = HubState(root)
        self.hub = _Server(self.state)
        self.cdn = _Server(self.state)
        self.state.cdn_port = self.cdn.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.hub, self.cdn)]
        for t in self._threads:
            t.start()

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        return self.state.requests

    def cdn_gets(self) -> list[tuple[str, str | None]]:
        """(path, Range) of every GET of file bytes."""
        return [(p, r) for m, p, r in self.state.requests if m == "GET" and p.startswith("/cdn/")]

    def close(self) -> None:
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()
