"""The OpenAI Agents SDK with tool_choice="required" against rlgate, on Chat Completions
and Responses: the first turn must call the tool. Usage: python agents_required.py BASE KEY"""

import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

base, key = sys.argv[1], sys.argv[2]
set_tracing_disabled(True)
client = AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
called: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    called.append(city)
    return f"It is sunny in {city}."


for model in (
    OpenAIChatCompletionsModel(model="rlgate-policy", openai_client=client),
    OpenAIResponsesModel(model="rlgate-policy", openai_client=client),
):
    before = len(called)
    agent = Agent(
        name="weather",
        instructions="Answer with the tool.",
        tools=[get_weather],
        model=model,
        tool_use_behavior="stop_on_first_tool",
        model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0),
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?")
    assert len(called) > before, result.final_output
    print(type(model).__name__, "called get_weather", called[-1], "->", result.final_output)
