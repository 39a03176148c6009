"""``GET /v1/batches/<id>/export?kind=rl|sft&format=jsonl|parquet&min_reward=``: a batch as a training file.

JSONL is streamed row by row from a server-side cursor; Parquet is written to a temporary file first (its footer
comes last) and then sent. The export's counts travel in ``X-Polar-*`` headers.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from flask import Blueprint, Response, send_file, stream_with_context

from polar.errors import ValidationError
from polar.records.audit import record_now
from polar.training.export_formats import MEDIA_TYPES, check_format, jsonl_chunks, write_parquet
from polar.training.exports import ExportSummary, check_kind, export_rows, export_summary
from web.api.auth import caller
from web.api.requests import parse_id, query_arg, services

blueprint = Blueprint("exports", __name__, url_prefix="/v1/batches")


def _min_reward() -> float | None:
    raw = query_arg("min_reward")
    if raw is None:
        return None  # given but empty is a mistake (a 400 below), not "no threshold"
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError(f"min_reward: must be a number, got {raw!r}", field="min_reward") from None
    if not math.isfinite(value):
        raise ValidationError(f"min_reward: must be a finite number, got {raw!r}", field="min_reward")
    return value


def _headers(summary: ExportSummary) -> dict[str, str]:
    return {
        "X-Polar-Sessions": str(summary.sessions),
        "X-Polar-Accepted": str(summary.accepted),
        "X-Polar-Acceptance-Rate": f"{summary.acceptance_rate:g}",
        "X-Polar-Rows": str(summary.rows),
        "X-Polar-Tokens": str(summary.tokens),
    }


@blueprint.get("/<batch_id>/export")
def export(batch_id: str) -> Response:
    kind = check_kind(query_arg("kind", "rl") or "")
    fmt = check_format(query_arg("format", "jsonl") or "")
    min_reward = _min_reward()
    batch = parse_id(batch_id, "batch")
    summary = export_summary(services(), batch, kind, min_reward)
    detail = {"kind": kind, "format": fmt, "min_reward": min_reward, "sessions": summary.sessions,
              "accepted": summary.accepted, "rows": summary.rows}  # fmt: skip
    record_now(services().db, caller(), "export", str(batch), detail)
    filename = f"{batch}-{kind}.{fmt}"
    rows = export_rows(services(), batch, kind, min_reward)
    if fmt == "jsonl":
        response = Response(stream_with_context(jsonl_chunks(rows)), mimetype=MEDIA_TYPES[fmt])
        response.headers["Content-Disposition"] = f"attachment; filename={filename}"
    else:
        handle, name = tempfile.mkstemp(suffix=".parquet")
        os.close(handle)
        try:
            write_parquet(rows, kind, Path(name))
            data = open(name, "rb")  # noqa: SIM115 -- send_file closes it once sent
        finally:
            os.unlink(name)  # the open handle keeps the bytes until the response is done
        response = send_file(data, mimetype=MEDIA_TYPES[fmt], as_attachment=True, download_name=filename)
    response.headers.update(_headers(summary))
    return response
