"""MulDimIF's official evaluation (`evaluation.py`'s `check` and `get_score`, from a copy of
github.com/Junjie-Ye/MulDimIF's `Code` at commit efd0c02) on answers `mrtpo score` scored:
prints the official report and how many rows have the same per-constraint verdicts.

    MULDIMIF_CODE=/tmp/muldimif_official/Code ZHCONV=/tmp/zhconv_pkg \
        python benchmarks/results/muldimif/official_report.py SUBSET_JSON ANSWERS_JSONL EVAL_JSON
"""

import contextlib
import copy
import io
import json
import os
import sys
import types

import nltk

from mrtpo.tasks.instructions.text import NLTK_DIR, sentence_tokenizer

CODE = os.environ.get("MULDIMIF_CODE", "/tmp/muldimif_official/Code")
sys.path[:0] = [os.environ.get("ZHCONV", "/tmp/zhconv_pkg"), f"{CODE}/evaluation", CODE]
sys.modules["openai"] = types.SimpleNamespace(OpenAI=None)  # data_utils imports it; unused here
sentence_tokenizer()
nltk.data.path.insert(0, str(NLTK_DIR))
with contextlib.redirect_stdout(io.StringIO()):
    import evaluation  # noqa: E402  (the official module, found on sys.path above)
rows = json.load(open(sys.argv[1]))
records = [json.loads(line) for line in open(sys.argv[2])]
answers = {record["id"]: record["response"] for record in records}
data = []
for row in rows:
    item = copy.deepcopy(row)
    item["conversations"].append({"role": "assistant", "content": answers[str(row["id"])]})
    data.append(item)
judged = evaluation.check(data)
score = evaluation.get_score(judged)
print(json.dumps(score, indent=1))
ours = json.load(open(sys.argv[3]))
mine = {
    e["id"]: [
        v["score"]
        for k, v in e["verdicts"].items()
        if k.startswith("muldimif_constraint_") and v["score"] is not None
    ]
    for e in ours["examples"]
}
same = sum(mine[str(item["id"])] == [float(j) for j in item["judges"]] for item in judged)
print(f"rows with identical per-constraint verdicts: {same}/{len(judged)}")
