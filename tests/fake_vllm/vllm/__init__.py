"""A stand-in for vLLM's offline API, for tests of ``peagle train data --engine vllm`` without vLLM.

Answers are a function of the prompt; ``FAKE_VLLM_EXIT_AFTER=n`` makes the process die after n
``generate`` calls, as a killed engine would; ``FAKE_VLLM_SLEEP`` makes each call slow and
``FAKE_VLLM_PID_FILE`` names a file to write the process id to. Like vLLM's CPU build, a sampled
request with its own seed fails ("CPU Generator does not use offset").
"""
import os
import time

_calls = 0


class SamplingParams:
    def __init__(self, **kwargs):
        self.max_tokens = kwargs["max_tokens"]
        self.seeded = kwargs.get("seed") is not None and kwargs.get("temperature", 0) > 0


class _Out:
    def __init__(self, token_ids):
        self.token_ids = token_ids


class _Request:
    def __init__(self, token_ids):
        self.outputs = [_Out(token_ids)]


class LLM:
    def __init__(self, model, **kwargs):
        self.model = model
        if os.environ.get("FAKE_VLLM_PID_FILE"):
            with open(os.environ["FAKE_VLLM_PID_FILE"], "w") as f:
                f.write(str(os.getpid()))

    def generate(self, prompts, params):
        global _calls
        if _calls == int(os.environ.get("FAKE_VLLM_EXIT_AFTER", "-1")):
            os._exit(3)
        _calls += 1
        time.sleep(float(os.environ.get("FAKE_VLLM_SLEEP", "0")))
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        if any(sp.seeded for sp in per_prompt):
            raise RuntimeError("CPU Generator does not use offset")
        return [_Request([sum(p["prompt_token_ids"]) % 97, len(p["prompt_token_ids"])][: sp.max_tokens])
                for p, sp in zip(prompts, per_prompt)]
