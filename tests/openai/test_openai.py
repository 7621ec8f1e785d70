"""`ferrum serve` driven by the official `openai` Python client.

Run through scripts/test-openai.sh, which installs the client into a venv, builds the binary
and sets FERRUM_BIN (the binary), FERRUM_FIXTURES (tests/fixtures) and FERRUM_SMOLLM2 (the
SmolLM2 GGUF; its tests are skipped when it is missing, and CI always fetches it).
FERRUM_SERVE_ARGS adds flags to every server (`--device cuda` on a GPU: scripts/test-gpu.sh).
FERRUM_LAUNCHER starts every server through a launcher (`mpirun --oversubscribe -n 2` with
`--pipeline-parallel-size 2` in FERRUM_SERVE_ARGS: scripts/test-mpi.sh); a server is then stopped
as a user stops one, with SIGTERM to rank 0.
"""

import json
import os
import subprocess
import threading
import time
import unittest

import urllib.error
import urllib.request

import openai

FIXTURES = os.environ.get("FERRUM_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures"))
TINY = os.path.join(FIXTURES, "tiny-smollm")
SMOLLM2 = os.environ.get("FERRUM_SMOLLM2", "")
SERVE_ARGS = os.environ.get("FERRUM_SERVE_ARGS", "").split()
LAUNCHER = os.environ.get("FERRUM_LAUNCHER", "").split()


def rank0_of(launcher_pid):
    """The pid of rank 0 among an mpirun's children (Linux /proc), or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if b"OMPI_COMM_WORLD_RANK=0" in env or b"PMI_RANK=0" in env:
                return int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return None


class Server:
    """A `ferrum serve` process on a free port of 127.0.0.1."""

    def __init__(self, model, name, *extra):
        self.proc = subprocess.Popen(
            # Without the cost calibration at start (seconds per server on the test build; the
            # Rust serve tests and the engine's own test cover it).
            [*LAUNCHER, os.environ["FERRUM_BIN"], "serve", "--model", model, "--port", "0",
             "--served-model-name", name, "--no-calibration", *SERVE_ARGS, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        deadline = time.time() + 120
        self.base = None
        while self.base is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("ferrum serve exited: " + "".join(self.lines))
            self.lines.append(line)
            if "http://" in line:
                self.base = line[line.index("http://"):].strip()
            if time.time() > deadline:
                raise RuntimeError("ferrum serve did not start")
        # Keep draining stderr so the server never blocks on it.
        self.drain = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.drain.start()

    def client(self, api_key="none", **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, **kw)

    def stop(self):
        rank0 = rank0_of(self.proc.pid) if LAUNCHER else None
        if rank0 is not None:
            # Rank 0 shuts down gracefully and stops the other ranks; mpirun then exits.
            os.kill(rank0, 15)
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.drain.join(timeout=10)
        self.proc.stderr.close()
        return self.proc.returncode


class Raw:
    """A plain HTTP response: status, headers, body text."""

    def __init__(self, status, headers, text):
        self.status_code, self.headers, self.text = status, headers, text

    def json(self):
        return json.loads(self.text)


def http(method, url, body=None, raw=None):
    """One request with the standard library, for routes outside the OpenAI client."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return Raw(r.status, r.headers, r.read().decode())
    except urllib.error.HTTPError as e:
        return Raw(e.code, e.headers, e.read().decode())


def post(url, json=None, raw=None):
    return http("POST", url, json, raw)


def get(url):
    return http("GET", url)


def reference(model_dir):
    with open(os.path.join(model_dir, "reference.json")) as f:
        return json.load(f)


