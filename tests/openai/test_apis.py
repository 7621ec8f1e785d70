"""The Responses API (official `openai` client) and the Anthropic Messages API (official
`anthropic` client) on `ferrum serve`.

On the tiny fixture: whole and streamed answers agree, the SDKs' stream helpers assemble the
same final objects, usage adds up, and errors come out as the SDKs' exception types. On
SmolLM2 (when fetched; CI fetches it): both APIs give the greedy answer HF transformers gives
for the reference chat. On Qwen2.5-Coder-0.5B (when fetched; CI fetches it): function tools
through both APIs give calls whose arguments validate, streamed calls reassemble to the
non-streamed ones, and a history with calls and their results answers.
"""

import json
import os
import unittest

import anthropic
import jsonschema
import openai

from test_openai import FIXTURES, SMOLLM2, TINY, Server, reference
from test_structured import QWEN05


def anthropic_client(server, api_key="none"):
    return anthropic.Anthropic(base_url=server.base, api_key=api_key, max_retries=0)


class TinyResponses(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(TINY, "tiny")
        cls.c = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.lines)

    def ask(self, **kw):
        args = dict(model="tiny", input="Say something", max_output_tokens=12, temperature=0,
                    extra_body={"ignore_eos": True})
        args.update(kw)
        return self.c.responses.create(**args)

    def test_whole(self):
        r = self.ask(instructions="Be brief.")
        self.assertEqual(r.object, "response")
        self.assertTrue(r.id.startswith("resp_"))
        self.assertEqual(r.status, "incomplete")
        self.assertEqual(r.incomplete_details.reason, "max_output_tokens")
        self.assertEqual(r.model, "tiny")
        self.assertEqual(r.instructions, "Be brief.")
        self.assertEqual(r.output[0].type, "message")
        self.assertEqual(r.output[0].role, "assistant")
        self.assertEqual(r.output_text, r.output[0].content[0].text)
        self.assertEqual(r.usage.output_tokens, 12)
        self.assertEqual(r.usage.total_tokens, r.usage.input_tokens + 12)
        # Message items with text parts say the same as a string.
        r2 = self.ask(input=[{"role": "user", "content": [{"type": "input_text", "text": "Say something"}]}])
        self.assertEqual(r2.output_text, self.ask().output_text)

    def test_streamed_equals_whole(self):
        whole = self.ask()
        events = list(self.ask(stream=True))
        kinds = [e.type for e in events]
        self.assertEqual(kinds[:4], ["response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"])
        self.assertEqual(kinds[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.incomplete"])
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, whole.output_text)
        self.assertEqual(events[-1].response.output_text, whole.output_text)
        self.assertEqual(events[-1].response.usage.output_tokens, 12)
        # The SDK's stream helper reads the same events (its final response needs
        # `response.completed`: the SmolLM2 and Qwen tests use it).
        with self.c.responses.stream(model="tiny", input="Say something", max_output_tokens=12,
                                     temperature=0, extra_body={"ignore_eos": True}) as s:
            deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        self.assertEqual(deltas, whole.output_text)

    def test_seeded_sampling_is_reproducible(self):
        a = self.ask(temperature=1.0, extra_body={"seed": 7, "ignore_eos": True})
        b = self.ask(temperature=1.0, extra_body={"seed": 7, "ignore_eos": True})
        self.assertEqual(a.output_text, b.output_text)

    def test_errors(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.ask(previous_response_id="resp_123")
        self.assertIn("previous_response_id", str(e.exception))
        with self.assertRaises(openai.BadRequestError):
            self.ask(store=True)
        with self.assertRaises(openai.BadRequestError):
            self.ask(top_p=2)
        with self.assertRaises(openai.BadRequestError):
            self.ask(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
        with self.assertRaises(openai.BadRequestError):
            self.ask(tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                     tool_choice="required")  # the tiny template takes no tools
        with self.assertRaises(openai.NotFoundError):
            self.ask(model="gpt-5")


class TinyAnthropic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(TINY, "tiny")
        cls.c = anthropic_client(cls.server)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.lines)

    def ask(self, **kw):
        # The 2.x SDK has no sampling arguments; clients send them in the body.
        args = dict(model="tiny", max_tokens=12, system="Be brief.", extra_body={"temperature": 0},
                    messages=[{"role": "user", "content": "Say something"}])
        args.update(kw)
        return self.c.messages.create(**args)

    def test_whole_streamed_and_counted(self):
        m = self.ask()
        self.assertEqual(m.type, "message")
        self.assertEqual(m.role, "assistant")
        self.assertTrue(m.id.startswith("msg_"))
        self.assertIn(m.stop_reason, ("end_turn", "max_tokens"))
        text = "".join(b.text for b in m.content if b.type == "text")
        prompt = m.usage.input_tokens + m.usage.cache_read_input_tokens
        counted = self.c.messages.count_tokens(model="tiny", system="Be brief.",
                                               messages=[{"role": "user", "content": "Say something"}])
        self.assertEqual(counted.input_tokens, prompt)
        with self.c.messages.stream(model="tiny", max_tokens=12, extra_body={"temperature": 0}, system="Be brief.",
                                    messages=[{"role": "user", "content": "Say something"}]) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(streamed, text)
        self.assertEqual("".join(b.text for b in final.content if b.type == "text"), text)
        self.assertEqual(final.stop_reason, m.stop_reason)
        self.assertEqual(final.usage.output_tokens, m.usage.output_tokens)
        # The raw event stream is Anthropic's sequence.
        kinds = [e.type for e in self.ask(stream=True)]
        self.assertEqual(kinds[0], "message_start")
        self.assertEqual(kinds[-2:], ["message_delta", "message_stop"])

    def test_stop_sequences(self):
        full = "".join(b.text for b in self.ask(max_tokens=16).content)
        words = [w for w in full.split() if len(w) > 2]
        if len(words) < 2:
            self.skipTest("the random model's answer has too few words")
        stop = words[1]
        m = self.ask(max_tokens=16, stop_sequences=[stop])
        self.assertEqual(m.stop_reason, "stop_sequence")
        self.assertEqual(m.stop_sequence, stop)
        self.assertEqual(m.content[0].text, full[:full.index(stop)])

    def test_prefill_continues_the_assistant(self):
        m = self.ask(messages=[{"role": "user", "content": "Say something"},
                               {"role": "assistant", "content": "Sure:"}])
        self.assertEqual(m.type, "message")
        counted = self.c.messages.count_tokens(model="tiny", system="Be brief.", messages=[
            {"role": "user", "content": "Say something"}, {"role": "assistant", "content": "Sure:"}])
        self.assertEqual(m.usage.input_tokens + m.usage.cache_read_input_tokens, counted.input_tokens)

    def test_errors_are_sdk_exceptions(self):
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.ask(extra_body={"temperature": 1.5})
        self.assertEqual(e.exception.body["error"]["type"], "invalid_request_error")
        with self.assertRaises(anthropic.BadRequestError):
            self.ask(messages=[{"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
        with self.assertRaises(anthropic.NotFoundError):
            self.ask(model="claude-opus-4-1")
        with self.assertRaises(anthropic.BadRequestError):
            self.ask(tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "any"})


class Keys(unittest.TestCase):
    def test_x_api_key_and_bearer(self):
        server = Server(TINY, "tiny", "--api-key", "sekret")
        try:
            with self.assertRaises(anthropic.AuthenticationError):
                anthropic_client(server, "wrong").messages.create(
                    model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            m = anthropic_client(server, "sekret").messages.create(
                model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            self.assertEqual(m.type, "message")
            with self.assertRaises(openai.AuthenticationError):
                server.client("wrong").responses.create(model="tiny", input="hi", max_output_tokens=2)
            r = server.client("sekret").responses.create(model="tiny", input="hi", max_output_tokens=2)
            self.assertEqual(r.object, "response")
        finally:
            self.assertEqual(server.stop(), 0)


@unittest.skipUnless(SMOLLM2 and os.path.exists(SMOLLM2), "SmolLM2 GGUF not fetched (scripts/fetch-smollm2.sh)")
class SmolLM2Apis(unittest.TestCase):
    """Both APIs give HF transformers' greedy answer to the reference chat."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(SMOLLM2, "smollm2", "--matmul-precision", "float")
        ref = reference(os.path.join(FIXTURES, "smollm2-135m"))
        cls.case = {c["name"]: c for c in ref["cases"]}["chat"]
        cls.want = cls.case["generated_text"].split("<|im_end|>")[0]

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.lines)

    def test_responses(self):
        msgs = self.case["messages"]
        r = self.server.client().responses.create(model="smollm2", input=msgs, temperature=0,
                                                  max_output_tokens=32)
        self.assertEqual(r.output_text, self.want)
        self.assertEqual(r.status, "completed")
        self.assertEqual(r.usage.input_tokens, len(self.case["prompt_ids"]))
        with self.server.client().responses.stream(model="smollm2", input=msgs, temperature=0,
                                                   max_output_tokens=32) as s:
            self.assertEqual(s.get_final_response().output_text, self.want)

    def test_anthropic(self):
        msgs = self.case["messages"]
        system = [m["content"] for m in msgs if m["role"] == "system"]
        rest = [m for m in msgs if m["role"] != "system"]
        kw = dict(model="smollm2", max_tokens=32, extra_body={"temperature": 0}, messages=rest)
        if system:
            kw["system"] = system[0]
        c = anthropic_client(self.server)
        m = c.messages.create(**kw)
        self.assertEqual(m.content[0].text, self.want)
        self.assertEqual(m.stop_reason, "end_turn")
        with c.messages.stream(**kw) as s:
            self.assertEqual("".join(s.text_stream), self.want)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                             "unit": {"enum": ["C", "F"]}}, "required": ["city"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}}, "required": ["timezone"]}


@unittest.skipUnless(QWEN05 and os.path.isfile(QWEN05),
                     "Qwen2.5-Coder-0.5B is missing (scripts/fetch-model.sh qwen2.5-coder-0.5b)")
class QwenToolsApis(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(QWEN05, "qwen")
        cls.oa = cls.server.client(timeout=600)
        cls.an = anthropic.Anthropic(base_url=cls.server.base, api_key="none", max_retries=0, timeout=600)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    RTOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
               "parameters": WEATHER},
              {"type": "function", "name": "get_time", "description": "Current time in a time zone",
               "parameters": TIME}]
    ATOOLS = [{"name": "get_weather", "description": "Current weather of a city", "input_schema": WEATHER},
              {"name": "get_time", "description": "Current time in a time zone", "input_schema": TIME}]

    def test_responses_function_calls(self):
        kw = dict(model="qwen", input="What is the weather in Paris?", tools=self.RTOOLS,
                  tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=200)
        r = self.oa.responses.create(**kw)
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertGreaterEqual(len(calls), 1, r.output)
        call = calls[0]
        self.assertIn(call.name, ("get_weather", "get_time"))
        schema = WEATHER if call.name == "get_weather" else TIME
        jsonschema.validate(json.loads(call.arguments), schema)
        self.assertTrue(call.call_id.startswith("call_"))
        # Streamed: the same calls, assembled by the SDK's helper.
        with self.oa.responses.stream(**kw) as s:
            arg_deltas = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
            final = s.get_final_response()
        fcalls = [o for o in final.output if o.type == "function_call"]
        self.assertEqual([(c.name, c.arguments) for c in fcalls], [(c.name, c.arguments) for c in calls])
        self.assertEqual(arg_deltas, "".join(c.arguments for c in calls))
        # A named function, then the call's result back as input.
        r = self.oa.responses.create(**{**kw, "tool_choice": {"type": "function", "name": "get_time"},
                                        "input": "What time is it in Tokyo?"})
        call = [o for o in r.output if o.type == "function_call"][0]
        self.assertEqual(call.name, "get_time")
        follow = self.oa.responses.create(
            model="qwen", tools=self.RTOOLS, temperature=0, max_output_tokens=40,
            input=[{"role": "user", "content": "What time is it in Tokyo?"},
                   {"type": "function_call", "call_id": call.call_id, "name": call.name,
                    "arguments": call.arguments},
                   {"type": "function_call_output", "call_id": call.call_id, "output": "09:15"}])
        # The same conversation through chat completions gives the same answer.
        chat = self.oa.chat.completions.create(
            model="qwen", temperature=0, max_tokens=40,
            tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                   for t in self.RTOOLS],
            messages=[{"role": "user", "content": "What time is it in Tokyo?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": call.call_id, "type": "function",
                           "function": {"name": call.name, "arguments": call.arguments}}]},
                      {"role": "tool", "tool_call_id": call.call_id, "content": "09:15"}])
        self.assertEqual(follow.output_text, chat.choices[0].message.content or "")
        self.assertEqual([(o.name, o.arguments) for o in follow.output if o.type == "function_call"],
                         [(c.function.name, c.function.arguments)
                          for c in chat.choices[0].message.tool_calls or []])
        self.assertEqual(follow.usage.input_tokens, chat.usage.prompt_tokens)

    def test_anthropic_tool_use(self):
        kw = dict(model="qwen", max_tokens=200, extra_body={"temperature": 0}, tools=self.ATOOLS,
                  tool_choice={"type": "any", "disable_parallel_tool_use": True},
                  messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        m = self.an.messages.create(**kw)
        self.assertEqual(m.stop_reason, "tool_use")
        uses = [b for b in m.content if b.type == "tool_use"]
        self.assertGreaterEqual(len(uses), 1, m.content)
        use = uses[0]
        self.assertIn(use.name, ("get_weather", "get_time"))
        jsonschema.validate(use.input, WEATHER if use.name == "get_weather" else TIME)
        with self.an.messages.stream(**kw) as s:
            final = s.get_final_message()
        self.assertEqual([(b.name, b.input) for b in final.content if b.type == "tool_use"],
                         [(b.name, b.input) for b in uses])
        self.assertEqual(final.stop_reason, "tool_use")
        # A named tool, then the result back: the model answers.
        m = self.an.messages.create(**{**kw, "tool_choice": {"type": "tool", "name": "get_time",
                                                              "disable_parallel_tool_use": True},
                                       "messages": [{"role": "user", "content": "What time is it in Tokyo?"}]})
        use = [b for b in m.content if b.type == "tool_use"][0]
        self.assertEqual(use.name, "get_time")
        follow = self.an.messages.create(
            model="qwen", max_tokens=40, extra_body={"temperature": 0}, tools=self.ATOOLS,
            messages=[{"role": "user", "content": "What time is it in Tokyo?"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                         "input": use.input}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                    "content": "09:15"}]}])
        self.assertIn(follow.stop_reason, ("end_turn", "max_tokens", "tool_use"))
        self.assertGreaterEqual(len(follow.content), 1)

    def test_structured_output_through_both_apis(self):
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
                  "required": ["name", "age"], "additionalProperties": False}
        m = self.an.messages.create(model="qwen", max_tokens=100, extra_body={"temperature": 0},
                                    output_config={"format": {"type": "json_schema", "schema": schema}},
                                    messages=[{"role": "user", "content": "Describe Ada Lovelace as JSON."}])
        jsonschema.validate(json.loads(m.content[0].text), schema)
        r = self.oa.responses.create(model="qwen", input="Describe Ada Lovelace as JSON.", temperature=0,
                                     max_output_tokens=100,
                                     text={"format": {"type": "json_schema", "name": "person",
                                                      "schema": schema, "strict": True}})
        jsonschema.validate(json.loads(r.output_text), schema)
