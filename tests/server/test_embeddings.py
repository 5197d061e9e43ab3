"""Embeddings against the real clients: the `openai` SDK's embeddings.create (its default base64
encoding and floats), the `ollama` client's embed, Ollama's older /api/embeddings; every form of
`input`; the same vector for an input alone, in a batch, as token ids and while a chat generates
beside it (the engine batches both); pooling that tells a paraphrase from an unrelated sentence;
--pooling last; errors that name the field; the counters in /metrics."""
import math
import threading
import urllib.request

import common

ember, model = common.args()
ollama, openai = common.clients("ollama", "openai")

c = common.Checks("embeddings")
M = "SmolLM2-135M-Instruct.Q4_1"
TEXTS = ["Paris is the capital of France.", "The capital of France is Paris.", "Bananas are yellow and sweet."]


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def close(a, b, tol=1e-5):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


with common.Server(ember, model, ctx=256) as srv:
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    r = oa.embeddings.create(model=M, input=TEXTS)  # the SDK asks for base64 and decodes it
    v = [d.embedding for d in r.data]
    c.check(len(v) == 3 and all(len(x) == 576 for x in v) and [d.index for d in r.data] == [0, 1, 2],
            f"three vectors of n_embd = 576: {[len(x) for x in v]}")
    c.check(all(abs(math.sqrt(dot(x, x)) - 1) < 1e-5 for x in v), "normalized")
    c.check(dot(v[0], v[1]) > dot(v[0], v[2]) + 0.05, f"a paraphrase is nearer than an unrelated sentence: "
            f"{dot(v[0], v[1]):.3f} vs {dot(v[0], v[2]):.3f}")
    floats = oa.embeddings.create(model=M, input=TEXTS, encoding_format="float")
    c.check(all(close(a.embedding, b) for a, b in zip(floats.data, v)), "float and base64 encodings agree")
    alone = [oa.embeddings.create(model=M, input=t) for t in TEXTS]
    c.check(all(close(a.data[0].embedding, b) for a, b in zip(alone, v)), "each input alone gives its vector in a batch")
    c.check(r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone) == r.usage.total_tokens and
            r.usage.prompt_tokens > 15, f"usage {r.usage}")
    status, tok = common.post(srv.url + "/tokenize", {"content": TEXTS[0], "add_special": True})
    ids = tok["tokens"]
    by_ids = oa.embeddings.create(model=M, input=ids)
    by_id_lists = oa.embeddings.create(model=M, input=[ids, ids[:3]])
    c.check(close(by_ids.data[0].embedding, v[0]) and close(by_id_lists.data[0].embedding, v[0]) and
            len(by_id_lists.data) == 2, "token ids embed as their text")

    # Beside a generating chat: both get what they get alone.
    Q = [{"role": "user", "content": "Count from one to twenty in words."}]
    want = oa.chat.completions.create(model=M, messages=Q, temperature=0, max_tokens=48).choices[0].message.content
    got = {}
    th = threading.Thread(target=lambda: got.update(
        text="".join(ch.choices[0].delta.content or "" for ch in oa.chat.completions.create(
            model=M, messages=Q, temperature=0, max_tokens=48, stream=True) if ch.choices)))
    th.start()
    during = [oa.embeddings.create(model=M, input=TEXTS) for _ in range(3)]
    th.join()
    c.check(got.get("text") == want, f"the chat beside embeddings: {got.get('text')!r} vs {want!r}")
    c.check(all(close(d.embedding, x) for e in during for d, x in zip(e.data, v)), "embeddings beside a chat")

    # Ollama's client: the same vectors; the older route unnormalized.
    ol = ollama.Client(host=srv.url)
    e = ol.embed(model=M, input=TEXTS)
    c.check(len(e.embeddings) == 3 and all(close(a, b) for a, b in zip(e.embeddings, v)) and
            e.prompt_eval_count == r.usage.prompt_tokens, f"ollama embed {e.prompt_eval_count}")
    one = ol.embed(model=M, input=TEXTS[1])
    c.check(close(one.embeddings[0], v[1]), "ollama embed of one string")
    legacy = ol.embeddings(model=M, prompt=TEXTS[0]).embedding
    n = math.sqrt(dot(legacy, legacy))
    c.check(n > 1.5 and close([x / n for x in legacy], v[0]), f"/api/embeddings is the unnormalized vector (norm {n:.2f})")

    # Longer than the context (256): OpenAI's a 400 naming the input, Ollama's cut unless truncate is false.
    long_text = "word " * 400
    status, body = common.post(srv.url + "/v1/embeddings", {"input": ["short", long_text]})
    c.check(status == 400 and body["error"]["param"] == "input[1]" and body["error"]["code"] == "context_length_exceeded"
            and "256" in body["error"]["message"], f"too long {status} {body}")
    cut = ol.embed(model=M, input=long_text)
    c.check(cut.prompt_eval_count == 256 and len(cut.embeddings[0]) == 576, f"truncated {cut.prompt_eval_count}")
    status, body = common.post(srv.url + "/api/embed", {"model": M, "input": long_text, "truncate": False})
    c.check(status == 400 and "truncate" in body["error"], f"truncate false {status} {body}")

    for req, param in [({"input": []}, "input"), ({"input": ""}, "input"), ({"input": [""]}, "input[0]"),
                       ({"input": 5}, "input"), ({"input": [[1, 2], [99999999]]}, "input[1]"),
                       ({"input": ["a", 3]}, "input[1]"), ({}, "input"),
                       ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                       ({"input": "a", "dimensions": 64}, "dimensions"), ({"input": "a", "model": "gpt"}, "model")]:
        status, body = common.post(srv.url + "/v1/embeddings", req)
        c.check(status in (400, 404) and body["error"]["param"] == param, f"{req}: {status} {body}")
    try:
        ol.embed(model="other", input="a")
        c.check(False, "ollama: another model is refused")
    except ollama.ResponseError as err:
        c.check(err.status_code == 404 and "not found" in str(err), f"ollama: another model {err}")
    status, body = common.post(srv.url + "/api/embed", {"model": M, "input": [1, 2]})
    c.check(status == 400 and "input[0]" in body["error"], f"ollama takes strings {status} {body}")

    with urllib.request.urlopen(srv.url + "/metrics") as resp:
        metrics = resp.read().decode()
    count = [float(l.split()[1]) for l in metrics.splitlines() if l.startswith("ember_embeddings_total{")]
    c.check(count and count[0] >= 20, f"ember_embeddings_total {count}")
    c.check(srv.alive(), "the server is alive")

# --pooling last: the last token's state, which differs from the mean and is still normalized.
with common.Server(ember, model, "--pooling", "last", ctx=256) as srv:
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    last = oa.embeddings.create(model=M, input=TEXTS).data
    c.check(all(abs(math.sqrt(dot(x.embedding, x.embedding)) - 1) < 1e-5 for x in last) and
            not close(last[0].embedding, v[0], 1e-2), "last pooling differs from mean")
    extended = oa.embeddings.create(model=M, input=TEXTS[0] + " It is big.").data[0].embedding
    c.check(not close(extended, last[0].embedding, 1e-2), "the last token's state moves with the text's end")

c.done()
