"""Real agent trajectories from public repositories, replayed in every API's wire format.

Three agent frameworks, all model-generated, none written here:

- ``mini-swe-agent`` (MIT): a bash-only coding agent on SWE-bench tasks. Its model writes one
  bash block per reply and the harness answers with the command's output as a user message, or
  with a format error (a short user message in the middle of the loop) when the reply holds no
  block or several. Converted as a tool-calling agent would send it: a reply with one block is
  a ``bash`` call (the thought as the reply's text, the command as the call's input) and the
  message after it is the call's result; every other user message stays a user message.
- ``tau-bench`` (MIT): a multi-turn customer-service agent (airline domain, 14 tools) talking to
  a simulated user, already in OpenAI's chat shape with tool calls. The recorded call ids repeat
  within a conversation (a call id of an earlier round used again); every provider requires
  them unique in one request, so a repeated id gets a suffix.

- ``SWE-agent`` (MIT): a coding agent on SWE-bench and CTF tasks, in two of its modes: function
  calling (OpenAI-shaped tool calls answered by tool messages; the recorded call ids repeat, and
  get a suffix as tau-bench's do) and a thought with one command per reply, whose output comes
  back as the next user message (converted as mini-swe-agent's: a ``bash`` call and its result).

Each trajectory ships once, in a neutral form (``testkit/data/trajectories/*.json.gz``, with
its repository, commit, path and licence in ``SOURCES.md``), and :func:`turns` writes the
request the agent sent before each model reply in the shape of any API.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_ceiling.core.vocabulary import Shape

__all__ = [
    "DATA",
    "Trajectory",
    "from_mini_swe_agent",
    "from_swe_agent",
    "from_tau_bench",
    "load",
    "load_all",
    "to_api",
    "turns",
]

DATA = Path(__file__).resolve().parent.parent / "data" / "trajectories"
_BASH = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


@dataclass
class Trajectory:
    """One conversation in the neutral form: messages with ``role`` (system, user, assistant,
    tool), ``text``, an assistant's ``calls`` (``id``, ``name``, ``args``) and a tool message's
    ``call_id`` and ``name``."""

    name: str
    framework: str
    source: dict[str, str]
    messages: list[dict[str, Any]]

    @property
    def model_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")


def from_mini_swe_agent(raw: dict[str, Any], name: str, source: dict[str, str]) -> Trajectory:
    """A mini-swe-agent ``.traj.json`` as a tool-calling loop (see the module's docstring)."""
    out: list[dict[str, Any]] = []
    pending: str | None = None
    n = 0
    for m in raw["messages"]:
        role, text = m["role"], str(m.get("content") or "")
        if role == "assistant":
            blocks = _BASH.findall(text)
            if len(blocks) == 1:
                n += 1
                pending = f"call_{n}"
                thought = _BASH.sub("", text).strip()
                call = {"id": pending, "name": "bash", "args": {"command": blocks[0]}}
                out.append({"role": "assistant", "text": thought, "calls": [call]})
            else:
                pending = None
                out.append({"role": "assistant", "text": text, "calls": []})
        elif role == "user" and pending is not None:
            out.append({"role": "tool", "call_id": pending, "name": "bash", "text": text})
            pending = None
        else:
            out.append({"role": role, "text": text})
    return Trajectory(name, "mini-swe-agent", source, out)


def from_tau_bench(raw: dict[str, Any], name: str, source: dict[str, str]) -> Trajectory:
    """A tau-bench trajectory (OpenAI chat messages with tool calls)."""
    out: list[dict[str, Any]] = []
    ids = _CallIds()
    for m in raw["traj"]:
        role, text = m["role"], str(m.get("content") or "")
        if role == "assistant":
            calls = ids.calls(m.get("tool_calls") or [])
            out.append({"role": "assistant", "text": text, "calls": calls})
        elif role == "tool":
            out.append(ids.result(m["tool_call_id"], text))
        else:
            out.append({"role": role, "text": text})
    return Trajectory(name, "tau-bench", source, out)


def from_swe_agent(raw: dict[str, Any], name: str, source: dict[str, str]) -> Trajectory:
    """A SWE-agent ``.traj`` (its ``history``) as a tool-calling loop (see the module's
    docstring)."""
    out: list[dict[str, Any]] = []
    ids = _CallIds()
    pending: str | None = None  # a text action waiting for its output
    for m in raw["history"]:
        role, text = m["role"], _text(m.get("content"))
        calls = m.get("tool_calls")
        if isinstance(calls, str):  # some versions store the list's Python repr
            calls = ast.literal_eval(calls)
        thought = str(m.get("thought") or "")
        if role == "assistant" and calls:
            pending = None
            out.append({"role": "assistant", "text": thought, "calls": ids.calls(calls)})
        elif role == "assistant" and m.get("action"):
            pending = f"call_{len(ids.names) + 1}"
            ids.names[pending] = "bash"
            call = {"id": pending, "name": "bash", "args": {"command": str(m["action"])}}
            out.append({"role": "assistant", "text": thought, "calls": [call]})
        elif role == "tool":
            answered = m.get("tool_call_ids") or [m.get("tool_call_id")]
            if isinstance(answered, str):
                answered = ast.literal_eval(answered)
            out.append(ids.result(answered[0], text))
        elif role == "user" and pending is not None:
            out.append({"role": "tool", "call_id": pending, "name": "bash", "text": text})
            pending = None
        elif role == "assistant":  # a reply with no command: the harness answers as a user
            pending = None
            out.append({"role": "assistant", "text": text, "calls": []})
        else:
            pending = None
            out.append({"role": "system" if role == "system" else "user", "text": text})
    return Trajectory(name, "swe-agent", source, out)


class _CallIds:
    """A recorded conversation's tool-call ids made unique, as every provider requires within one
    request: an id an earlier call already used gets a suffix, and a result answers the latest
    call that had its recorded id."""

    def __init__(self) -> None:
        #: each call id -> its tool's name
        self.names: dict[str, str] = {}
        #: the recorded id -> the id of its latest call
        self.current: dict[str, str] = {}

    def calls(self, tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI-shaped ``tool_calls`` as neutral calls (``id``, ``name``, ``args``)."""
        out = []
        for tc in tool_calls:
            fn = tc["function"]
            cid = tc["id"] if tc["id"] not in self.names else f"{tc['id']}_{len(self.names)}"
            self.current[tc["id"]] = cid
            self.names[cid] = fn["name"]
            out.append({"id": cid, "name": fn["name"], "args": json.loads(fn["arguments"] or "{}")})
        return out

    def result(self, recorded: str, text: str) -> dict[str, Any]:
        """The tool message answering the call recorded as ``recorded``."""
        cid = self.current.get(recorded, recorded)
        return {"role": "tool", "call_id": cid, "name": self.names.get(cid, ""), "text": text}


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: their text joined)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def load(path: Path) -> Trajectory:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        d = json.load(f)
    return Trajectory(d["name"], d["framework"], d["source"], d["messages"])


def load_all(framework: str | None = None, data: Path = DATA) -> list[Trajectory]:
    """Every shipped trajectory (of one framework), or every one converted into ``data``, in
    name order."""
    found = [load(p) for p in sorted(data.glob("*.json.gz"))]
    return [t for t in found if framework is None or t.framework == framework]


def turns(t: Trajectory, api: Shape) -> Iterator[dict[str, Any]]:
    """The body of every request: the history before each model reply, in ``api``'s shape."""
    for k, m in enumerate(t.messages):
        if m["role"] == "assistant" and k > 0:
            yield to_api(t.messages[:k], api)


def to_api(messages: list[dict[str, Any]], api: Shape) -> dict[str, Any]:
    """Neutral messages as one request body of ``api``."""
    system = "\n\n".join(m["text"] for m in messages if m["role"] == "system")
    rest = [m for m in messages if m["role"] != "system"]
    if api == "openai":
        return {"model": "gpt-4o", "messages": _openai(system, rest), "max_tokens": 4096}
    if api == "anthropic":
        body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 4096}
        if system:
            body["system"] = system
        body["messages"] = _anthropic(rest)
        return body
    if api == "responses":
        return {
            "model": "gpt-4o",
            "instructions": system,
            "input": _responses(rest),
            "max_output_tokens": 4096,
        }
    if api == "converse":
        return {
            "system": [{"text": system}] if system else [],
            "messages": _converse(rest),
            "inferenceConfig": {"maxTokens": 4096},
        }
    return {
        "systemInstruction": {"parts": [{"text": system}]},
        "contents": _gemini(rest),
        "generationConfig": {"maxOutputTokens": 4096},
    }


def _openai(system: str, rest: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = [{"role": "system", "content": system}] if system else []
    for m in rest:
        if m["role"] == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m["text"] or None}
            if m["calls"]:
                msg["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                    }
                    for c in m["calls"]
                ]
            out.append(msg)
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["call_id"], "content": m["text"]})
        else:
            out.append({"role": "user", "content": m["text"]})
    return out


