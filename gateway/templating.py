"""Chat template rendering with the policy's own tokenizer.

The gateway, never the engine, turns messages into token ids: the ids recorded as the
prompt are exactly the ids the engine saw. A template that knows about tools gets them
through ``tools=``; a template without tool support (SmolLM2's ChatML) gets them as a
Hermes-format system prompt, and tool calls / tool results are written into the text in
the same format the tool-call parser reads back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.errors import bad_request
from gateway.request import Message, Tool

HERMES_TOOLS_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures "
    "within <tools></tools> XML tags. You may call one or more functions to assist with "
    "the user query. Don't make assumptions about what values to plug into functions. "
    "Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

# The chat-template variables a client may set (OpenAI ``chat_template_kwargs``, as in
# vLLM/SGLang), with the values each accepts. Only plain switches that real templates
# read (Qwen3's ``enable_thinking``, DeepSeek-V3.1's ``thinking``, gpt-oss's
# ``reasoning_effort``): never ``chat_template`` (template code) or anything else that
# ``apply_chat_template`` would treat as code or as its own arguments.
ALLOWED_TEMPLATE_KWARGS: dict[str, tuple[Any, ...]] = {
    "enable_thinking": (True, False),
    "thinking": (True, False),
    "reasoning_effort": ("low", "medium", "high"),
}


def check_template_kwargs(kwargs: Any, where: str = "chat_template_kwargs") -> dict[str, Any]:
    """``kwargs`` if every key is allowed and every value is one the key accepts;
    a 400 that names the allowed keys and values otherwise."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise bad_request(f"{where} must be an object", where)
    allowed = ", ".join(
        f"{k} ({' | '.join(json.dumps(v) for v in vs)})"
        for k, vs in ALLOWED_TEMPLATE_KWARGS.items()
    )
    for key, value in kwargs.items():
        accepted = ALLOWED_TEMPLATE_KWARGS.get(key)
        if accepted is None:
            raise bad_request(
                f"{where}.{key} is not supported; the chat template accepts only: {allowed}",
                f"{where}.{key}",
            )
        if not any(type(value) is type(a) and value == a for a in accepted):
            raise bad_request(
                f"{where}.{key} must be one of {' | '.join(json.dumps(a) for a in accepted)} "
                f"(got {json.dumps(value)[:80]})",
                f"{where}.{key}",
            )
    return dict(kwargs)


def prompt_chars(messages: list[Message], tools: list[Tool]) -> int:
    """Characters the messages and tool specs put into the prompt (template text aside):
    cheap to count, so a prompt that cannot fit is refused before it is tokenized."""
    n = 0
    for m in messages:
        n += len(m.content) + len(m.reasoning or "") + len(m.name or "")
        n += sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    for t in tools:
        n += len(t.name) + len(t.description) + len(json.dumps(t.parameters))
    return n


MIN_PROMPT_CHARS = 512 * 1024


def check_prompt_chars(
    messages: list[Message], tools: list[Tool], context_length: int, chars_per_token: float
) -> None:
    """A 400 when the prompt has more characters than the context can hold at
    ``chars_per_token`` (a generous bound: text averages 3-5 characters per token). A
    prompt under MIN_PROMPT_CHARS is always tokenized (well under a second, off the loop),
    so an agent whose prompt is too long for a small context learns both token counts."""
    limit = max(int(context_length * chars_per_token), MIN_PROMPT_CHARS)
    n = prompt_chars(messages, tools)
    if n > limit:
        raise bad_request(
            f"the prompt is {n} characters, more than the {limit} that fit this model's "
            f"{context_length}-token context (at most {chars_per_token:g} characters per "
            "token); shorten the messages or tool descriptions. If your text really packs "
            "more characters into each token, raise RLGATE_PROMPT_CHARS_PER_TOKEN",
            "messages",
        )


def load_tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _args_obj(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return arguments


class ChatRenderer:
    def __init__(self, tokenizer: Any, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        template = tokenizer.chat_template or ""
        if not template:
            raise ValueError("the policy tokenizer has no chat template")
        self.native_tools = "tools" in template
        self.eos_token_id: int | None = tokenizer.eos_token_id

    # ---- rendering ---------------------------------------------------------------

    def _hermes_messages(self, messages: list[Message], tools: list[Tool]) -> list[dict]:
        out: list[dict] = []
        if tools:
            specs = "\n".join(
                json.dumps(
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                        },
                    }
                )
                for t in tools
            )
            system = HERMES_TOOLS_PROMPT.format(tools=specs)
            if messages and messages[0].role == "system":
                system = messages[0].content + "\n\n" + system
                messages = messages[1:]
            out.append({"role": "system", "content": system})
        for m in messages:
            if m.role == "assistant" and m.tool_calls:
                calls = "\n".join(
                    "<tool_call>\n"
                    + json.dumps({"name": c.name, "arguments": _args_obj(c.arguments)})
                    + "\n</tool_call>"
                    for c in m.tool_calls
                )
                text = (m.content + "\n" if m.content else "") + calls
                out.append({"role": "assistant", "content": text})
            elif m.role == "tool":
                out.append(
                    {"role": "tool", "content": f"<tool_response>\n{m.content}\n</tool_response>"}
                )
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    def _native_messages(self, messages: list[Message]) -> list[dict]:
        out: list[dict] = []
        for m in messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                d["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _args_obj(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
            out.append(d)
        return out

    def render(
        self,
        messages: list[Message],
        tools: list[Tool],
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, list[int]]:
        """The prompt text and its token ids, ready for generation. CPU-bound (Jinja and
        the tokenizer): the gateway calls it on its render pool, never on the event loop.
        ``template_kwargs`` must pass ``check_template_kwargs`` (checked again here)."""
        kwargs = check_template_kwargs(template_kwargs)
        if self.native_tools:
            msgs = self._native_messages(messages)
            if tools:
                kwargs["tools"] = [
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                        },
                    }
                    for t in tools
                ]
        else:
            msgs = self._hermes_messages(messages, tools)
        try:
            text = self.tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as e:  # jinja errors from odd message shapes
            raise bad_request(f"the chat template cannot render these messages: {e}") from None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text, ids

    def raw_prompt(self, prompt: str | list[int], where: str = "prompt") -> list[int]:
        """A prompt without a chat template (the Completions API): text tokenized as it is
        (with the special tokens the tokenizer adds, as vLLM does), or token ids checked
        against the vocabulary. CPU-bound like ``render``. A 400 for an empty prompt or an
        id the model does not have."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            vocab = len(self.tokenizer)
            bad = next((i for i in prompt if not 0 <= i < vocab), None)
            if bad is not None:
                raise bad_request(
                    f"{where} holds token id {bad}, outside this model's vocabulary "
                    f"(0 to {vocab - 1})",
                    where,
                )
            ids = list(prompt)
        if not ids:
            raise bad_request(f"{where} is empty; send at least one token", where)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
