"""The SWE example's calls to the rlgate gateway: sessions, their interactions, feedback,
and the admin API's projects, actions and runs."""

from __future__ import annotations

from typing import Any

import httpx
from swe_agents import AGENT_NAMES
from swe_tasks import Task


class Gateway:
    def __init__(self, base_url: str, agent_key: str, admin_key: str) -> None:
        self.base = base_url.rstrip("/")
        self.agent_key = agent_key
        self.admin_key = admin_key
        self.http = httpx.Client(base_url=self.base, timeout=60)

    def _call(self, method: str, path: str, key: str, **kw: Any) -> Any:
        r = self.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def health(self) -> None:
        r = self.http.get("/health")
        if r.status_code != 200:
            raise RuntimeError(f"{self.base}/health: {r.status_code} {r.text[:200]}")

    def open_session(self, task: Task, agent: str) -> tuple[str, str]:
        body = {
            "task_id": task.name,  # the verifier's RLGATE_TASK_ID, the trainer's baseline key
            "agent_name": AGENT_NAMES[agent],
            "metadata": {"example": "swe"},
        }
        out = self._call("POST", "/v1/sessions", self.agent_key, json=body)
        return out["id"], out["api_key"]

    def end_session(self, session_id: str, session_key: str) -> None:
        self._call("POST", f"/v1/sessions/{session_id}/end", session_key)

    def interactions(self, session_id: str) -> int:
        out = self._call("GET", f"/v1/sessions/{session_id}", self.admin_key)
        return len(out.get("interactions") or [])

    def verifier_feedback(self, session_id: str) -> list[dict[str, Any]]:
        params = {"session_id": session_id, "source": "verifier"}
        return self._call("GET", "/v1/feedback", self.admin_key, params=params)["data"]

    def rate(self, session_id: str, passed: bool) -> dict[str, Any]:
        body = {
            "session_id": session_id,
            "value": 1 if passed else -1,
            "scale": "scalar",
            "min": -1,
            "max": 1,
            "source": "user",  # the only source a client writes (docs/security.md)
            "rater": "swe-tests",
            "idempotency_key": f"swe-tests:{session_id}",
        }
        return self._call("POST", "/feedback", self.agent_key, json=body)

    def project(self, project_id: str) -> dict[str, Any]:
        for p in self._call("GET", "/admin/api/overview", self.admin_key)["projects"]:
            if p["id"] == project_id:
                return p
        raise RuntimeError(f"project {project_id} is not visible to the admin key")

    def action(self, action: str, project_id: str) -> dict[str, Any]:
        body = {"project_id": project_id}
        return self._call("POST", f"/admin/api/actions/{action}", self.admin_key, json=body)

    def run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/admin/api/runs/{run_id}", self.admin_key)
