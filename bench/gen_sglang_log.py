#!/usr/bin/env python3
# Benchmark input of bench/budgets.py: a deterministic (fixed seed) SGLang log of a given size.
"""Write a realistic SGLang server log (0.5.9+ format, 8 DP ranks, uvicorn + prefill + decode lines).
Usage: gen_sglang_log.py OUT MEGABYTES [--collapse-at FRACTION]"""
import random, sys, datetime
out, mb = sys.argv[1], float(sys.argv[2])
collapse_at = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
rnd = random.Random(7)
t = datetime.datetime(2026, 2, 23, 16, 0, 0)
target = int(mb * 1024 * 1024)
n = 0
with open(out, "w") as f:
    size = 0
    while size < target:
        t += datetime.timedelta(milliseconds=rnd.randint(5, 60))
        ts = t.strftime("%Y-%m-%d %H:%M:%S")
        r = rnd.random()
        dp = rnd.randint(0, 7)
        frac = size / target
        if r < 0.55:
            al = 1.0 + rnd.random() * 0.06 if frac > collapse_at else 2.2 + rnd.random() * 1.2
            line = (f"[{ts} DP{dp} TP{dp}] Decode batch, #running-req: {rnd.randint(1,64)}, #token: {rnd.randint(100,90000)}, "
                    f"token usage: {rnd.random():.2f}, accept len: {al:.2f}, accept rate: {(al-1)/3:.2f}, cuda graph: True, "
                    f"gen throughput (token/s): {rnd.random()*2000:.2f}, #queue-req: {rnd.randint(0,5)}\n")
        elif r < 0.75:
            line = f'[{ts}] INFO:     127.0.0.1:{rnd.randint(30000,60000)} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        else:
            line = (f"[{ts} DP{dp} TP{dp}] Prefill batch, #new-seq: 1, #new-token: {rnd.randint(10,4000)}, #cached-token: {rnd.randint(0,4000)}, "
                    f"token usage: {rnd.random():.2f}, #running-req: {rnd.randint(0,64)}, #queue-req: 0, cuda graph: True, input throughput (token/s): {rnd.random()*9000:.2f}\n")
        f.write(line); size += len(line); n += 1
print(n, "lines")