def _anthropic(rest: list[dict[str, Any]]) -> list[Any]:
    out: list[dict[str, Any]] = []
    for m in rest:
        if m["role"] == "assistant":
            blocks: list[Any] = [{"type": "text", "text": m["text"]}] if m["text"].strip() else []
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]}
                for c in m["calls"]
            ]
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "."}]})
            continue
        if m["role"] == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m["call_id"],
                "content": m["text"] or "(no output)",
            }
        else:
            block = {"type": "text", "text": m["text"] or "."}
        if out and out[-1]["role"] == "user":  # turns alternate: one user message a turn
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return out


def _converse(rest: list[dict[str, Any]]) -> list[Any]:
    """Bedrock Converse: Anthropic's layout with blocks keyed by their kind."""
    out: list[dict[str, Any]] = []
    for m in rest:
        if m["role"] == "assistant":
            blocks: list[Any] = [{"text": m["text"]}] if m["text"].strip() else []
            blocks += [
                {"toolUse": {"toolUseId": c["id"], "name": c["name"], "input": c["args"]}}
                for c in m["calls"]
            ]
            out.append({"role": "assistant", "content": blocks or [{"text": "."}]})
            continue
        if m["role"] == "tool":
            block: dict[str, Any] = {
                "toolResult": {
                    "toolUseId": m["call_id"],
                    "content": [{"text": m["text"] or "(no output)"}],
                }
            }
        else:
            block = {"text": m["text"] or "."}
        if out and out[-1]["role"] == "user":  # turns alternate: one user message a turn
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return out


