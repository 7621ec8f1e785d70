"""Agent runs through the openai-agents SDK against `ferrum serve`: one function tool, the
instruction to call it, and both of the SDK's models (Responses and Chat Completions), streamed
and not.

Qwen2.5-Coder-0.5B-Instruct Q4_K_M writes its call as a bare JSON object, without hermes'
`<tool_call>` tags: with `tool_choice: "auto"` (the SDK's default) such a call is read as one
when it names a declared function, and the grammar constrains it from its opening. Given the
tool's result, that model calls the tool again, whatever the instructions (seen with four
system prompts, three result texts and no tools at all, greedy and sampled): its runs stop at
the tool (`tool_use_behavior="stop_on_first_tool"`), the tool's result being the final output.
Qwen2.5-Coder-1.5B-Instruct Q4_K_M (FERRUM_QWEN15) runs the whole loop: the tool is called with
the city asked about, and the model's final answer carries the tool's result.
"""

import asyncio
import os
import unittest

from test_openai import Server
from test_structured import QWEN05

QWEN15 = os.environ.get("FERRUM_QWEN15", "")

# The SDK would send traces to OpenAI's servers.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

try:
    import agents
    from openai import AsyncOpenAI
except ImportError:  # the venv of scripts/test-openai.sh has it
    agents = None

# A value the model cannot guess: it reaches the answer only through the tool.
SECRET = "17.5 degrees and light rain"


class AgentRuns:
    """The four runs against `cls.model`; `cls.stop_at_tool`: the run ends with the tool's
    result instead of a last model turn."""

    model = ""
    stop_at_tool = False

    @classmethod
    def setUpClass(cls):
        cls.server = Server(cls.model, "qwen")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def agent(self, model_kind):
        calls = []

        @agents.function_tool
        def get_weather(city: str) -> str:
            """The current weather of a city."""
            calls.append(city)
            return f"The weather in {city}: {SECRET}."

        client = AsyncOpenAI(base_url=self.server.base + "/v1", api_key="none", max_retries=0,
                             timeout=600)
        if model_kind == "responses":
            model = agents.OpenAIResponsesModel(model="qwen", openai_client=client)
        else:
            model = agents.OpenAIChatCompletionsModel(model="qwen", openai_client=client)
        agent = agents.Agent(
            name="weather",
            instructions="You are a weather assistant. Use the get_weather tool to look up the "
                         "weather, then answer the user with what it returned.",
            tools=[get_weather],
            model=model,
            model_settings=agents.ModelSettings(temperature=0, max_tokens=160),
            tool_use_behavior="stop_on_first_tool" if self.stop_at_tool else "run_llm_again",
        )
        return agent, calls

    def run_agent(self, model_kind, streamed):
        agent, calls = self.agent(model_kind)
        question = "What is the weather in Oslo right now?"

        async def go():
            if streamed:
                result = agents.Runner.run_streamed(agent, question, max_turns=4)
                async for _ in result.stream_events():
                    pass
                return result
            return await agents.Runner.run(agent, question, max_turns=4)

        result = asyncio.run(go())
        where = f"{model_kind}, streamed={streamed}: {result.final_output!r}"
        self.assertEqual(calls, ["Oslo"], where)
        self.assertIn("17.5", str(result.final_output), where)
        # The model's turns: the call, then (the whole loop) the answer.
        self.assertEqual(len(result.raw_responses), 1 if self.stop_at_tool else 2, where)

    def test_responses_model(self):
        self.run_agent("responses", streamed=False)

    def test_responses_model_streamed(self):
        self.run_agent("responses", streamed=True)

    def test_chat_completions_model(self):
        self.run_agent("chat", streamed=False)

    def test_chat_completions_model_streamed(self):
        self.run_agent("chat", streamed=True)


@unittest.skipUnless(QWEN05 and os.path.isfile(QWEN05),
                     "Qwen2.5-Coder-0.5B is missing (scripts/fetch-model.sh qwen2.5-coder-0.5b)")
@unittest.skipUnless(agents, "openai-agents is not installed (scripts/test-openai.sh installs it)")
class AgentRunsQwen05(AgentRuns, unittest.TestCase):
    model = QWEN05
    stop_at_tool = True


@unittest.skipUnless(QWEN15 and os.path.isfile(QWEN15),
                     "Qwen2.5-Coder-1.5B is missing (scripts/fetch-model.sh qwen2.5-coder-1.5b)")
@unittest.skipUnless(agents, "openai-agents is not installed (scripts/test-openai.sh installs it)")
class AgentRunsQwen15(AgentRuns, unittest.TestCase):
    model = QWEN15


if __name__ == "__main__":
    unittest.main()
