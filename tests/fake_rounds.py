"""A fake SGLang server for ``bench rounds`` tests, launched as a process (standard library only, so it
starts in a blink): ``python fake_rounds.py --model-path M --speculative-algorithm A ... --host H --port P``.

``POST /generate`` with ``input_ids`` sleeps 20 ms (prefill) + rounds x the algorithm's round time
(``ROUND_S``) and answers the tokens asked for (it insists on greedy and ignore_eos) with
rounds = ceil(tokens / ``ACCEPT``) verify steps.

It starts as SGLang would from the files it is given: the target folder needs ``config.json`` and a
tokenizer, and each model its ``*.safetensors`` unless its load format is ``dummy`` (the draft's:
``--speculative-draft-load-format``, else ``--load-format``)."""

import math
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from fake_http import JsonHandler  # beside this file: the script's folder is on sys.path

ROUND_S = {"EAGLE3": 0.004, "DYNVOCAB": 0.003}
ACCEPT = 1.25  # tokens per round


def handler(round_s: float):
    class Handler(JsonHandler):
        def do_GET(self):
            self._send(200 if self.path == "/health" else 404)

        def do_POST(self):
            payload = self._payload()
            params = payload["sampling_params"]
            if self.path != "/generate" or not params.get("ignore_eos") or params["temperature"] != 0:
                return self._send(400, {"error": {"message": "greedy /generate with ignore_eos only"}})
            n = params["max_new_tokens"]
            rounds = math.ceil(n / ACCEPT)
            time.sleep(0.02 + rounds * round_s)
            meta = {"completion_tokens": n, "spec_verify_ct": rounds, "prompt_tokens": len(payload["input_ids"])}
            self._send(200, {"text": "x" * n, "output_ids": [7] * n, "meta_info": meta})

    return Handler


if __name__ == "__main__":
    argv = sys.argv[1:]
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    target, draft = Path(opt["--model-path"]), Path(opt["--speculative-draft-model-path"])
    assert (target / "config.json").is_file() and (target / "tokenizer.json").is_file() and draft.is_dir()
    target_format = opt.get("--load-format", "auto")
    draft_format = opt.get("--speculative-draft-load-format", target_format)
    for folder, load_format in ((target, target_format), (draft, draft_format)):
        assert (folder / "config.json").is_file()
        assert load_format == "dummy" or any(folder.glob("*.safetensors")), f"no weights in {folder}"
    server = ThreadingHTTPServer((opt["--host"], int(opt["--port"])), handler(ROUND_S[opt["--speculative-algorithm"]]))
    server.daemon_threads = True
    server.serve_forever()
