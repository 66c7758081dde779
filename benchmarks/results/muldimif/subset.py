"""Write the stratified MulDimIF subset the embedded models were measured on.

Rule: for each (constraint_pattern, difficulty) cell of the test set (3 patterns x 4 levels),
the rows sorted by id, then `random.Random(SEED).sample(cell, PER_CELL)`; the subset keeps the
test set's layout and its order (by position in the test set).

    python benchmarks/results/muldimif/subset.py ../shared/benchmarks/muldimif/test.json \
        benchmarks/results/muldimif/subset.json [PER_CELL]
"""

import json
import random
import sys
from collections import defaultdict

SEED = 0
PER_CELL = 10


def main(source: str, target: str, per_cell: int = PER_CELL) -> None:
    rows = json.load(open(source, encoding="utf-8"))
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        cells[row["constraint_pattern"], row["difficulty"]].append(row)
    chosen = set()
    for cell in sorted(cells):
        members = sorted(cells[cell], key=lambda row: str(row["id"]))
        chosen.update(str(row["id"]) for row in random.Random(SEED).sample(members, per_cell))
    subset = [row for row in rows if str(row["id"]) in chosen]
    with open(target, "w", encoding="utf-8") as out:
        json.dump(subset, out, ensure_ascii=False, indent=1)
    print(f"{len(subset)} rows ({per_cell} per pattern x level) -> {target}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(arg) for arg in sys.argv[3:]))