class TinySmollm(unittest.TestCase):
    """Every endpoint and parameter on the tiny random-weight fixture (HF reference)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(TINY, "tiny")
        cls.c = cls.server.client()
        cls.ref = reference(TINY)["cases"][0]

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.lines)

    def chat(self, **kw):
        args = dict(model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8)
        args.update(kw)
        return self.c.chat.completions.create(**args)

    def test_models(self):
        models = self.c.models.list().data
        self.assertEqual([m.id for m in models], ["tiny"])
        self.assertEqual(models[0].owned_by, "ferrum")
        self.assertEqual(self.c.models.retrieve("tiny").id, "tiny")
        with self.assertRaises(openai.NotFoundError):
            self.c.models.retrieve("nope")

    def test_completion_greedy_matches_transformers(self):
        r = self.c.completions.create(model="tiny", prompt=self.ref["prompt"], max_tokens=16,
                                      temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].text, self.ref["greedy_text"])
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, len(self.ref["prompt_ids"]))
        self.assertEqual(r.usage.completion_tokens, 16)
        self.assertEqual(r.usage.total_tokens, 16 + len(self.ref["prompt_ids"]))
        # The same prompt as token ids, and a batch of both.
        r2 = self.c.completions.create(model="tiny", prompt=self.ref["prompt_ids"], max_tokens=16,
                                       temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r2.choices[0].text, self.ref["greedy_text"])
        r3 = self.c.completions.create(model="tiny", prompt=[self.ref["prompt"], self.ref["prompt_ids"]],
                                       max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r3.choices], [0, 1])
        self.assertEqual([c.text for c in r3.choices], [self.ref["greedy_text"]] * 2)
        self.assertEqual(r3.usage.completion_tokens, 32)

    def test_completion_echo_and_stop(self):
        text = self.ref["greedy_text"]
        stop = "recruitment"
        r = self.c.completions.create(model="tiny", prompt=self.ref["prompt"], max_tokens=16,
                                      temperature=0, stop=[stop], echo=True,
                                      extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, self.ref["prompt"] + text[:text.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_completion_streaming(self):
        chunks = list(self.c.completions.create(model="tiny", prompt=self.ref["prompt"], max_tokens=16,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, self.ref["greedy_text"])
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 16)

    def test_completion_logprobs(self):
        r = self.c.completions.create(model="tiny", prompt=self.ref["prompt"], max_tokens=4,
                                      temperature=0, logprobs=3, extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(lp.text_offset[0], 0)
        for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertEqual(len(top), 3)
            self.assertLess(tlp, 0.0)
            # Greedy: the sampled token is the most likely one.
            self.assertAlmostEqual(tlp, max(top.values()), places=4)
            self.assertIn(tok, top)

    def test_chat(self):
        r = self.chat(temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.model, "tiny")
        m = r.choices[0].message
        self.assertEqual(m.role, "assistant")
        self.assertIsInstance(m.content, str)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        # usage.prompt_tokens is what the template renders to.
        tok = post(self.server.base + "/tokenize",
                         json={"messages": [{"role": "user", "content": "Hello there"}]}).json()
        self.assertEqual(r.usage.prompt_tokens, tok["count"])
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        # Content as an array of text parts, and a system message, are accepted.
        r2 = self.chat(temperature=0, messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}])
        self.assertIsInstance(r2.choices[0].message.content, str)

    def test_chat_streaming(self):
        plain = self.chat(temperature=0, max_tokens=10, extra_body={"ignore_eos": True})
        chunks = list(self.chat(temperature=0, max_tokens=10, stream=True,
                                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual(len({c.id for c in chunks}), 1)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, plain.choices[0].message.content)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, ["length"])
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        self.assertEqual(chunks[-1].usage.prompt_tokens, plain.usage.prompt_tokens)
        # Without include_usage there is no usage chunk.
        chunks = list(self.chat(max_tokens=3, stream=True))
        self.assertTrue(all(c.usage is None for c in chunks))
        self.assertTrue(all(c.choices for c in chunks))

    def test_n(self):
        r = self.chat(n=2, max_tokens=6, seed=1, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.usage.completion_tokens, 12)
        # Streaming: role chunks and finish reasons for both choices.
        chunks = list(self.chat(n=2, max_tokens=6, stream=True, extra_body={"ignore_eos": True}))
        roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role]
        self.assertEqual(sorted(roles), [0, 1])
        ends = sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason)
        self.assertEqual(ends, [0, 1])

    def test_seed_reproducibility(self):
        a = self.chat(temperature=1.0, seed=1234, max_tokens=12, extra_body={"ignore_eos": True})
        b = self.chat(temperature=1.0, seed=1234, max_tokens=12, extra_body={"ignore_eos": True})
        c = self.chat(temperature=1.0, seed=4321, max_tokens=12, extra_body={"ignore_eos": True})
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)
        self.assertNotEqual(a.choices[0].message.content, c.choices[0].message.content)

    def test_stop_in_chat(self):
        base = self.chat(temperature=0, max_tokens=12, extra_body={"ignore_eos": True}).choices[0].message.content
        words = base.split()
        self.assertGreater(len(words), 2)
        stop = words[2]
        r = self.chat(temperature=0, max_tokens=12, stop=stop, extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].message.content, base[:base.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_chat_logprobs(self):
        r = self.chat(temperature=0, logprobs=True, top_logprobs=3, max_tokens=5,
                      extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 5)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertEqual(t.bytes, list(t.token.encode()))
            self.assertAlmostEqual(t.logprob, t.top_logprobs[0].logprob, places=4)
        # Streamed chunks carry the same logprobs.
        chunks = list(self.chat(temperature=0, logprobs=True, top_logprobs=3, max_tokens=5, stream=True,
                                extra_body={"ignore_eos": True}))
        streamed = [t.logprob for c in chunks if c.choices and c.choices[0].logprobs
                    for t in c.choices[0].logprobs.content]
        for x, y in zip(streamed, [t.logprob for t in content]):
            self.assertAlmostEqual(x, y, places=4)
        self.assertEqual(len(streamed), 5)

    def test_logit_bias_and_penalties(self):
        ids = post(self.server.base + "/tokenize", json={"prompt": " Paris", "add_special_tokens": False}).json()
        forced = ids["tokens"][0]
        r = self.c.completions.create(model="tiny", prompt=self.ref["prompt"], max_tokens=3, temperature=0,
                                      logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
        back = post(self.server.base + "/detokenize", json={"tokens": [forced] * 3}).json()
        self.assertEqual(r.choices[0].text, back["prompt"])
        r = self.chat(temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5, seed=3,
                      user="someone", extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
        self.assertIsInstance(r.choices[0].message.content, str)

    def test_max_completion_tokens(self):
        r = self.chat(max_tokens=None, max_completion_tokens=3, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_errors(self):
        bad = [
            dict(temperature=-1),
            dict(top_p=0),
            dict(n=0),
            dict(n=500),
            dict(logprobs=True, top_logprobs=30),
            dict(max_tokens=0),
            dict(max_tokens=100000),
            dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
            dict(response_format={"type": "yaml"}),
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
            dict(messages=[]),
            dict(messages=[{"role": "wizard", "content": "x"}]),
            dict(messages=[{"role": "user", "content": "x " * 3000}]),
            dict(logit_bias={"999999": 5}),
            dict(extra_body={"temperature": "warm"}),
        ]
        for kw in bad:
            with self.subTest(kw=str(kw)[:80]):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.chat(**kw)
                err = cm.exception.body
                self.assertIsInstance(err["message"], str)
                self.assertEqual(err["type"], "invalid_request_error")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
        self.assertEqual(cm.exception.body["param"], "tools")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat(messages=[{"role": "user", "content": "x " * 3000}])
        self.assertEqual(cm.exception.body["code"], "context_length_exceeded")
        with self.assertRaises(openai.NotFoundError) as cm:
            self.chat(model="gpt-5")
        self.assertEqual(cm.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError):
            self.c.completions.create(model="tiny", prompt="x", suffix="y")
        with self.assertRaises(openai.BadRequestError):
            self.c.completions.create(model="tiny", prompt=[[1, 2, 999999]])
        r = post(self.server.base + "/v1/nothing", {})
        self.assertEqual(r.status_code, 404)
        self.assertEqual(r.json()["error"]["code"], "not_found")
        # A server error is never what a client mistake gets.
        r = post(self.server.base + "/v1/chat/completions", raw=b"\xff\xfe garbage")
        self.assertEqual(r.status_code, 400)
        self.assertIn("error", r.json())

    def test_tokenize_roundtrip(self):
        t = post(self.server.base + "/tokenize", json={"prompt": self.ref["prompt"]}).json()
        self.assertEqual(t["tokens"], self.ref["prompt_ids"])
        d = post(self.server.base + "/detokenize", json={"tokens": t["tokens"]}).json()
        self.assertEqual(d["prompt"], self.ref["prompt"])
        # llama-server's body and answer: {"content"} -> {"tokens"} (and each piece on request).
        t = post(self.server.base + "/tokenize", json={"content": self.ref["prompt"]}).json()
        self.assertEqual(t, {"tokens": self.ref["prompt_ids"]})
        t = post(self.server.base + "/tokenize",
                 json={"content": self.ref["prompt"], "with_pieces": True}).json()
        self.assertEqual([p["id"] for p in t["tokens"]], self.ref["prompt_ids"])
        self.assertEqual("".join(p["piece"] for p in t["tokens"]), self.ref["prompt"])

    def test_health_and_metrics(self):
        self.assertEqual(get(self.server.base + "/health").status_code, 200)
        m = get(self.server.base + "/metrics").text
        for name in ("ferrum_kv_blocks_total", "ferrum_kv_blocks_free", "ferrum_num_requests_running",
                     "ferrum_time_to_first_token_seconds_bucket", "ferrum_generation_tokens_total"):
            self.assertIn(name, m)


class Limits(unittest.TestCase):
    """401, 413 and 503 need a server with a key, a small body limit and a tiny queue."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(TINY, "tiny", "--api-key", "s3cret", "--max-request-bytes", "20000",
                            "--max-num-seqs", "1", "--max-waiting-requests", "0")

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.lines)

    def test_api_key(self):
        with self.assertRaises(openai.AuthenticationError):
            self.server.client(api_key="wrong").models.list()
        self.assertEqual(self.server.client(api_key="s3cret").models.list().data[0].id, "tiny")
        self.assertEqual(get(self.server.base + "/health").status_code, 200)

    def test_body_too_large(self):
        c = self.server.client(api_key="s3cret")
        with self.assertRaises(openai.APIStatusError) as cm:
            c.completions.create(model="tiny", prompt="word " * 10000, max_tokens=1)
        self.assertEqual(cm.exception.status_code, 413)

    def test_queue_full(self):
        c = self.server.client(api_key="s3cret")
        held = c.completions.create(model="tiny", prompt="hi", max_tokens=1500, stream=True,
                                    extra_body={"ignore_eos": True})
        next(iter(held))
        with self.assertRaises(openai.InternalServerError) as cm:
            c.completions.create(model="tiny", prompt="hi", max_tokens=2)
        self.assertEqual(cm.exception.status_code, 503)
        self.assertEqual(cm.exception.response.headers["retry-after"], "1")
        held.close()
        # Once the held stream is gone its slot frees up.
        deadline = time.time() + 20
        while True:
            try:
                c.completions.create(model="tiny", prompt="hi", max_tokens=2)
                break
            except openai.InternalServerError:
                self.assertLess(time.time(), deadline)
                time.sleep(0.2)


