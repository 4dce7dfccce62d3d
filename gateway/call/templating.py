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

from gateway.call.parsing import HermesToolParser
from gateway.call.request import Message, Tool, ToolCallOut
from gateway.edge.errors import bad_request

HERMES_TOOLS_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures "
    "within <tools></tools> XML tags. You may call one or more functions to assist with "
    "the user query. Don't make assumptions about what values to plug into functions. "
    "Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

CUSTOM_TOOLS_PROMPT = (
    "\nTools of type custom take free-form text, not JSON: call one with its input as it "
    'is, within <tool_call name="<tool-name>"></tool_call> XML tags as follows:\n'
    '<tool_call name="<tool-name>">\n<input>\n</tool_call>'
)


def tool_spec(t: Tool) -> dict[str, Any]:
    """A tool as the tool prompt lists it: a function, or a custom tool with its format
    (gateway/call/custom_tools.py)."""
    if t.custom is not None:
        fmt: dict[str, Any] = {"type": "text"}
        if t.custom.syntax != "text":
            fmt = {"type": "grammar", "syntax": t.custom.syntax, "definition": t.custom.definition}
        return {"type": "custom", "name": t.name, "description": t.description, "format": fmt}
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def call_text(c: ToolCallOut) -> str:
    """A tool call as the model writes it (the format gateway/call/parsing.py reads back)."""
    if c.custom:
        begin, end = HermesToolParser.custom_frame(c.name)
        return begin + c.arguments + end
    return (
        "<tool_call>\n"
        + json.dumps({"name": c.name, "arguments": _args_obj(c.arguments)})
        + "\n</tool_call>"
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
        n += len(t.custom.definition) if t.custom else 0
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


# what tokenizer_config.json names when the tokenizer is transformers' generic fast one (the
# packaged model's; transformers 5 writes TokenizersBackend)
GENERIC_TOKENIZERS = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(model_dir: str | Path) -> Any:
    """The policy's tokenizer. One that ``tokenizer_config.json`` names as the generic fast
    tokenizer is loaded as that class: AutoTokenizer would pick the same class, but reads
    the model's config through a transformers module that imports PyTorch, which a
    gateway never runs (about 4 s of start-up and 0.3 GB of memory). Any other class is
    AutoTokenizer's choice."""
    path = Path(model_dir)
    config = path / "tokenizer_config.json"
    named = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    if named.get("tokenizer_class") in GENERIC_TOKENIZERS and (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _args_obj(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return arguments


def _native_spec(t: Tool) -> dict[str, Any]:
    """A tool for a template that lists tools itself: a custom tool as a function whose
    description says how to call it (templates know only functions)."""
    if t.custom is None:
        return tool_spec(t)
    begin, end = HermesToolParser.custom_frame(t.name)
    how = f"Custom tool: free-form input, not JSON; call it as {begin}<input>{end}"
    if t.custom.syntax != "text":
        how += f" with input in this {t.custom.syntax} grammar:\n{t.custom.definition}"
    desc = f"{t.description}\n{how}" if t.description else how
    return {"type": "function", "function": {"name": t.name, "description": desc, "parameters": {}}}


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
            specs = "\n".join(json.dumps(tool_spec(t)) for t in tools)
            system = HERMES_TOOLS_PROMPT.format(tools=specs)
            if any(t.custom for t in tools):
                system += CUSTOM_TOOLS_PROMPT
            if messages and messages[0].role == "system":
                system = messages[0].content + "\n\n" + system
                messages = messages[1:]
            out.append({"role": "system", "content": system})
        for m in messages:
            if m.role == "assistant" and m.tool_calls:
                calls = "\n".join(call_text(c) for c in m.tool_calls)
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
            custom = [c for c in m.tool_calls if c.custom]  # no native form: written as text
            if custom:
                d["content"] = "\n".join([m.content, *map(call_text, custom)]).lstrip("\n")
            if any(not c.custom for c in m.tool_calls):
                d["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _args_obj(c.arguments)},
                    }
                    for c in m.tool_calls
                    if not c.custom
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
                kwargs["tools"] = [_native_spec(t) for t in tools]
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
