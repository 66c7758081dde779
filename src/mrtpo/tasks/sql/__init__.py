"""Text-to-SQL: three rewards (format, executability, execution match) on a SQLite sandbox.

- `task`: `SqlTask` and `TASK`, what `mrtpo.tasks.get("sql")` returns;
- `response_format`: the response layout (`<think>` / `<answer>` tags) and its parser;
- `verifiers`: `SqlFormat`, `SqlExecutable`, `SqlExecution` and the `QueryRunner` they share;
- `data`: the bundled shop data, Spider and BIRD loaders;
- `sandbox`: the read-only, time/row/byte-capped SQLite child process every query runs in.
"""

from mrtpo.tasks.sql.data import load_bird, load_spider
from mrtpo.tasks.sql.response_format import ResponseFormat
from mrtpo.tasks.sql.task import TASK, SqlTask
from mrtpo.tasks.sql.verifiers import QueryRunner, SqlExecutable, SqlExecution, SqlFormat

__all__ = [
    "TASK",
    "SqlTask",
    "SqlFormat",
    "SqlExecutable",
    "SqlExecution",
    "QueryRunner",
    "ResponseFormat",
    "load_spider",
    "load_bird",
]
