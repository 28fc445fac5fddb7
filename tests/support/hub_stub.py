"""A local stand-in for the Hugging Face hub's HTTP API: enough of it for ``HfApi.create_repo`` + ``upload_folder``
(+ ``model_info``'s visibility).

It answers the routes huggingface_hub calls for a small upload (repo creation, the pre-upload check that sends every
file inline as a "regular" file, the NDJSON commit, the model-card YAML check) and stores the committed files in
memory, so a test runs the real upload code against it without a network.  Requests it does not know are recorded
and answered 404.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["HubStub"]


class HubStub:
    """``with HubStub() as hub:`` serves on ``hub.url``; ``hub.repos[repo_id][path] -> bytes``; ``hub.unknown``."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: list[dict[str, Any]] = []
        self.unknown: list[str] = []
        self.auth: list[str | None] = []
        self.validated: list[str] = []  # model-card YAML sent to /api/validate-yaml
        self.private: dict[str, bool] = {}  # repo_id -> created private (create_repo's "private")
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Request-Id", "stub")
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.auth.append(self.headers.get("Authorization"))
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "validate-yaml"]:  # a README.md with front matter is checked first
                    stub.validated.append(json.loads(body).get("content", ""))
                    return self._reply(200, {"errors": [], "warnings": []})
                if parts[:3] == ["api", "repos", "create"]:
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    if repo not in stub.repos:  # an existing repo keeps its visibility, as on the hub
                        asked = req.get("visibility", "private" if req.get("private") else "public")  # new/old field
                        stub.private[repo] = asked != "public"
                    stub.repos.setdefault(repo, {})
                    return self._reply(200, {"url": f"{stub.url}/{repo}", "name": repo, "id": repo})
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("preupload", "commit"):
                    repo = f"{parts[2]}/{parts[3]}"
                    if repo not in stub.repos:
                        return self._reply(404, {"error": f"Repository {repo} not found"})
                    if parts[4] == "preupload":
                        files = json.loads(body)["files"]
                        return self._reply(200, {"files": [
                            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                        ]})  # fmt: skip
                    lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
                    header = next(x["value"] for x in lines if x["key"] == "header")
                    for x in lines:
                        if x["key"] == "file":
                            v = x["value"]
                            stub.repos[repo][v["path"]] = base64.b64decode(v["content"])
                    stub.commits.append({"repo": repo, "summary": header.get("summary")})
                    oid = f"{len(stub.commits):040x}"
                    return self._reply(200, {"commitUrl": f"{stub.url}/{repo}/commit/{oid}", "commitOid": oid})
                stub.unknown.append(f"POST {self.path}")
                return self._reply(404, {"error": "unknown route"})

            def do_GET(self) -> None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 4 and f"{parts[2]}/{parts[3]}" in stub.repos:
                    repo = f"{parts[2]}/{parts[3]}"  # model_info: enough of it for .private
                    return self._reply(200, {"id": repo, "modelId": repo, "private": stub.private[repo]})
                stub.unknown.append(f"GET {self.path}")
                self._reply(404, {"error": "unknown route"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStub:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
