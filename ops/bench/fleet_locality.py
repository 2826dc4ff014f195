"""Does a conversation keep its host? Cache locality measured through a fleet's load balancer.

Every saving a host makes for a returning user lives on that host: its encoded images, the KV state that follows a
conversation, its answer cache. Conversations from concurrent clients go through the lb's nginx, as users would
send them: web UI sessions (multipart /chat, the session id and X-Affinity-Key the page sends) and stateless
OpenAI clients (the openai SDK, re-sending image and history each turn), each a first question about its own
image then follow-ups; and the same first question again from another client. Per turn the answering host comes
from the X-Served-By header; the hosts' /metrics, read before and after, give the vision encoder runs, reused
prompt tokens and answer-cache hits summed over the fleet.

Written as one JSON file per run plus a markdown table of every run in the directory (``render``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
import json
import queue
import statistics
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ops import machine
from ops.fleet.inventory import Inventory
from ops.fleet.prometheus_text import samples
from ops.host.probe import FOLLOWUP_QUESTIONS

RESULT_VERSION = 1
COUNTERS = {  # what the hosts' /metrics say was reused or recomputed
    "vision_encoder_runs": "vlfleet_vision_encoder_runs_total",
    "reused_prompt_tokens": "vlfleet_reused_prompt_tokens_total",
    "answer_cache_hits": "vlfleet_answer_cache_hits_total",
    "session_reuse": "vlfleet_session_reuse_total",
}

@dataclass(frozen=True)
class Plan:
    conversations: int = 12
    followups: int = 3
    clients: int = 4  # conversations in flight at once
    tokens: int = 8  # per answer at most: the web UI and the SDK ask alike, so a repeat is the same request
    image_px: tuple[int, int] = (416, 277)
    timeout_s: float = 300.0  # per request
    max_seconds: float = 1800.0  # the whole run, whatever happens


@dataclass
class Turn:
    conversation: int
    client: str  # webui | openai | repeat
    turn: int  # 0 = the first question
    host: str = ""
    route: str = ""  # X-Vlfleet-Route: affinity, overflow, or "" (no affinity routing)
    answer_cache: str = ""
    image_cache: str = ""
    session_reused: bool = False
    status: int = 0
    first_token_s: float | None = None
    queue_wait_s: float = 0.0  # X-Queue-Wait: waited behind other requests on its host, not for its own work
    error: str = ""


def image_data(run_id: str, index: int, size: tuple[int, int]) -> bytes:
    """A PNG of its own per run and conversation (a gradient beside a colour from both): no host has seen it."""
    from PIL import Image

    w, h = size
    img = Image.new("RGB", size, tuple(hashlib.sha256(f"{run_id}/{index}".encode()).digest()[:3]))
    img.paste(Image.linear_gradient("L").resize((w // 2, h)).convert("RGB"), (0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _first_question(run_id: str, index: int) -> str:
    return f"What is in picture {index} of run {run_id}?"


class Client:
    """One conversation's turns through the load balancer, timed to the first streamed token."""

    def __init__(self, base_url: str, model: str, plan: Plan):
        self.base_url, self.model, self.plan = base_url, model, plan

    def _headers(self, turn: Turn, headers) -> None:
        turn.host = headers.get("X-Served-By", "")
        turn.route = headers.get("X-Vlfleet-Route", "")
        turn.answer_cache = headers.get("X-Cache", "")
        turn.image_cache = headers.get("X-Image-Cache", "")
        turn.session_reused = headers.get("X-Session-Reused") == "1"
        turn.queue_wait_s = float(headers.get("X-Queue-Wait") or 0)

    def openai(self, turn: Turn, messages: list[dict]) -> str:
        """A streamed chat completion with the openai SDK; returns the answer's text."""
        from openai import OpenAI

        client = OpenAI(base_url=self.base_url + "/v1", api_key="none", timeout=self.plan.timeout_s, max_retries=0)
        started, pieces = time.monotonic(), []
        with client.chat.completions.with_streaming_response.create(
                model=self.model, messages=messages, stream=True, max_tokens=self.plan.tokens,
                temperature=0) as response:
            turn.status = response.status_code
            self._headers(turn, response.headers)
            for chunk in response.parse():
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text:
                    turn.first_token_s = turn.first_token_s or time.monotonic() - started
                    pieces.append(text)
        return "".join(pieces)

    def webui(self, turn: Turn, question: str, image: bytes, state: dict) -> None:
        """What the web UI's page sends: multipart /chat, with the session id and the X-Affinity-Key of the
        conversation's first answer (``state``, updated from this answer)."""
        import requests

        form = {"question": question, "detail": "auto", "max_tokens": str(self.plan.tokens)}
        if state.get("session"):
            form["session"] = state["session"]
        headers = {"X-Affinity-Key": state["affinity"]} if state.get("affinity") else {}
        started, event = time.monotonic(), ""
        with requests.post(self.base_url + "/chat", data=form, files={"image": ("image.png", image, "image/png")},
                           headers=headers, stream=True, timeout=self.plan.timeout_s) as r:
            turn.status = r.status_code
            self._headers(turn, r.headers)
            state.setdefault("affinity", r.headers.get("X-Affinity-Key"))
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "token" and turn.first_token_s is None:
                    turn.first_token_s = time.monotonic() - started
                elif line.startswith("data: ") and event == "done":
                    state["session"] = json.loads(line[6:]).get("session")
                elif line.startswith("data: ") and event == "error":
                    turn.error = json.loads(line[6:]).get("message", "error")


