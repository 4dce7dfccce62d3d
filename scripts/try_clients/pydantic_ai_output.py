"""pydantic-ai's default structured output (a forced tool call: tool_choice "required")
against rlgate, on Chat Completions and Responses. Usage: python pydantic_ai_output.py BASE KEY"""

import sys

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider


class City(BaseModel):
    city: str
    country: str


base, key = sys.argv[1], sys.argv[2]
provider = OpenAIProvider(base_url=base + "/v1", api_key=key)
for model in (
    OpenAIChatModel("rlgate-policy", provider=provider),
    OpenAIResponsesModel("rlgate-policy", provider=provider),
):
    agent = Agent(model, output_type=City, model_settings={"max_tokens": 96, "temperature": 0})
    out = agent.run_sync("Name a European capital and its country.").output
    assert isinstance(out, City), out
    print(type(model).__name__, out.model_dump_json())
