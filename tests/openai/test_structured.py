"""Structured output through `ferrum serve` with the official `openai` client, on
Qwen2.5-Coder-0.5B-Instruct Q4_K_M (a 151k-token byte-level vocabulary).

50 varied JSON schemas (nested objects, arrays with bounds, enums, integer and number ranges,
required and optional fields, `$ref`, `anyOf`, `const`) each give output that the `jsonschema`
package validates, greedy and sampled; regexes and choices likewise; a streamed constrained
answer is the non-streamed one; bad constraints (with `strict: true`, a schema keyword the
compiler does not implement, such as `uniqueItems`, included) are 400s naming their field;
without `strict` such a keyword is left out and the rest enforced.

Run through scripts/test-openai.sh (FERRUM_QWEN05: the GGUF; skipped when it is missing, except
under CI, which fetches it with scripts/fetch-model.sh qwen2.5-coder-0.5b).
"""

import concurrent.futures
import json
import os
import re
import unittest

import jsonschema
import openai

from test_openai import Server

QWEN05 = os.environ.get("FERRUM_QWEN05", "")


def word(n=12):
    return {"type": "string", "minLength": 1, "maxLength": n}


def obj(props, required=None, extra=False):
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": extra}


def schemas():
    """50 schemas, each bounded so a valid answer fits in the token budget."""
    s = [
        obj({"name": word(), "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
        obj({"city": word(), "country": word(), "population": {"type": "integer", "minimum": 0}}),
        obj({"ok": {"type": "boolean"}}),
        obj({"colour": {"enum": ["red", "green", "blue"]}}),
        obj({"score": {"type": "number", "minimum": 0, "maximum": 10}}),
        obj({"tags": {"type": "array", "items": word(8), "minItems": 1, "maxItems": 3}}),
        obj({"point": obj({"x": {"type": "integer"}, "y": {"type": "integer"}})}),
        obj({"title": word(20), "year": {"type": "integer", "minimum": 1900, "maximum": 2030}}),
        obj({"id": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000}, "label": word()}),
        obj({"items": {"type": "array", "items": obj({"sku": word(6), "qty": {"type": "integer", "minimum": 1, "maximum": 9}}),
                       "minItems": 1, "maxItems": 2}}),
        obj({"name": word(), "nickname": word()}, required=["name"]),
        obj({"status": {"const": "done"}, "count": {"type": "integer", "minimum": 0, "maximum": 99}}),
        obj({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 5}]}}),
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 2, "maxItems": 4},
        {"type": "string", "enum": ["alpha", "beta", "gamma"]},
        {"type": "integer", "minimum": -50, "maximum": 50},
        obj({"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                                   "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}}),
        obj({"user": obj({"name": word(), "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}})}),
        obj({"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}),
        obj({"a": {"type": "integer", "minimum": 0, "maximum": 5}, "b": {"type": "integer", "minimum": 5, "maximum": 10},
             "c": {"type": "integer", "minimum": 10, "maximum": 15}}),
        {"$defs": {"pet": obj({"kind": {"enum": ["cat", "dog"]}, "name": word()})},
         **obj({"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "minItems": 1, "maxItems": 2}})},
        {"$defs": {"money": obj({"amount": {"type": "integer", "minimum": 0, "maximum": 10000}, "currency": {"enum": ["EUR", "USD"]}})},
         **obj({"price": {"$ref": "#/$defs/money"}, "discount": {"$ref": "#/$defs/money"}}, required=["price"])},
        obj({"language": {"enum": ["rust", "python", "go"]}, "stars": {"type": "integer", "minimum": 0, "maximum": 5}}),
        obj({"flags": obj({"a": {"type": "boolean"}, "b": {"type": "boolean"}})}),
        obj({"answer": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}}),
        obj({"summary": word(40), "words": {"type": "integer", "minimum": 1, "maximum": 50}}),
        obj({"temperature": {"type": "number", "minimum": -30, "maximum": 50}, "unit": {"enum": ["C", "F"]}}),
        obj({"steps": {"type": "array", "items": word(16), "minItems": 2, "maxItems": 3}}),
        obj({"rgb": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}, "minItems": 3, "maxItems": 3}}),
        obj({"person": obj({"first": word(), "last": word(), "address": obj({"street": word(16), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})}),
        obj({"yes": {"type": "boolean"}, "why": word(30)}, required=["yes"]),
        obj({"key": {"type": "string", "enum": ["k1", "k2"]}, "values": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 3}}),
        obj({"http": obj({"method": {"enum": ["GET", "POST"]}, "path": {"type": "string", "pattern": "^/[a-z]{1,10}$"},
                          "code": {"type": "integer", "minimum": 100, "maximum": 599}})}),
        obj({"n": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}}),
        obj({"emoji": {"type": "string", "maxLength": 3}, "meaning": word(20)}),
        obj({"list": {"type": "array", "items": obj({"k": word(5), "v": {"type": "integer", "minimum": 0, "maximum": 9}}), "maxItems": 3}}),
        obj({"version": {"type": "string", "pattern": "^[0-9]\\.[0-9]{1,2}\\.[0-9]{1,2}$"}, "stable": {"type": "boolean"}}),
        {"anyOf": [obj({"cat": word()}), obj({"dog": word()})]},
        obj({"weekday": {"enum": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]}, "hour": {"type": "integer", "minimum": 0, "maximum": 23}}),
        obj({"nested": obj({"deeper": obj({"deepest": {"type": "integer", "minimum": 0, "maximum": 3}})})}),
        obj({"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}),
        obj({"pair": {"type": "array", "prefixItems": [word(8), {"type": "integer", "minimum": 0, "maximum": 9}], "items": False, "minItems": 2}}),
        obj({"title": word(20), "authors": {"type": "array", "items": word(), "minItems": 1, "maxItems": 2}, "pages": {"type": "integer", "minimum": 1, "maximum": 2000}}),
        obj({"mood": {"enum": ["happy", "sad", "neutral"]}, "intensity": {"type": "number", "minimum": 0, "maximum": 1}}),
        obj({"code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "name": word(20)}),
        obj({"empty": obj({})}),
        obj({"ids": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99}, "minItems": 1, "maxItems": 3}}),
        obj({"greeting": word(20), "language": {"enum": ["en", "fr", "de"]}}, required=["greeting"]),
        obj({"ok": {"type": "boolean"}, "error": {"type": ["string", "null"], "maxLength": 20}}),
        obj({"animal": {"enum": ["cat", "dog", "fish"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}}),
    ]
    assert len(s) == 50, len(s)
    return s


# A schema with a keyword the schema compiler cannot enforce.
UNIQUE_INTS = {"type": "array", "items": {"type": "integer"}, "maxItems": 5, "uniqueItems": True}


class QwenServer:
    """A test case's server of Qwen2.5-Coder-0.5B, served as `qwen`, shared by its tests."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(QWEN05, "qwen", "--max-num-seqs", "64")
        cls.client = cls.server.client(timeout=600)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()


@unittest.skipUnless(QWEN05 and os.path.isfile(QWEN05),
                     "Qwen2.5-Coder-0.5B is missing (scripts/fetch-model.sh qwen2.5-coder-0.5b)")
class StructuredOutput(QwenServer, unittest.TestCase):

    def ask(self, content, **kw):
        kw.setdefault("max_tokens", 400)
        return self.client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": content}], **kw)

    def run_all(self, jobs):
        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as ex:
            return list(ex.map(lambda j: j(), jobs))

    def test_fifty_schemas_validate_greedy_and_sampled(self):
        cases = schemas()
        greedy, sampled = [], []
        for i, s in enumerate(cases):
            prompt = f"Answer with JSON that follows this schema: {json.dumps(s)}"
            fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s, "strict": True}}
            greedy.append(lambda p=prompt, f=fmt: self.ask(p, temperature=0, response_format=f))
            sampled.append(lambda p=prompt, f=fmt, i=i: self.ask(p, temperature=0.8, seed=i, response_format=f))
        # The sampled wave after the greedy one: its prompts' full blocks come from the prefix
        # cache (structured output over cached prefixes, and most of that wave's prefill saved).
        answers = self.run_all(greedy) + self.run_all(sampled)
        for k, r in enumerate(answers):
            n = len(cases)
            with self.subTest(schema=k % n, sampled=k >= n):
                s = cases[k % n]
                c = r.choices[0]
                self.assertEqual(c.finish_reason, "stop", c.message.content)
                jsonschema.validate(json.loads(c.message.content), s)

    def test_no_whitespace_runaway(self):
        # The case that ran away: a line break, then spaces and line breaks until max_tokens.
        schema = {"type": "object",
                  "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                 "population_millions": {"type": "number"}},
                  "required": ["city", "population_millions"]}
        formats = [{"type": "json_schema", "json_schema": {"name": "capital", "schema": schema,
                                                           "strict": True}},
                   {"type": "json_object"}]
        for fmt in formats:
            for temperature in (0, 0.8):
                with self.subTest(format=fmt["type"], temperature=temperature):
                    r = self.ask("Pick a European capital. Answer in JSON.", max_tokens=200,
                                 temperature=temperature, seed=3, response_format=fmt)
                    c = r.choices[0]
                    self.assertEqual(c.finish_reason, "stop", c.message.content)
                    value = json.loads(c.message.content)
                    if fmt["type"] == "json_schema":
                        jsonschema.validate(value, schema)
                    # Between two JSON tokens: at most one line break and 16 blanks.
                    self.assertIsNone(re.search(r"\n[ \t]*\n|[ \t]{17}", c.message.content),
                                      c.message.content)

    def test_vllm_and_llama_cpp_dialects(self):
        s = schemas()[0]
        for extra in [{"guided_json": s}, {"structured_outputs": {"json": s}}, {"json_schema": s},
                      {"response_format": {"type": "json_object", "schema": s}}]:
            with self.subTest(field=list(extra)[0]):
                r = self.ask("A person as JSON.", temperature=0, extra_body=extra)
                jsonschema.validate(json.loads(r.choices[0].message.content), s)
        r = self.ask("Any JSON object describing a book.", temperature=0, response_format={"type": "json_object"})
        self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
        gbnf = 'root ::= "[" item ("," item){1,2} "]"\nitem ::= [0-9]{1,2}\n'
        for extra in [{"grammar": gbnf}, {"guided_grammar": gbnf}]:
            r = self.ask("Some small numbers.", temperature=0.7, seed=1, extra_body=extra)
            self.assertRegex(r.choices[0].message.content, r"^\[[0-9]{1,2}(,[0-9]{1,2}){1,2}\]$")
        lark = 'start: "x=" NUM\nNUM: /[0-9]{1,3}/'
        r = self.ask("Set x.", temperature=0, extra_body={"structured_outputs": {"grammar": lark}})
        self.assertRegex(r.choices[0].message.content, r"^x=[0-9]{1,3}$")
        # The completions endpoint takes the same fields.
        r = self.client.completions.create(model="qwen", prompt="The answer is", max_tokens=10,
                                           temperature=0, extra_body={"guided_choice": ["yes", "no"]})
        self.assertIn(r.choices[0].text, ["yes", "no"])

    def test_regexes_and_choices(self):
        regexes = [r"[0-9]{3}-[0-9]{4}", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)",
                   r"(true|false)", r"#[0-9a-f]{6}", r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?",
                   r"-?[0-9]{1,3}\.[0-9]{2}", r"(GET|POST) /[a-z]{1,8}"]
        choices = [["yes", "no"], ["red", "green", "blue"], ["Paris", "Berlin", "Rome", "Madrid"],
                   ["positive", "negative", "neutral"], ["A", "B", "C", "D"]]
        jobs = []
        for i, rx in enumerate(regexes):
            for t in (0, 0.9):
                jobs.append(lambda rx=rx, t=t, i=i: ("rx", rx, self.ask(
                    f"Give an example matching {rx}.", temperature=t, seed=i,
                    extra_body={"structured_outputs": {"regex": rx}})))
        for i, c in enumerate(choices):
            for t in (0, 0.9):
                jobs.append(lambda c=c, t=t, i=i: ("choice", c, self.ask(
                    f"Pick one of {', '.join(c)}.", temperature=t, seed=i, extra_body={"guided_choice": c})))
        for kind, want, r in self.run_all(jobs):
            text = r.choices[0].message.content
            with self.subTest(kind=kind, want=want):
                self.assertEqual(r.choices[0].finish_reason, "stop")
                if kind == "rx":
                    self.assertRegex(text, "^(?:" + want + ")$")
                else:
                    self.assertIn(text, want)

    def test_streamed_equals_non_streamed(self):
        s = schemas()[9]
        fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": s}}
        r = self.ask("An order as JSON.", temperature=0, response_format=fmt)
        text = "".join(ch.choices[0].delta.content or "" for ch in
                       self.ask("An order as JSON.", temperature=0, response_format=fmt, stream=True)
                       if ch.choices)
        self.assertEqual(text, r.choices[0].message.content)
        jsonschema.validate(json.loads(text), s)

    def test_bad_constraints_are_400s_naming_the_field(self):
        cases = [
            (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
             "response_format"),
            (dict(extra_body={"guided_regex": "(unclosed"}), "guided_regex"),
            (dict(extra_body={"grammar": "root ::= missing-rule"}), "grammar"),
            (dict(extra_body={"structured_outputs": {"grammar": "start: nowhere"}}), "structured_outputs.grammar"),
            (dict(extra_body={"guided_choice": []}), "guided_choice"),
            (dict(extra_body={"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
            (dict(response_format={"type": "yaml"}), "response_format.type"),
            # Strict: a keyword the schema compiler does not implement is refused, not ignored.
            (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                          "schema": UNIQUE_INTS}}),
             "response_format"),
        ]
        for kw, param in cases:
            with self.subTest(param=param):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.ask("x", max_tokens=4, **kw)
                self.assertEqual(cm.exception.body["param"], param, cm.exception.body)
        # The server still answers.
        r = self.ask("Say hi.", max_tokens=4, temperature=0)
        self.assertTrue(r.choices[0].message.content)

    def test_without_strict_an_unenforceable_keyword_is_left_out(self):
        r = self.ask("List three small integers as a JSON array.", max_tokens=40, temperature=0,
                     response_format={"type": "json_schema",
                                      "json_schema": {"name": "x", "schema": UNIQUE_INTS}})
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "stop", c.message.content)
        rest = {k: v for k, v in UNIQUE_INTS.items() if k != "uniqueItems"}
        jsonschema.validate(json.loads(c.message.content), rest)


if __name__ == "__main__":
    unittest.main()