@unittest.skipUnless(SMOLLM2 and os.path.exists(SMOLLM2), "SmolLM2 GGUF not fetched (scripts/fetch-smollm2.sh)")
class SmolLM2(unittest.TestCase):
    """The real model against HF transformers' greedy references (float reference path)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(SMOLLM2, "smollm2", "--matmul-precision", "float")
        cls.c = cls.server.client()
        ref = reference(os.path.join(FIXTURES, "smollm2-135m"))
        cls.cases = {c["name"]: c for c in ref["cases"]}

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.lines)

    def test_chat_answer(self):
        case = self.cases["chat"]
        r = self.c.chat.completions.create(model="smollm2", messages=case["messages"], temperature=0,
                                           max_tokens=32)
        # The reference runs past <|im_end|>; the server stops there.
        want = case["generated_text"].split("<|im_end|>")[0]
        self.assertEqual(r.choices[0].message.content, want)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.prompt_tokens, len(case["prompt_ids"]))
        stream = self.c.chat.completions.create(model="smollm2", messages=case["messages"], temperature=0,
                                                max_tokens=32, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream), want)

    def test_raw_completion(self):
        case = self.cases["raw"]
        r = self.c.completions.create(model="smollm2", prompt=case["prompt_ids"], temperature=0,
                                      max_tokens=len(case["generated_ids"]), extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, case["generated_text_skip_special"])
        self.assertEqual(r.usage.completion_tokens, len(case["generated_ids"]))

    def test_sampled_chat_n2_stream(self):
        msgs = [{"role": "user", "content": "Name a color."}]
        a = self.c.chat.completions.create(model="smollm2", messages=msgs, n=2, seed=7, max_tokens=16)
        b = self.c.chat.completions.create(model="smollm2", messages=msgs, n=2, seed=7, max_tokens=16)
        self.assertEqual([c.message.content for c in a.choices], [c.message.content for c in b.choices])
        self.assertTrue(all(c.message.content for c in a.choices))


@unittest.skipUnless(SMOLLM2 and os.path.exists(SMOLLM2), "SmolLM2 GGUF not fetched (scripts/fetch-smollm2.sh)")
class SmolLM2Int8(unittest.TestCase):
    """The fast default (int8 activations) keeps the reference's first greedy tokens."""

    def test_raw_completion(self):
        server = Server(SMOLLM2, "smollm2")
        try:
            r = server.client().completions.create(model="smollm2", prompt="The capital of France is",
                                                   temperature=0, max_tokens=8)
            self.assertTrue(r.choices[0].text.startswith(" Paris."), r.choices[0].text)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