def conversation(client: Client, run_id: str, index: int, kind: str, record: Callable[[Turn], None]) -> None:
    """A first question about the conversation's own image, then the plan's follow-ups, in turn."""
    image, first = image_data(run_id, index, client.plan.image_px), _first_question(run_id, index)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    history = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                            {"type": "text", "text": first}]}]
    state: dict = {}  # the web UI's session id and affinity key
    for n, question in enumerate((first, *FOLLOWUP_QUESTIONS[:client.plan.followups])):
        turn = Turn(index, kind, n)
        try:
            if kind == "webui":
                client.webui(turn, question, image, state)
            else:
                if n:
                    history.append({"role": "user", "content": question})
                history.append({"role": "assistant", "content": client.openai(turn, history)})
        except Exception as e:
            turn.error = f"{type(e).__name__}: {e}"[:300]
        record(turn)
        if n == 0:  # another client asks the same first question (the answer cache's case)
            repeat = Turn(index, "repeat", 0)
            try:
                client.openai(repeat, history[:1])
            except Exception as e:
                repeat.error = f"{type(e).__name__}: {e}"[:300]
            record(repeat)


def metrics(host_url: str) -> dict[str, float]:
    with urllib.request.urlopen(host_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {name: sum(v for _labels, v in samples(text, metric)) for name, metric in COUNTERS.items()}


def run(inventory: Inventory, plan: Plan, label: str, echo: Callable[[str], None] = print) -> dict:
    """The plan's conversations through the fleet's first lb host; the result (``summarize`` over the turns)."""
    lbs, hosts = inventory.group("lb"), inventory.group("vlm")
    if not lbs or not hosts:
        raise ValueError("the inventory needs an `lb` group and a `vlm` group: the run goes through the lb")
    base = f"http://{lbs[0].address}:{int(lbs[0].var('lb_listen_port', 80))}"
    host_urls = {h.name: f"http://{h.address}:{int(h.var('vlm_service_port', 8000))}" for h in hosts}
    model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=30).read())["data"][0]["id"]
    before = {name: metrics(url) for name, url in host_urls.items()}
    turns: list[Turn] = []
    lock = threading.Lock()
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:8]  # the hosts' caches hold earlier runs' images and answers: none of this run's

    def record(turn: Turn) -> None:
        with lock:
            turns.append(turn)
            echo(f"[locality] {len(turns)}/{plan.conversations * (plan.followups + 2)} conversation "
                 f"{turn.conversation} {turn.client} turn {turn.turn}: {turn.host or '?'} "
                 f"{'' if turn.first_token_s is None else f'{turn.first_token_s:.2f}s'} {turn.error}")

    work: queue.Queue[int] = queue.Queue()
    for i in range(plan.conversations):
        work.put(i)
    client = Client(base, model, plan)

    def worker() -> None:
        while time.monotonic() - started < plan.max_seconds:
            try:
                i = work.get_nowait()
            except queue.Empty:
                return
            conversation(client, run_id, i, "webui" if i % 2 == 0 else "openai", record)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(plan.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=plan.max_seconds + plan.timeout_s)
    after = {name: metrics(url) for name, url in host_urls.items()}
    per_host = {name: {k: after[name][k] - before[name][k] for k in COUNTERS} for name in host_urls}
    seconds = round(time.monotonic() - started, 1)
    return {
        "version": RESULT_VERSION, "label": label, "run_id": run_id,
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.describe(), "fleet": {"hosts": sorted(host_urls), "lb": lbs[0].name,
                                                 "kinds": {h.name: h.var("vlfleet_staging_kind", "") for h in hosts}},
        "plan": asdict(plan),
        "turns": [asdict(t) for t in sorted(turns, key=lambda t: (t.conversation, t.turn, t.client == "repeat"))],
        "hosts": per_host, "summary": {"clients": plan.clients, "seconds": seconds,
                                       **summarize(turns, per_host, plan)},
    }


def _ratio_to_first(follow: list[Turn], firsts: dict[int, Turn], queue: bool) -> float | None:
    """Median over follow-ups of their first token / their conversation's first question's; without the queue
    wait (``queue`` False) it is what the host's caches saved, whatever else the host was busy with."""
    def cost(t: Turn) -> float | None:
        return t.first_token_s if queue or t.first_token_s is None else max(1e-3, t.first_token_s - t.queue_wait_s)

    ratios = [cost(t) / cost(firsts[t.conversation]) for t in follow
              if cost(t) and t.conversation in firsts and cost(firsts[t.conversation])]
    return round(statistics.median(ratios), 3) if ratios else None


