"""A Hugging Face Hub on localhost, with just what huggingface_hub's downloads ask of it: repo info with
its file list (``GET /api/models/{repo}[/revision/{rev}]``), the file tree (``GET /api/models/{repo}/tree/{rev}``)
and the files themselves (``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag`` and
``Content-Length``). Errors carry the ``X-Error-Code`` header that huggingface_hub turns into its exceptions.

Point ``HF_ENDPOINT`` at :attr:`FakeHub.url`; every request is logged in :attr:`FakeHub.requests`, so that a
test can check which files were fetched."""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes | Path]  # a file's bytes, or a file on disk served as is (large ones)
    gated: bool = False  # requests without a token are refused, as for a gated repo whose terms are not accepted
    _etags: dict[str, str] = field(default_factory=dict, repr=False)

    def etag(self, name: str) -> str:
        """The file's SHA-256, as the Hub gives for LFS files (computed once: some files are large)."""
        if name not in self._etags:
            self._etags[name] = hashlib.sha256(_content(self.files[name])).hexdigest()
        return self._etags[name]

    @property
    def sha(self) -> str:
        """A commit hash that changes with the repo's content."""
        h = hashlib.sha1()
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + self.etag(name).encode())
        return h.hexdigest()


def _content(data: bytes | Path) -> bytes:
    return data.read_bytes() if isinstance(data, Path) else data


def _size(data: bytes | Path) -> int:
    return data.stat().st_size if isinstance(data, Path) else len(data)


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def downloads(self, repo_id: str) -> list[str]:
        """The files of ``repo_id`` whose bytes were sent (GET of a resolve URL), in order."""
        prefix = f"/{repo_id}/resolve/"
        return [
            path.split("/", 1)[1]
            for method, url in self.requests
            if method == "GET" and url.startswith(prefix)
            for path in [url[len(prefix) :]]
        ]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read hub.requests
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path))
        if path.startswith("/api/models/"):
            self._api(path.removeprefix("/api/models/"))
        elif "/resolve/" in path:
            self._resolve(path.lstrip("/"), body)
        else:
            self._error(404, "EntryNotFound", f"no route {path}")

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if repo.gated and not self.headers.get("Authorization"):
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted")
            return None
        return repo

    def _revision(self, repo: Repo, revision: str) -> bool:
        if revision in ("main", repo.sha):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return False

    def _api(self, rest: str) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        repo = self._repo(repo_id)
        if repo is None:
            return
        if not tail or tail[0] == "revision":  # repo info
            if tail and not self._revision(repo, "/".join(tail[1:])):
                return
            info = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.sha,
                "private": False,
                "gated": repo.gated,
                "siblings": [{"rfilename": name} for name in sorted(repo.files)],
            }
            self._json(info)
        elif tail[0] == "tree" and len(tail) >= 2:
            if not self._revision(repo, tail[1]):
                return
            under = "/".join(tail[2:])
            entries = [
                {"type": "file", "path": name, "size": _size(data), "oid": repo.etag(name)[:40]}
                for name, data in sorted(repo.files.items())
                if not under or name.startswith(under + "/")
            ]
            self._json(entries)
        else:
            self._error(404, "EntryNotFound", f"no API route {rest}")

    def _resolve(self, rest: str, body: bool) -> None:
        repo_id, _, tail = rest.partition("/resolve/")
        repo = self._repo(repo_id)
        if repo is None:
            return
        revision, _, name = tail.partition("/")
        if not self._revision(repo, revision):
            return
        if name not in repo.files:
            self._error(404, "EntryNotFound", f"{name} is not in {repo_id}")
            return
        data = _content(repo.files[name])
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged.endswith("-"):
            start = int(ranged[len("bytes=") : -1])
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", repo.sha)
        self.send_header("ETag", f'"{repo.etag(name)}"')
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start:])

    def _json(self, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    """``hub`` answering on a free localhost port (its :attr:`FakeHub.url`) until the block ends."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def hub_env(hub: FakeHub, home: Path, **extra: str) -> dict[str, str]:
    """This process's environment pointed at ``hub``, with the Hugging Face cache under ``home``
    (``HF_HOME``; ``HF_HUB_CACHE`` left to follow it) and no token, telemetry or offline switch of the
    machine's own. ``extra`` adds or overrides variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_OFFLINE"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(home),
        HF_HUB_DISABLE_TELEMETRY="1",
        CUDA_VISIBLE_DEVICES="",
        NO_COLOR="1",
        COLUMNS="200",
    )
    env.update(extra)
    return env


def random_bytes(size: int, seed: int) -> bytes:
    """Reproducible file contents, different per seed."""
    return random.Random(seed).randbytes(size)
