"""Receive a model upload: stream ``multipart/form-data`` to disk with a running size check.

Starlette's form parser spools the whole file before the endpoint runs; here the request body is
parsed as it arrives (python-multipart's push parser), the ``file`` part goes straight to a temp
file in the storage directory while its sha256 is computed, and the upload is refused with 413 as
soon as it passes the limit (the temp file is removed at once). Small text fields are collected up
to 1 KiB each. Nothing is left on disk when this raises.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from service.api.errors import ApiError

#: Content types accepted for the ``file`` part (absent is accepted too).
MODEL_PART_TYPES = frozenset(
    {
        "application/octet-stream",
        "application/onnx",
        "application/x-onnx",
        "application/vnd.onnx",
        "application/x-protobuf",
        "application/protobuf",
        "application/zip",
        "application/x-zip-compressed",
        "application/x-pytorch",
    }
)
MAX_FIELD_BYTES = 1024
MAX_FIELDS = 8
FLUSH_BYTES = 1 << 20
#: What a whole multipart body may have beyond the file: boundaries, part headers, the fields.
MULTIPART_OVERHEAD = 64 * 1024


@dataclass
class ReceivedUpload:
    path: Path
    sha256: str
    size: int
    filename: str
    content_type: str | None
    fields: dict[str, str] = field(default_factory=dict)


def _safe_filename(raw: str) -> str:
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable() and ch not in "\x00")
    return name[:255] or "model"


class _Parser:
    def __init__(self, limit: int, file_field: str) -> None:
        self.limit = limit
        self.file_field = file_field
        self.header_name = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}
        self.part_name: str | None = None
        self.part_is_file = False
        self.field_data = bytearray()
        self.fields: dict[str, str] = {}
        self.pending = bytearray()
        self.size = 0
        self.digest = hashlib.sha256()
        self.filename: str | None = None
        self.content_type: str | None = None
        self.file_parts = 0
        self.error: ApiError | None = None

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
        }

    def fail(self, error: ApiError) -> None:
        if self.error is None:
            self.error = error
        raise error

    def on_part_begin(self) -> None:
        self.headers = {}
        self.part_name = None
        self.part_is_file = False
        self.field_data = bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_name.lower()] = self.header_value
        self.header_name = b""
        self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        if name is None:
            self.fail(ApiError(400, "bad_multipart", "a form part has no name"))
        self.part_name = name.decode("utf-8", "replace")
        if self.part_name == self.file_field:
            self.file_parts += 1
            if self.file_parts > 1:
                self.fail(ApiError(400, "bad_multipart", "send exactly one 'file' part"))
            self.part_is_file = True
            self.filename = _safe_filename(
                options.get(b"filename", b"model").decode("utf-8", "replace")
            )
            raw_type = self.headers.get(b"content-type")
            if raw_type is not None:
                ctype = parse_options_header(raw_type)[0].decode("latin-1").lower()
                self.content_type = ctype
                if ctype not in MODEL_PART_TYPES:
                    self.fail(
                        ApiError(
                            415,
                            "unsupported_media_type",
                            f"the file part has content type {ctype!r}; send the model as "
                            "application/octet-stream (ONNX or a torch.export .pt2 archive)",
                        )
                    )
        elif len(self.fields) >= MAX_FIELDS:
            self.fail(
                ApiError(400, "bad_multipart", f"too many form fields (at most {MAX_FIELDS})")
            )

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.part_is_file:
            self.size += len(chunk)
            if self.size > self.limit:
                self.fail(too_large(self.limit))
            self.digest.update(chunk)
            self.pending += chunk
        else:
            if len(self.field_data) + len(chunk) > MAX_FIELD_BYTES:
                self.fail(
                    ApiError(400, "bad_multipart", f"form field {self.part_name!r} is too long")
                )
            self.field_data += chunk

    def on_part_end(self) -> None:
        if not self.part_is_file and self.part_name is not None:
            self.fields[self.part_name] = self.field_data.decode("utf-8", "replace")


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the upload is over the limit of {limit} bytes")


async def receive_upload(
    request: Request, dest: Path, *, limit: int, file_field: str = "file"
) -> ReceivedUpload:
    """Stream the multipart body of ``request`` into ``dest`` (which must exist and be empty)."""
    content_type, params = parse_options_header(request.headers.get("content-type"))
    if content_type.decode("latin-1").lower() != "multipart/form-data":
        raise ApiError(
            415,
            "unsupported_media_type",
            "upload the model as multipart/form-data with a 'file' part",
        )
    boundary = params.get(b"boundary")
    if not boundary:
        raise ApiError(400, "bad_multipart", "the multipart/form-data content type has no boundary")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + MULTIPART_OVERHEAD:
        raise too_large(limit)
    parser_state = _Parser(limit, file_field)
    parser = MultipartParser(boundary, parser_state.callbacks())
    try:
        async with await anyio.open_file(dest, "wb") as handle:
            async for chunk in request.stream():
                parser.write(chunk)
                if len(parser_state.pending) >= FLUSH_BYTES:
                    await handle.write(bytes(parser_state.pending))
                    parser_state.pending.clear()
            parser.finalize()
            if parser_state.pending:
                await handle.write(bytes(parser_state.pending))
                parser_state.pending.clear()
    except ApiError:
        dest.unlink(missing_ok=True)
        raise
    except FormParserError as err:
        dest.unlink(missing_ok=True)
        if parser_state.error is not None:
            raise parser_state.error from None
        raise ApiError(400, "bad_multipart", f"malformed multipart body: {err}") from None
    except ClientDisconnect:
        dest.unlink(missing_ok=True)
        raise ApiError(400, "client_disconnected", "the client closed the upload early") from None
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if parser_state.file_parts == 0:
        dest.unlink(missing_ok=True)
        raise ApiError(422, "missing_file", "the form has no 'file' part with the model")
    return ReceivedUpload(
        path=dest,
        sha256=parser_state.digest.hexdigest(),
        size=parser_state.size,
        filename=parser_state.filename or "model",
        content_type=parser_state.content_type,
        fields=parser_state.fields,
    )
