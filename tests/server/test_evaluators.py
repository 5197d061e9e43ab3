"""Legacy completions as an evaluator uses them: lm-eval's `local-completions` protocol (its remote
tokenizer: GET /tokenizer_info, POST /tokenize {"prompt"}, POST /detokenize; its loglikelihood
payload: token-id prompts, batches of several, `echo` with `logprobs` 1 and `max_tokens` 1, read as
`token_logprobs[ctxlen:-1]`), on a small multiple-choice task kept in the repository
(data/mc_easy.json). The accuracy comes out the same at batch sizes 1 and 4, above chance, and each
choice's log-likelihood equals the sum the server reports when asked to score the prompt alone
(`max_tokens` 0); then lm-eval itself (0.4.13 with its `api` extra, which needs no torch) runs the
same questions as a task YAML through `local-completions` and its default remote tokenizer, and its
accuracy at batch sizes 1 and 4 must be the one the server's own log-likelihoods give.
The payloads and the reading above are its own, from lm_eval/models/openai_completions.py.)"""
import glob
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import urllib.request

import common

ember, model = common.args()
c = common.Checks("evaluators")
TASK = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mc_easy.json")))
M = "SmolLM2-135M-Instruct.Q4_1"
# The task for lm-eval: the same questions, each choice scored after its context.
TASK_YAML = """task: ember_mc_easy
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def loglikelihoods(url, requests, batch):
    """lm-eval's TemplateAPI.loglikelihood with LocalCompletionsAPI's payload and parse_logprobs."""
    out = []
    for i in range(0, len(requests), batch):
        chunk = requests[i:i + batch]
        status, r = common.post(url + "/v1/completions", {
            "model": M, "prompt": [ctx + cont for ctx, cont in chunk], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True})
        c.check(status == 200 and len(r.get("choices", [])) == len(chunk), f"batch of {len(chunk)}: {status} {str(r)[:200]}")
        for choice, (ctx, cont) in zip(sorted(r["choices"], key=lambda x: x["index"]), chunk):
            lps = choice["logprobs"]["token_logprobs"]
            c.check(len(lps) == len(ctx) + len(cont) + 1 and lps[0] is None,
                    f"the prompt's tokens and one more: {len(lps)} for {len(ctx)} + {len(cont)}")
            out.append(sum(lps[len(ctx):-1]))
    return out


with common.Server(ember, model, ctx=1024) as srv:
    with urllib.request.urlopen(srv.url + "/tokenizer_info") as r:
        info = json.loads(r.read())
    c.check(isinstance(info, dict) and "eos_token" in info and info.get("chat_template"), f"tokenizer_info {str(info)[:120]}")

    def encode(text):
        status, r = common.post(srv.url + "/tokenize", {"prompt": text, "add_special_tokens": False})
        c.check(status == 200 and isinstance(r.get("tokens"), list), f"tokenize {r}")
        return r["tokens"]

    status, back = common.post(srv.url + "/detokenize", {"tokens": encode("Hello world")})
    c.check(back.get("prompt") == "Hello world", f"detokenize {back}")

    # lm-eval's request split: the whole text encoded, the context's tokens first, the rest the continuation.
    requests, golds = [], []
    for q in TASK:
        for choice in q["choices"]:
            whole, ctx = encode(q["context"] + choice), encode(q["context"])
            requests.append((ctx, whole[len(ctx):]))
        golds.append(q["gold"])

    def accuracy(ll):
        n = len(TASK[0]["choices"])
        right = 0
        for k, gold in enumerate(golds):
            scores = ll[k * n:(k + 1) * n]
            right += scores.index(max(scores)) == gold
        return right / len(golds)

    one, four = loglikelihoods(srv.url, requests, 1), loglikelihoods(srv.url, requests, 4)
    c.check(all(math.isfinite(x) and x < 0 for x in one), f"log-likelihoods {one[:4]}")
    c.check(max(abs(a - b) for a, b in zip(one, four)) < 1e-3, "the same log-likelihoods at batch sizes 1 and 4")
    acc1, acc4 = accuracy(one), accuracy(four)
    c.check(acc1 == acc4, f"the same accuracy at batch sizes 1 and 4: {acc1} {acc4}")
    c.check(acc1 >= 0.6, f"accuracy {acc1} on easy questions (chance 0.25; the scoring is read right)")

    # Against the plain text: the continuation's tokens' log-probabilities from an echo of the text.
    for (ctx, cont), ll in list(zip(requests, one))[:8]:
        status, r = common.post(srv.url + "/v1/completions", {
            "model": M, "prompt": [ctx + cont], "max_tokens": 0, "logprobs": 0, "echo": True})
        lps = r["choices"][0]["logprobs"]["token_logprobs"]
        c.check(status == 200 and len(lps) == len(ctx) + len(cont) and abs(sum(lps[len(ctx):]) - ll) < 1e-3,
                f"max_tokens 0: the prompt's log-probabilities only, the same sums: {status} {len(lps)}")

    # lm-eval itself (its `api` extra, no torch), its default remote tokenizer, the task as a YAML
    # over the same file: its accuracy at batch sizes 1 and 4 is the one from the server's scoring.
    if importlib.util.find_spec("lm_eval") is None:
        print("evaluators: lm-eval is not installed (scripts/setup.sh --tests installs it): its own run skipped")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "mc_easy.yaml"), "w") as f:
                f.write(TASK_YAML.format(data=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mc_easy.json")))
            for batch in (1, 4):
                out = os.path.join(tmp, f"out{batch}")
                env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
                run = subprocess.run(
                    [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                     f"model={M},base_url={srv.url}/v1/completions,tokenizer_backend=remote,tokenized_requests=True,"
                     "num_concurrent=1,max_retries=1", "--include_path", tmp, "--tasks", "ember_mc_easy",
                     "--batch_size", str(batch), "--output_path", out],
                    cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
                results = glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True)
                c.check(run.returncode == 0 and len(results) == 1,
                        f"lm_eval at batch size {batch}: exit {run.returncode}, {run.stderr[-800:]}")
                if results:
                    acc = json.load(open(results[0]))["results"]["ember_mc_easy"]["acc,none"]
                    c.check(abs(acc - acc1) < 1e-9, f"lm-eval's accuracy at batch size {batch} is the server's own: {acc} {acc1}")
                    print(f"evaluators: lm-eval local-completions, batch size {batch}: acc {acc:.4f}")
    print(f"evaluators: accuracy {acc1:.3f} on {len(TASK)} questions")
c.done()
