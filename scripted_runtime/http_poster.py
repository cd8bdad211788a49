"""Posts to the server's own HTTP API from the scheduler process, off-thread.

The scheduler thread is the one running scripts, so it must never wait on an
HTTP answer: the tokenizer manager may need scheduler progress to answer
(a generate request completes only when it is scheduled). Every post runs on
its own daemon thread with a deadline; its answer lands in a ``HttpAnswer``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import requests

POST_TIMEOUT_S = 600.0


@dataclass
class HttpAnswer:
    status: Optional[int] = None
    body: Any = None
    error: Optional[str] = None
    _answered: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.status is not None or self.error is not None

    def wait(self, timeout_s: float) -> bool:
        """Block (without stepping the scheduler) until the answer arrived or
        ``timeout_s`` passed; True when it arrived. Only for answers that need
        no further scheduler iteration."""
        return self._answered.wait(timeout_s)

    def as_dict(self) -> dict:
        return {"status": self.status, "body": self.body, "error": self.error}


class HttpPoster:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def post(self, path: str, payload: Optional[dict]) -> HttpAnswer:
        answer = HttpAnswer()
        thread = threading.Thread(
            target=self._post, args=(path, payload, answer),
            name=f"scripted-runtime-post{path}", daemon=True,
        )
        thread.start()
        return answer

    def _post(self, path: str, payload: Optional[dict], answer: HttpAnswer) -> None:
        try:
            resp = requests.post(
                self.base_url + path, json=payload, timeout=POST_TIMEOUT_S
            )
            try:
                body = resp.json()
            except ValueError:
                body = resp.text
            answer.body = body
            answer.status = resp.status_code
        except Exception as exc:  # noqa: BLE001 - reported to the script
            answer.error = f"{type(exc).__name__}: {exc}"
        finally:
            answer._answered.set()
