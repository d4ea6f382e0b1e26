"""The official `openai` Python client (pinned in tests/openai/requirements.txt) against
`brook serve` with the bundled demo model on the CPU: chat and completions, streamed and not,
n=2, stop, seed reproducibility, logprobs shape, include_usage, penalties and logit bias, error
cases (400, 404, 429 with Retry-After), and a client that goes away mid-stream (then /metrics
shows nothing running and no KV block in use).

    scripts/openai-test.sh        (installs the client; env: BROOK_BIN, BROOK_MODEL)
    python3 tests/openai/test_openai_api.py
"""

import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import openai
from openai import OpenAI

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("BROOK_BIN", os.path.join(ROOT, "target", "release", "brook"))
MODEL_DIR = os.environ.get("BROOK_MODEL", os.path.join(ROOT, "models", "demo-chat"))
MODEL = os.path.basename(MODEL_DIR.rstrip("/"))
QUESTION = [{"role": "user", "content": "Where is my order #48213? It was supposed to arrive yesterday."}]


class Server:
    """`brook serve` on a free port; the log tells the port."""

    def __init__(self, *extra):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [BIN, "serve", "--device", "cpu", "--port", "0", "--model", MODEL_DIR, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("brook serve exited:\n" + self.read_log())
            m = re.search(r"brook listening on http://[^:]+:(\d+)", self.read_log())
            self.port = int(m.group(1)) if m else None
            time.sleep(0.1)
        if self.port is None:
            raise RuntimeError("brook serve did not start:\n" + self.read_log())
        self.url = f"http://127.0.0.1:{self.port}"
        # No retries: a 429 must reach the test as it is.
        self.client = OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def read_log(self):
        with open(self.log.name) as f:
            return f.read()

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics") as resp:
            text = resp.read().decode()
        return {m.group(1): float(m.group(2))
                for m in re.finditer(r"^(brook:[a-z_]+) ([0-9.e+-]+)$", text, re.M)}

    def wait_idle(self, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics()
            if (m["brook:num_requests_running"], m["brook:num_requests_waiting"],
                    m["brook:kv_cache_blocks_used"]) == (0, 0, 0):
                return m
            time.sleep(0.05)
        raise AssertionError(f"still busy: {self.metrics()}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        os.unlink(self.log.name)


def setUpModule():
    global SERVER
    SERVER = Server()


def tearDownModule():
    SERVER.stop()


class ChatAndCompletions(unittest.TestCase):
    def setUp(self):
        self.c = SERVER.client

    def test_chat_whole(self):
        r = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, seed=1)
        self.assertEqual(r.object, "chat.completion")
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.model, MODEL)
        choice = r.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertTrue(choice.message.content)
        self.assertIn(choice.finish_reason, ("stop", "length"))
        u = r.usage
        self.assertGreater(u.prompt_tokens, 0)
        self.assertGreater(u.completion_tokens, 0)
        self.assertLessEqual(u.completion_tokens, 40)
        self.assertEqual(u.total_tokens, u.prompt_tokens + u.completion_tokens)

    def test_chat_streamed(self):
        chunks = list(self.c.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=30, seed=2, stream=True))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertTrue(all(c.object == "chat.completion.chunk" for c in chunks))
        self.assertTrue(all(c.usage is None for c in chunks))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        self.assertIn(chunks[-1].choices[0].finish_reason, ("stop", "length"))
        self.assertTrue(all(c.choices[0].finish_reason is None for c in chunks[:-1]))
        # The stream is the whole answer: same seed, same text.
        whole = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30, seed=2)
        self.assertEqual(text, whole.choices[0].message.content)

    def test_completions_whole_and_streamed(self):
        r = self.c.completions.create(model=MODEL, prompt="Our return policy", max_tokens=12, seed=3)
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertTrue(r.choices[0].text)
        self.assertLessEqual(r.usage.completion_tokens, 12)
        chunks = list(self.c.completions.create(
            model=MODEL, prompt="Our return policy", max_tokens=12, seed=3, stream=True))
        self.assertEqual("".join(c.choices[0].text for c in chunks), r.choices[0].text)
        self.assertEqual(chunks[-1].choices[0].finish_reason, r.choices[0].finish_reason)

    def test_n2(self):
        r = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=25, n=2,
                                           temperature=1.0, seed=4, logprobs=True)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        # Two sample streams: the token counts add up to the usage, the texts differ.
        self.assertEqual(sum(len(c.logprobs.content) for c in r.choices), r.usage.completion_tokens)
        self.assertNotEqual(r.choices[0].message.content, r.choices[1].message.content)
        chunks = list(self.c.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=10, n=2, seed=4, stream=True))
        self.assertEqual({c.choices[0].index for c in chunks}, {0, 1})
        finished = [c.choices[0].index for c in chunks if c.choices[0].finish_reason]
        self.assertEqual(sorted(finished), [0, 1])

    def test_stop(self):
        full = self.c.completions.create(model=MODEL, prompt="Hello", max_tokens=40, seed=5,
                                         extra_body={"ignore_eos": True}).choices[0].text
        cut = full.find(" ", 3)
        self.assertGreater(cut, 0, full)
        stop = full[cut:cut + 2]
        r = self.c.completions.create(model=MODEL, prompt="Hello", max_tokens=40, seed=5, stop=stop,
                                      extra_body={"ignore_eos": True})
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "stop")
        self.assertEqual(c.text, full[:full.find(stop)])
        self.assertNotIn(stop, c.text)

    def test_seed_reproducibility(self):
        def run(seed):
            return self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                                  temperature=1.2, seed=seed).choices[0].message.content
        self.assertEqual(run(11), run(11))
        self.assertNotEqual({run(s) for s in (12, 13, 14)}, {run(11)})

    def test_logprobs_shape(self):
        r = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=15, seed=6,
                                           logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for e in content:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(bytes(e.bytes).decode("utf-8", "replace"), e.token)
            self.assertEqual(len(e.top_logprobs), 3)
            lps = [t.logprob for t in e.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            # The sampled token is at most as likely as the most likely one.
            self.assertLessEqual(e.logprob, lps[0] + 1e-6)
        r = self.c.completions.create(model=MODEL, prompt="Hello", max_tokens=8, seed=6, logprobs=2)
        lp = r.choices[0].logprobs
        n = r.usage.completion_tokens
        self.assertEqual([len(lp.tokens), len(lp.token_logprobs), len(lp.top_logprobs), len(lp.text_offset)],
                         [n] * 4)
        self.assertTrue(all(1 <= len(t) <= 3 for t in lp.top_logprobs))
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        # Without logprobs: none.
        r = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3)
        self.assertIsNone(r.choices[0].logprobs)

    def test_include_usage(self):
        chunks = list(self.c.completions.create(model=MODEL, prompt="Hello", max_tokens=6, seed=7,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        last = chunks[-1]
        self.assertEqual(last.choices, [])
        self.assertEqual(last.usage.completion_tokens, 6)
        self.assertGreater(last.usage.prompt_tokens, 0)
        self.assertEqual(last.usage.total_tokens, last.usage.prompt_tokens + 6)
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))

    def test_penalties_and_logit_bias(self):
        # Greedy with presence and frequency penalties, checked against the reference rule: at
        # each position the token taken maximises logprob - (frequency x count + presence x
        # [count > 0]) over the output so far, among the 20 most likely (logprobs are the
        # model's own, before penalties).
        pres, freq = 1.5, 0.8
        r = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0,
                                           presence_penalty=pres, frequency_penalty=freq,
                                           logprobs=True, top_logprobs=20)
        counts, flips = {}, 0
        for e in r.choices[0].logprobs.content:
            def adjusted(tok, lp):
                n = counts.get(tok, 0)
                return lp - (freq * n + (pres if n else 0.0))
            best = max(adjusted(t.token, t.logprob) for t in e.top_logprobs)
            self.assertAlmostEqual(adjusted(e.token, e.logprob), best, delta=1e-4)
            flips += e.token != e.top_logprobs[0].token
            counts[e.token] = counts.get(e.token, 0) + 1
        self.assertGreater(flips, 0, "the penalties changed no choice")
        # Biasing one token id to +100 makes it the only one sampled.
        biased = self.c.completions.create(model=MODEL, prompt="Hello", max_tokens=5, seed=8,
                                           logit_bias={"100": 100}, logprobs=0,
                                           extra_body={"ignore_eos": True})
        toks = biased.choices[0].logprobs.tokens
        self.assertEqual(len(toks), 5)
        self.assertEqual(len(set(toks)), 1, toks)


