"""One request to an SGLang server on any of its three text routes, streamed or not, as one record.

- ``chat``: ``/v1/chat/completions`` with the prompt as one user message;
- ``completions``: ``/v1/completions`` with the prompt as text;
- ``generate``: SGLang's ``/generate``; its ``meta_info`` gives the verify steps (``spec_verify_ct``)
  and DYNVOCAB's telemetry, and ``output_ids`` the tokens.

A record: ``text``, ``ids`` (``/generate`` only), ``completion_tokens``, ``prompt_tokens``,
``spec_verify_ct``, ``finish_reason`` and the telemetry fields the server sent. A streamed request
also has ``events``; one the client left early (``stop_after``) has ``aborted: "disconnect"``.
A prompt longer than the served context raises :class:`PromptTooLong` (SGLang answers HTTP 400).
Streams are read as the pinned SGLang sends them by default: OpenAI routes in deltas, ``/generate``
with the whole text so far in each event (``--incremental-streaming-output`` is not supported here).
"""

from __future__ import annotations

import json

from .server import SpecBenchError, http_events, http_json, telemetry

ROUTES = ("chat", "completions", "generate")
#: SGLang's refusals of a prompt that does not fit the context (``TokenizerManager._validate_one_request``).
CONTEXT_ERRORS = ("longer than the model's context length", "exceeds the model's maximum context length")


class PromptTooLong(SpecBenchError):
    """The server refused the prompt as longer than its context: the caller skips and counts it."""


def too_long(exc: SpecBenchError) -> bool:
    """Whether a failed request is SGLang's refusal of a prompt longer than the served context."""
    return " HTTP 400 " in f" {exc} " and any(m in str(exc) for m in CONTEXT_ERRORS)


def served_model(url: str) -> str:
    """The model name the OpenAI routes answer to (``/v1/models``), ``default`` if the server names none."""
    try:
        models = http_json(f"{url}/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if data and isinstance(data[0], dict) and data[0].get("id"):
            return str(data[0]["id"])
    except SpecBenchError:
        pass
    return "default"


def ask(
    url: str,
    route: str,
    prompt: str,
    *,
    max_new_tokens: int,
    model: str,
    timeout: float,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    stream: bool = False,
    stop_after: int | None = None,
    rid: str | None = None,
) -> dict:
    """One request; the record described in the module doc."""
    if route not in ROUTES:
        raise SpecBenchError(f"unknown route {route!r}; routes: {', '.join(ROUTES)}")
    path, payload = _payload(route, prompt, max_new_tokens, model, temperature, ignore_eos, stream, rid)
    try:
        if stream:
            return _streamed(route, http_events(url + path, payload, timeout, stop_after), stop_after)
        return _record(route, http_json(url + path, payload, timeout=timeout))
    except SpecBenchError as exc:
        if too_long(exc):
            raise PromptTooLong(str(exc)) from None
        raise


def _payload(route, prompt, max_new_tokens, model, temperature, ignore_eos, stream, rid) -> tuple[str, dict]:
    extra = {"ignore_eos": True} if ignore_eos else {}
    if route == "generate":
        params = {"temperature": temperature, "max_new_tokens": max_new_tokens, **extra}
        payload = {"text": prompt, "sampling_params": params}
        path = "/generate"
    else:
        payload = {"model": model, "temperature": temperature, "max_tokens": max_new_tokens, **extra}
        if route == "chat":
            payload["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            payload["prompt"] = prompt
            path = "/v1/completions"
    if stream:
        payload["stream"] = True
    if rid is not None:
        payload["rid"] = rid
    return path, payload


def _record(route: str, reply) -> dict:
    if route == "generate":
        if isinstance(reply, list) and len(reply) == 1:
            reply = reply[0]
        if not isinstance(reply, dict) or not isinstance(reply.get("meta_info"), dict):
            raise SpecBenchError(f"/generate reply has no meta_info: {json.dumps(reply)[:300]}")
        meta = reply["meta_info"]
        if not isinstance(reply.get("text"), str):
            raise SpecBenchError(
                "/generate reply has no 'text' (a server started with --skip-tokenizer-init cannot be used)"
            )
        ids = reply.get("output_ids")
        out = {
            "text": reply["text"],
            "ids": ids if isinstance(ids, list) else None,
            "completion_tokens": meta.get("completion_tokens"),
            "prompt_tokens": meta.get("prompt_tokens"),
            "spec_verify_ct": meta.get("spec_verify_ct"),
            "finish_reason": _finish(meta.get("finish_reason")),
        }
        out.update(telemetry(meta))  # a per-step list becomes the request's mean
        return out
    choice = _first_choice(reply, route)
    text = (choice.get("message") or {}).get("content") if route == "chat" else choice.get("text")
    if not isinstance(text, str):
        raise SpecBenchError(f"{route}: the reply has no text: {json.dumps(reply)[:300]}")
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    return {
        "text": text,
        "ids": None,
        "completion_tokens": usage.get("completion_tokens"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "spec_verify_ct": None,
        "finish_reason": _finish(choice.get("finish_reason")),
    }


def _streamed(route: str, events, stop_after: int | None) -> dict:
    """Fold a stream into one record: OpenAI deltas are joined; ``/generate``'s last event is the whole reply."""
    n, parts, last, finish, usage = 0, [], None, None, {}
    for event in events:
        n += 1
        if not isinstance(event, dict):
            raise SpecBenchError(f"{route}: a streamed event is not an object: {json.dumps(event)[:300]}")
        if isinstance(event.get("error"), dict | str):
            raise SpecBenchError(f"{route}: the stream reported an error: {json.dumps(event)[:300]}")
        if route == "generate":
            last = event
            continue
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        for choice in event.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if route == "chat" else choice.get("text")
            if isinstance(piece, str):
                parts.append(piece)
            finish = _finish(choice.get("finish_reason")) or finish
    if stop_after is not None and n >= stop_after:
        return {"aborted": "disconnect", "events": n}
    if route == "generate":
        if last is None:
            raise SpecBenchError("/generate: the stream ended without an event")
        out = _record(route, {**last, "text": last.get("text") or ""})
    else:
        out = {
            "text": "".join(parts),
            "ids": None,
            "completion_tokens": usage.get("completion_tokens"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "spec_verify_ct": None,
            "finish_reason": finish,
        }
    out["events"] = n
    return out


def _first_choice(reply, route: str) -> dict:
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise SpecBenchError(f"{route}: the reply has no choices: {json.dumps(reply)[:300]}")
    return choices[0]


def _finish(value):
    return value.get("type") if isinstance(value, dict) else value


def _first_difference(a, b) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def same_output(a: dict, b: dict) -> bool:
    """Equal text, and equal token ids where both records have them."""
    ids = a.get("ids") is None or b.get("ids") is None or a["ids"] == b["ids"]
    return a.get("text") == b.get("text") and ids


def where_differs(a: dict, b: dict) -> dict:
    """Where record ``a`` first differs from ``b``: character, token (when both have ids), text around it."""
    at = _first_difference(a["text"], b["text"])
    return {
        "char": at,
        "token": None if a.get("ids") is None or b.get("ids") is None else _first_difference(a["ids"], b["ids"]),
        "expected": b["text"][max(0, at - 20) : at + 40],
        "got": a["text"][max(0, at - 20) : at + 40],
    }
