#!/usr/bin/env python3
"""Write an SGLang log (0.5.9+ format, 8 DP ranks, whole-second stamps, 0-3 decode lines per rank
a second at mixed load levels, some prefill lines) on which ThroughputDrop, AcceptanceDegradation
and AcceptanceDrift fire and resolve at the defaults: from 2 h, DP0-3 at 45 % of their gen
throughput for 36 min; at 1 h a 36 s dip of DP5 (pending, never fires); from 3 h, DP4-7 at accept
len 2.2 instead of 3.0 for 42 min; a 42 min silence from 5.2 h; from 6 h, accept len falling by
0.6 over 5 h. Input of the decision checks of the windowed rules (bench/decisions.py): the
bench's healthy and incident logs fire none of them.
Usage: gen_drop_log.py OUT HOURS SEED   (12 h: about 110 MB)"""
import datetime, random, sys
out, hours, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
t0 = datetime.datetime(2026, 2, 23, 8, 0, 0)
H = 3600
with open(out, "w") as f:
    f.write(f"[{t0:%Y-%m-%d %H:%M:%S}] server_args=ServerArgs(model_path='/m/target', speculative_algorithm='EAGLE3', "
            "speculative_draft_model_path='/m/draft', speculative_num_steps=3, speculative_eagle_topk=1, "
            "speculative_num_draft_tokens=4, port=30000)\n")
    s = 0
    while s < hours * H:
        if 5.2 * H <= s < 5.9 * H:  # a silence: drift resets
            s += 1
            continue
        ts = (t0 + datetime.timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S")
        for dp in range(8):
            for _ in range(rnd.choice([0, 1, 1, 2, 3])):
                running = rnd.choice([8, 9, 12, 15, 16, 20, 31]) if rnd.random() < 0.97 else 0
                lvl = max(1, running).bit_length()
                thr = lvl * 100 * rnd.uniform(0.9, 1.1)
                if 2 * H <= s < 2.6 * H and dp < 4:
                    thr *= 0.45
                if 1.0 * H <= s < 1.01 * H and dp == 5:
                    thr *= 0.55  # a short dip: pending, never fires
                al = 3.0 + rnd.uniform(-0.15, 0.15)
                if 3 * H <= s < 3.7 * H and dp >= 4:
                    al = 2.2 + rnd.uniform(-0.1, 0.1)
                if s >= 6 * H:
                    al -= 0.6 * (s - 6 * H) / (5 * H)
                f.write(f"[{ts} DP{dp} TP{dp}] Decode batch, #running-req: {running}, #token: {rnd.randint(100, 90000)}, "
                        f"token usage: {rnd.random():.2f}, accept len: {al:.2f}, accept rate: {(al - 1) / 3:.2f}, "
                        f"cuda graph: True, gen throughput (token/s): {thr:.2f}, #queue-req: {rnd.randint(0, 5)}\n")
                if rnd.random() < 0.3:
                    f.write(f"[{ts} DP{dp} TP{dp}] Prefill batch, #new-seq: 1, #new-token: {rnd.randint(10, 4000)}, "
                            f"#cached-token: 0, token usage: 0.30, #running-req: {running}, #queue-req: 0, cuda graph: True, "
                            f"input throughput (token/s): 3000.00\n")
        s += 1