def summarize(turns: list[Turn], per_host: dict[str, dict[str, float]], plan: Plan) -> dict:
    asked = [t for t in turns if t.client != "repeat"]
    firsts = {t.conversation: t for t in asked if t.turn == 0}
    follow = [t for t in asked if t.turn > 0]
    repeats = [t for t in turns if t.client == "repeat"]
    stayed = [t for t in follow if firsts.get(t.conversation) and t.host == firsts[t.conversation].host]
    served = Counter(t.host for t in turns if t.host)
    even = len(turns) / max(1, len(per_host))
    total = {k: sum(h[k] for h in per_host.values()) for k in COUNTERS}
    return {
        "requests": len(turns), "failed": sum(1 for t in turns if t.error or t.status != 200),
        "followup_first_token_ratio": _ratio_to_first(follow, firsts, queue=True),
        "followup_first_token_ratio_without_queue": _ratio_to_first(follow, firsts, queue=False),
        "followups_on_first_host": round(len(stayed) / len(follow), 3) if follow else None,
        "repeats_from_answer_cache": round(sum(t.answer_cache == "hit" for t in repeats) / len(repeats), 3)
        if repeats else None,
        "overflowed": sum(t.route in ("spill", "overflow") for t in turns),  # went past the key's host
        "vision_encoder_runs": int(total["vision_encoder_runs"]),
        # each conversation's image must be encoded once; what is over that is a follow-up or repeat on a cold host
        "vision_encoder_runs_over_one_per_image": int(total["vision_encoder_runs"]) - plan.conversations,
        "reused_prompt_tokens": int(total["reused_prompt_tokens"]),
        "answer_cache_hits": int(total["answer_cache_hits"]),
        "max_share_of_even": round(max(served.values()) / even, 2) if served else None,
        "turns_per_host": dict(sorted(served.items())),
    }


# --- the results directory: one JSON per run, one markdown table of them all ----------------------------------

COLUMNS = (  # (header, summary key, format)
    ("clients at once", "clients", "{}"),
    ("whole workload", "seconds", "{:.0f} s"),
    ("follow-up first token / first question's (median)", "followup_first_token_ratio", "{:.2f}x"),
    ("the same without queue waits", "followup_first_token_ratio_without_queue", "{:.2f}x"),
    ("follow-ups on the first question's host", "followups_on_first_host", "{:.0%}"),
    ("repeats answered from the answer cache", "repeats_from_answer_cache", "{:.0%}"),
    ("vision encoder runs (one per image: {images})", "vision_encoder_runs", "{}"),
    ("reused prompt tokens", "reused_prompt_tokens", "{}"),
    ("busiest host / even share", "max_share_of_even", "{:.2f}"),
    ("overflowed to another host", "overflowed", "{}"),
    ("failed requests", "failed", "{}"),
)


def _cell(value, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def _shared_cores_note(run: dict) -> list[str]:
    """Staging containers share the controller's cores: a host another host's turn goes to is not idle hardware."""
    kinds = set(run["fleet"]["kinds"].values())
    if kinds != {"container"}:
        return []
    return [f"- the hosts are containers on this one machine: they share its {run['machine']['cpus']} cores, so a "
            "turn sent to another host finds no compute of its own there; on a fleet of real hosts the queue "
            "waits below are what routing trades against the caches"]


def render(results: list[dict]) -> str:
    """The markdown page of every run in a results directory, in label order; numbers only from the files."""
    if not results:
        return "# Cache locality through the load balancer\n\nNo runs yet: `vlfleet bench.locality`.\n"
    first = results[0]
    m, plan = first["machine"], first["plan"]
    fleet = ", ".join(f"{h} ({first['fleet']['kinds'].get(h) or 'host'})" for h in first["fleet"]["hosts"])
    lines = [
        "# Cache locality through the load balancer",
        "",
        "Written by `vlfleet bench.locality` (ops/bench/fleet_locality.py); one JSON file per run beside this page.",
        "",
        f"- CPU: {m['cpu']} ({m['cpus']} cores; {' '.join(m['isa'])})",
        f"- fleet: {fleet} behind {first['fleet']['lb']}",
        f"- workload: {plan['conversations']} conversations, each a first question "
        f"about its own {plan['image_px'][0]}x{plan['image_px'][1]} image and {plan['followups']} follow-ups "
        "(web UI sessions and openai-SDK clients re-sending image and history, alternately), plus the same "
        f"first question from another client; {plan['tokens']} tokens per answer",
        *_shared_cores_note(first),
        "",
        "| run | " + " | ".join(h.format(images=plan["conversations"]) for h, _k, _f in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for r in results:
        s = r["summary"]
        lines.append(f"| {r['label']} | " + " | ".join(_cell(s.get(k), f) for _h, k, f in COLUMNS) + " |")
    lines += ["", "Turns per host: " + "; ".join(
        f"{r['label']}: " + ", ".join(f"{h} {n}" for h, n in r["summary"]["turns_per_host"].items())
        for r in results), ""]
    return "\n".join(lines)


def load_dir(out: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in out.glob("*.json")), key=lambda r: r["label"])


def save(result: dict, out: Path) -> Path:
    """Write ``result`` as out/<label>.json and re-render out/README.md from every run there."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result['label']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    (out / "README.md").write_text(render(load_dir(out)))
    return path
