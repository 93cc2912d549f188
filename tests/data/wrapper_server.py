"""A server run by a wrapper script, not `python -m sglang.launch_server`: SGLang-shaped log
lines (a `server_args` line naming port 30000, then a decode line a second) on stdout, its
command line `python3 wrapper_server.py`. From a new user's reproduction (README plain-file
setup, `python3 fake_server.py 2>&1 | tee -a log`); the line formats are SGLang 0.5.x's
(sglang/srt/server_args.py `server_args=ServerArgs(...)`, scheduler's `Decode batch` line)."""

import time
from datetime import datetime


def ts() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


print(f"[{ts()}] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', "
      "tokenizer_path='meta-llama/Llama-3.1-8B-Instruct', host='127.0.0.1', port=30000, tp_size=1, dp_size=1, "
      "speculative_algorithm='EAGLE3', speculative_draft_model_path='/models/eagle3', speculative_num_steps=3, "
      "speculative_eagle_topk=1, speculative_num_draft_tokens=4, log_level='info')", flush=True)
n = 0
while True:
    n += 1
    print(f"[{ts()}] Decode batch, #running-req: 32, #token: {2000 + n * 10}, token usage: 0.10, accept len: 2.50, "
          "accept rate: 0.50, cuda graph: True, gen throughput (token/s): 1200.00, #queue-req: 0", flush=True)
    time.sleep(1)