class Errors(unittest.TestCase):
    def setUp(self):
        self.c = SERVER.client

    def test_unsupported_field_is_400_naming_it(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.c.chat.completions.create(model=MODEL, messages=QUESTION, response_format={"type": "json_object"})
        err = cm.exception.body
        self.assertEqual(err["param"], "response_format")
        self.assertEqual(err["type"], "invalid_request_error")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.c.chat.completions.create(model=MODEL, messages=QUESTION, temperature=-1)
        self.assertEqual(cm.exception.body["param"], "temperature")

    def test_unknown_model_is_404(self):
        with self.assertRaises(openai.NotFoundError) as cm:
            self.c.chat.completions.create(model="gpt-4o", messages=QUESTION)
        self.assertEqual(cm.exception.body["code"], "model_not_found")
        self.assertEqual([m.id for m in self.c.models.list()], [MODEL])

    def test_overload_is_429_with_retry_after(self):
        tight = Server("--config", os.path.join(ROOT, "tests", "openai", "tight.toml"))
        try:
            with self.assertRaises(openai.RateLimitError) as cm:
                # Three prompts: one runs, one waits, the third is refused (an `n` over the
                # server's one sequence slot would be a 400: the engine forks choices at once).
                tight.client.completions.create(model=MODEL, prompt=["Hello", "Hi", "Hey"],
                                                max_tokens=300, extra_body={"ignore_eos": True})
            self.assertGreaterEqual(int(cm.exception.response.headers["retry-after"]), 1)
            self.assertEqual(cm.exception.body["code"], "overloaded")
            tight.wait_idle()
        finally:
            tight.stop()

    def test_disconnect_mid_stream_cancels(self):
        before = SERVER.wait_idle()["brook:generation_tokens_total"]
        stream = self.c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1000,
                                                stream=True, n=2, extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 5:
                break
        self.assertGreater(SERVER.metrics()["brook:num_requests_running"], 0)
        stream.close()
        after = SERVER.wait_idle()
        self.assertEqual(after["brook:num_requests_running"], 0)
        self.assertEqual(after["brook:kv_cache_blocks_used"], 0)
        # Stopped long before the 2 x 1000 tokens asked for.
        self.assertLess(after["brook:generation_tokens_total"] - before, 1500)


if __name__ == "__main__":
    # Counts in the form .ci/run totals (as node's test runner prints them).
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"ℹ pass {result.testsRun - failed - len(result.skipped)}")
    print(f"ℹ fail {failed}")
    sys.exit(0 if result.wasSuccessful() else 1)