def _responses(rest: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for m in rest:
        if m["role"] == "assistant":
            if m["text"]:
                out.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": m["text"]}],
                    }
                )
            out += [
                {
                    "type": "function_call",
                    "call_id": c["id"],
                    "name": c["name"],
                    "arguments": json.dumps(c["args"]),
                }
                for c in m["calls"]
            ]
        elif m["role"] == "tool":
            out.append(
                {"type": "function_call_output", "call_id": m["call_id"], "output": m["text"]}
            )
        else:
            out.append({"role": "user", "content": m["text"]})
    return out


def _gemini(rest: list[dict[str, Any]]) -> list[Any]:
    out: list[dict[str, Any]] = []
    for m in rest:
        if m["role"] == "assistant":
            parts: list[Any] = [{"text": m["text"]}] if m["text"] else []
            parts += [
                {"functionCall": {"id": c["id"], "name": c["name"], "args": c["args"]}}
                for c in m["calls"]
            ]
            out.append({"role": "model", "parts": parts or [{"text": "."}]})
            continue
        if m["role"] == "tool":
            part: dict[str, Any] = {
                "functionResponse": {
                    "id": m["call_id"],
                    "name": m["name"],
                    "response": {"result": m["text"]},
                }
            }
        else:
            part = {"text": m["text"] or "."}
        if out and out[-1]["role"] == "user":
            out[-1]["parts"].append(part)
        else:
            out.append({"role": "user", "parts": [part]})
    return out
