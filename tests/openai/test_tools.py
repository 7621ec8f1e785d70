"""Tool calling through `ferrum serve` with the official `openai` client, on
Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the hermes format of its chat template).

`tool_choice: "required"` yields a valid call for 30 tool sets (the name is one of the set's
and the arguments validate against its `parameters` with the `jsonschema` package); a named
function is the one called; streamed calls reassemble to exactly the non-streamed ones; a
history with assistant `tool_calls` and `tool` messages renders and answers; `auto` leaves
free text free; bad tool requests, and tools on a model whose template has none (SmolLM2),
are 400s naming the parameter.
"""

import concurrent.futures
import json
import os
import unittest

import jsonschema
import openai

from test_openai import Server, SMOLLM2
from test_structured import QWEN05, QwenServer


def fn(name, props, required=None, desc=""):
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": props,
                       "required": list(props) if required is None else required}}}


S = {"type": "string", "maxLength": 24}


def tool_sets():
    """30 tool sets with a question each."""
    base = [
        (fn("get_weather", {"city": S, "unit": {"enum": ["C", "F"]}}, ["city"], "Current weather of a city"),
         "What is the weather in Paris?"),
        (fn("get_time", {"timezone": S}, desc="Current time in a time zone"), "What time is it in Tokyo?"),
        (fn("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, desc="Add two integers"), "What is 2 + 40?"),
        (fn("search_web", {"query": S, "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}, ["query"]),
         "Search the web for rust borrow checker."),
        (fn("send_email", {"to": S, "subject": S, "body": {"type": "string", "maxLength": 60}}), "Email bob@x.com that I am late."),
        (fn("convert_currency", {"amount": {"type": "number", "minimum": 0}, "from": {"enum": ["EUR", "USD", "GBP"]},
                                 "to": {"enum": ["EUR", "USD", "GBP"]}}), "Convert 10 EUR to USD."),
        (fn("book_flight", {"origin": S, "destination": S, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}),
         "Book a flight from Paris to Rome on 2025-05-01."),
        (fn("set_alarm", {"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "minute": {"type": "integer", "minimum": 0, "maximum": 59}}),
         "Wake me up at 7:30."),
        (fn("translate", {"text": S, "target": {"enum": ["fr", "de", "es"]}}), "Translate 'hello' to German."),
        (fn("create_event", {"title": S, "attendees": {"type": "array", "items": S, "maxItems": 3}}, ["title"]),
         "Create a meeting called Standup with Ann and Bob."),
    ]
    extra = [
        fn("get_stock_price", {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}),
        fn("list_files", {"path": S, "recursive": {"type": "boolean"}}, ["path"]),
        fn("rate_movie", {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5}}),
    ]
    sets = []
    for i in range(30):
        tool, question = base[i % len(base)]
        others = [extra[(i + k) % len(extra)] for k in range(i % 3)]
        sets.append(([tool] + others if i % 2 == 0 else others + [tool], question))
    return sets


def schema_of(tools, name):
    for t in tools:
        if t["function"]["name"] == name:
            return t["function"]["parameters"]
    raise AssertionError(f"{name} is not one of the tools")


@unittest.skipUnless(QWEN05 and os.path.isfile(QWEN05),
                     "Qwen2.5-Coder-0.5B is missing (scripts/fetch-model.sh qwen2.5-coder-0.5b)")
class ToolCalling(QwenServer, unittest.TestCase):
    def ask(self, content, **kw):
        kw.setdefault("max_tokens", 200)
        kw.setdefault("temperature", 0)
        messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
        return self.client.chat.completions.create(model="qwen", messages=messages, **kw)

    def test_required_gives_a_valid_call_for_30_tool_sets(self):
        sets = tool_sets()
        with concurrent.futures.ThreadPoolExecutor(max_workers=30) as ex:
            answers = list(ex.map(lambda s: self.ask(s[1], tools=s[0], tool_choice="required",
                                                     parallel_tool_calls=False), sets))
        for i, ((tools, _), r) in enumerate(zip(sets, answers)):
            with self.subTest(set=i):
                c = r.choices[0]
                self.assertEqual(c.finish_reason, "tool_calls")
                self.assertIsNone(c.message.content)
                self.assertEqual(len(c.message.tool_calls), 1)
                call = c.message.tool_calls[0]
                self.assertEqual(call.type, "function")
                self.assertTrue(call.id.startswith("call_"))
                jsonschema.validate(json.loads(call.function.arguments), schema_of(tools, call.function.name))

    def test_named_function_and_parallel_calls(self):
        tools, q = tool_sets()[2]
        r = self.ask(q, tools=tools, tool_choice={"type": "function", "function": {"name": "rate_movie"}})
        calls = r.choices[0].message.tool_calls
        self.assertEqual([c.function.name for c in calls], ["rate_movie"])
        jsonschema.validate(json.loads(calls[0].function.arguments), schema_of(tools, "rate_movie"))
        # Parallel calls: every finished call is valid.
        tools, q = tool_sets()[0]
        r = self.ask(q, tools=tools, tool_choice="required", max_tokens=120, temperature=0.7, seed=2)
        c = r.choices[0]
        self.assertGreaterEqual(len(c.message.tool_calls), 1)
        done = c.message.tool_calls if c.finish_reason == "tool_calls" else c.message.tool_calls[:-1]
        for call in done:
            jsonschema.validate(json.loads(call.function.arguments), schema_of(tools, call.function.name))

    def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far(self):
        tools, q = tool_sets()[4]
        kw = dict(tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0)
        whole = self.ask(q, **kw)
        self.assertEqual(whole.choices[0].finish_reason, "tool_calls")
        full = whole.choices[0].message.tool_calls[0].function
        n = whole.usage.completion_tokens
        for cut in sorted({n // 2, n - 4, n - 2}):
            with self.subTest(max_tokens=cut):
                for stream in (False, True):
                    if stream:
                        name, args, finish = None, "", None
                        for ch in self.ask(q, max_tokens=cut, stream=True, **kw):
                            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                                name = tc.function.name or name
                                args += tc.function.arguments or ""
                            if ch.choices and ch.choices[0].finish_reason:
                                finish = ch.choices[0].finish_reason
                    else:
                        c = self.ask(q, max_tokens=cut, **kw).choices[0]
                        finish = c.finish_reason
                        name = c.message.tool_calls[0].function.name
                        args = c.message.tool_calls[0].function.arguments
                    self.assertEqual(finish, "length")
                    self.assertEqual(name, full.name)
                    # The arguments as generated so far: a prefix of the uncut call's, not "".
                    self.assertTrue(args and full.arguments.startswith(args), (args, full.arguments))

    def test_streamed_calls_reassemble_to_the_non_streamed_ones(self):
        for tools, q in tool_sets()[:6]:
            with self.subTest(q=q):
                kw = dict(tools=tools, tool_choice="required", parallel_tool_calls=False)
                whole = self.ask(q, **kw).choices[0].message.tool_calls
                calls, content, finish = {}, "", None
                for ch in self.ask(q, stream=True, **kw):
                    if not ch.choices:
                        continue
                    d = ch.choices[0].delta
                    content += d.content or ""
                    finish = ch.choices[0].finish_reason or finish
                    for tc in d.tool_calls or []:
                        c = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                        if tc.id:
                            self.assertIsNone(c["id"], "the id comes once, first")
                            c["id"] = tc.id
                            c["name"] = tc.function.name
                        else:
                            self.assertIsNotNone(c["id"], "arguments come after the id and name")
                        c["arguments"] += tc.function.arguments or ""
                self.assertEqual(content, "")
                self.assertEqual(finish, "tool_calls")
                self.assertEqual([(c["name"], c["arguments"]) for _, c in sorted(calls.items())],
                                 [(c.function.name, c.function.arguments) for c in whole])

    def test_history_with_tool_calls_and_tool_messages(self):
        tools, _ = tool_sets()[0]
        messages = [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"},
        ]
        r = self.ask(messages, tools=tools, tool_choice="none", max_tokens=40)
        c = r.choices[0]
        self.assertIsNone(c.message.tool_calls)
        self.assertTrue(c.message.content)
        # `auto`: a plain question gets free text, with no markup in it.
        r = self.ask("Say hello in French.", tools=tools, max_tokens=20)
        self.assertNotIn("<tool_call>", r.choices[0].message.content or "")

    def test_bad_tool_requests_are_400s_naming_the_parameter(self):
        tools, q = tool_sets()[0]
        cases = [
            (dict(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
            (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name"),
            (dict(tools=tools, tool_choice="sometimes"), "tool_choice"),
            (dict(tools=tools, tool_choice="required", response_format={"type": "json_object"}), "response_format"),
            (dict(tools=tools, tool_choice="required", parallel_tool_calls="yes"), "parallel_tool_calls"),
            (dict(tools=[fn("f", {"a": {"type": "array", "uniqueItems": True}})], tool_choice="required"),
             "tools[0].function.parameters"),
        ]
        for kw, param in cases:
            with self.subTest(param=param):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.ask(q, max_tokens=4, **kw)
                self.assertEqual(cm.exception.body["param"], param, cm.exception.body)


@unittest.skipUnless(SMOLLM2 and os.path.isfile(SMOLLM2), "SmolLM2 is missing (scripts/fetch-smollm2.sh)")
class ToolsWithoutTemplateSupport(unittest.TestCase):
    def test_tools_on_a_template_without_them_is_a_400(self):
        server = Server(SMOLLM2, "smollm2")
        try:
            client = server.client()
            with self.assertRaises(openai.BadRequestError) as cm:
                client.chat.completions.create(
                    model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                    tools=tool_sets()[0][0], tool_choice="required")
            self.assertEqual(cm.exception.body["param"], "tools")
            r = client.chat.completions.create(model="smollm2", max_tokens=4,
                                               messages=[{"role": "user", "content": "hi"}])
            self.assertTrue(r.choices[0].message.content)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()
