"""Writing export rows (``polar.training.exports``) as JSONL or Parquet, streamed from the row iterator.

for chunk in jsonl_chunks(rows): response.write(chunk)     # one JSON object per line
write_parquet(rows, "rl", path)                            # row groups of ROW_GROUP_SIZE, explicit schema

Both load with ``datasets.load_dataset("json" | "parquet", data_files=...)`` as they are. The Parquet schema is
explicit (``schema(kind)``: int32 token ids, int8 loss mask, float32 logprobs), so a column whose
first rows are null (``reward``, ``policy_version``) keeps its type; JSONL leaves type inference to the reader.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from polar.errors import ValidationError
from polar.training.exports import Kind

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

Format = Literal["jsonl", "parquet"]
FORMATS: tuple[Format, ...] = ("jsonl", "parquet")
MEDIA_TYPES: dict[Format, str] = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}
ROW_GROUP_SIZE = 1000
JSONL_FLUSH_BYTES = 1 << 16


@functools.cache
def schema(kind: Kind) -> pa.Schema:
    """The Parquet schema of ``kind``'s rows. Built on first use: pyarrow is imported only by a process that writes
    Parquet, not by every API process that serves JSONL or lists formats."""
    import pyarrow as pa  # type: ignore[import-untyped]

    if kind == "rl":
        # Its segment of the rollout (polar.reconstruction.segments); the evidence as JSON text.
        segment = [("index", pa.int32()), ("edge", pa.string()), ("parent", pa.int32()), ("call_id", pa.string()),
                   ("tool_call_id", pa.string()), ("evidence", pa.string()), ("trainable", pa.bool_())]  # fmt: skip
        media = [("sha256", pa.string()), ("call_id", pa.string()), ("offset", pa.int32()), ("length", pa.int32()),
                 ("media_type", pa.string())]  # fmt: skip
        return pa.schema(
            [
                pa.field("trajectory_id", pa.string(), nullable=False),
                pa.field("session_id", pa.string(), nullable=False),
                pa.field("batch_id", pa.string(), nullable=False),
                pa.field("task_id", pa.string(), nullable=False),
                pa.field("sample_index", pa.int32(), nullable=False),
                pa.field("group_id", pa.string(), nullable=False),
                pa.field("agent", pa.string(), nullable=False),
                pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
                pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
                pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
                pa.field("reward", pa.float64()),
                pa.field("policy_version", pa.string()),
                pa.field("num_calls", pa.int32(), nullable=False),
                pa.field("spans_policy_update", pa.bool_(), nullable=False),
                pa.field("main", pa.bool_(), nullable=False),
                pa.field("segment", pa.struct(segment)),
                # Its images' spans in token_ids (polar.storage.media); the bytes: GET /v1/media/{sha256}.
                pa.field("media", pa.list_(pa.struct(media)), nullable=False),
            ]
        )
    tool_call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning", pa.string()),
            ("tool_calls", pa.list_(tool_call)),
            ("tool_call_id", pa.string()),
            ("name", pa.string()),
        ]
    )
    image = pa.struct([("sha256", pa.string()), ("media_type", pa.string()), ("data", pa.string())])
    return pa.schema(
        [
            pa.field("session_id", pa.string(), nullable=False),
            pa.field("task_id", pa.string(), nullable=False),
            pa.field("sample_index", pa.int32(), nullable=False),
            pa.field("reward", pa.float64()),
            pa.field("messages", pa.list_(message), nullable=False),
            pa.field("tools", pa.list_(pa.string()), nullable=False),
            pa.field("images", pa.list_(image), nullable=False),
        ]
    )


def check_format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise ValidationError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
    return fmt


def jsonl_chunks(rows: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """The rows as JSON lines, in chunks of about ``JSONL_FLUSH_BYTES`` so a stream is not one write per row."""
    buffer: list[bytes] = []
    size = 0
    for row in rows:
        line = (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        buffer.append(line)
        size += len(line)
        if size >= JSONL_FLUSH_BYTES:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> int:
    """Write the rows to ``path`` as JSONL; returns the number of bytes written."""
    written = 0
    with path.open("wb") as out:
        for chunk in jsonl_chunks(rows):
            written += out.write(chunk)
    return written


def _batches(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _parquet_row(row: dict[str, Any]) -> dict[str, Any]:
    # A segment's evidence has no fixed fields: Parquet holds it as JSON text.
    segment = row.get("segment")
    if isinstance(segment, dict) and not isinstance(segment.get("evidence"), str | None):
        return {**row, "segment": {**segment, "evidence": json.dumps(segment["evidence"], ensure_ascii=False)}}
    return row


def write_parquet(rows: Iterable[dict[str, Any]], kind: Kind, path: Path, row_group_size: int = ROW_GROUP_SIZE) -> int:
    """Write the rows to ``path`` as Parquet, one row group per ``row_group_size`` rows; returns the row count.

    An export without rows is still a valid file with the full schema.
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    count = 0
    with pq.ParquetWriter(path, schema(kind), compression="zstd") as writer:
        for batch in _batches(map(_parquet_row, rows), row_group_size):
            writer.write_table(pa.Table.from_pylist(batch, schema=schema(kind)), row_group_size=row_group_size)
            count += len(batch)
    return count
