"""``/models``: upload (multipart, streamed, validated, deduplicated), list, get, delete."""

from __future__ import annotations

import json
from typing import Annotated

import anyio
from fastapi import APIRouter, Path, Request, Response, status

from compiler.errors import ModelError
from compiler.shapes.buckets import BucketSpec, SizeHistogram, parse_bucket_field
from service import intake
from service.api.deps import CurrentUser, FilesDep, StateDep, StorageDep
from service.api.errors import ApiError, model_error, not_found
from service.api.schemas import MAX_ID, ErrorBody, ModelDetail, ModelPublic, ModelsPublic, ModelTask
from service.uploads import receive_upload

router = APIRouter(prefix="/models", tags=["models"])

ModelId = Annotated[int, Path(ge=1, le=MAX_ID)]
_limiters: dict[int, anyio.CapacityLimiter] = {}

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "an ONNX file or a torch.export .pt2 archive",
                        },
                        "format": {
                            "type": "string",
                            "enum": ["onnx", "pt2"],
                            "description": "refuse the file if its content is another format",
                        },
                        "target": {
                            "type": "string",
                            "description": "target the task table is computed for (default cpu)",
                        },
                        "buckets": {
                            "type": "string",
                            "description": "shape buckets of symbolic dimensions, "
                            "'NAME=V1,V2,...' separated by ';' (e.g. seq=16,64,128): one "
                            "static specialization per value; or a histogram of expected "
                            "sizes 'NAME~SIZE:COUNT,...[/BUCKETS]' (e.g. seq~12:40,37:5,100:3/3) "
                            "to derive the buckets from, the tuning budget weighted by the "
                            "share of inputs each serves; a symbol given none gets powers of "
                            "two from 16 to 128",
                        },
                    },
                }
            }
        },
    }
}


def _limiter(settings) -> anyio.CapacityLimiter:
    """The validation slots: at most ``validation_concurrency`` uploads validate at once (each in
    its own process); the others wait in the event loop, holding no request thread."""
    key = settings.validation_concurrency
    if key not in _limiters:
        _limiters[key] = anyio.CapacityLimiter(key)
    return _limiters[key]


async def _validate_in_slot(settings, work):
    """Run ``work`` in a thread once a validation slot is free; 503 after waiting
    ``validation_queue_secs`` for one."""
    limiter = _limiter(settings)
    try:
        with anyio.fail_after(settings.validation_queue_secs):
            await limiter.acquire()
    except TimeoutError:
        raise ApiError(
            503,
            "validation_busy",
            f"every model validation slot stayed busy for {settings.validation_queue_secs:g} s; "
            "retry later",
            {"Retry-After": "10"},
        ) from None
    try:
        return await anyio.to_thread.run_sync(work)
    finally:
        limiter.release()


def _check_same_buckets(existing, buckets: dict[str, BucketSpec]) -> None:
    """A model is uploaded once per owner and content, with the buckets its task list was
    computed for: the same content with other buckets (or another histogram) is refused (409)
    rather than answered with the first upload's tasks."""
    if not buckets:
        return
    stored_json = json.loads(existing.buckets_json) if existing.buckets_json else {}
    stored = stored_json.get("symbols", {})
    histograms = stored_json.get("histograms") or {}
    same = (
        set(buckets) <= set(stored)
        and all(
            histograms.get(name) == spec.describe()
            if isinstance(spec, SizeHistogram)
            else name not in histograms and stored[name] == sorted(set(spec))
            for name, spec in buckets.items()
        )
        and set(stored) <= set(buckets)
    )
    if not same:
        have = (
            "none"
            if not stored
            else " ".join(
                f"{k}~{histograms[k]}" if k in histograms else f"{k}={','.join(map(str, v))}"
                for k, v in stored.items()
            )
        )
        raise ApiError(
            409,
            "buckets_conflict",
            f"this model was already uploaded as model {existing.id} with buckets {have}; "
            f"delete it (DELETE /models/{existing.id}) to upload it with other buckets",
        )


def model_detail(storage, row) -> ModelDetail:
    links = storage.model_workloads(row.id)
    summaries, _ = storage.browse_workloads(model_id=row.id, limit=100_000)
    by_id = {w.id: w for w in summaries}
    tasks = []
    for link in links:
        w = by_id.get(link.workload_id)
        tasks.append(
            ModelTask(
                name=link.task_name,
                key=w.key if w else "",
                workload_id=link.workload_id,
                weight=link.weight,
                flops=w.flops if w else None,
                summary=w.summary if w else "",
            )
        )
    return ModelDetail(**ModelPublic.from_record(row).model_dump(), tasks=tasks)


def owned_model(storage, user, model_id: int):
    row = storage.get_model(model_id)
    if row is None or row.owner != user.name:
        raise not_found("model", model_id)
    return row


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelDetail,
    openapi_extra=UPLOAD_BODY,
    responses={
        200: {"model": ModelDetail, "description": "the same content was already uploaded"},
        413: {"model": ErrorBody},
        415: {"model": ErrorBody},
        422: {"model": ErrorBody},
        503: {"model": ErrorBody, "description": "every validation slot stayed busy"},
    },
    summary="Upload a model (multipart 'file'); validated before anything is stored",
)
async def upload_model(
    request: Request,
    response: Response,
    state: StateDep,
    user: CurrentUser,
) -> ModelDetail:
    settings, storage, files = state.settings, state.storage, state.files
    temp = files.new_temp_file()
    try:
        upload = await receive_upload(request, temp, limit=settings.upload_limit)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fmt = upload.fields.get("format") or None
    target = upload.fields.get("target") or "cpu"
    if fmt not in (None, "onnx", "pt2"):
        temp.unlink(missing_ok=True)
        raise ApiError(422, "invalid_request", f"format must be 'onnx' or 'pt2', not {fmt!r}")
    try:
        buckets = parse_bucket_field(upload.fields.get("buckets") or "")
    except ModelError as err:
        temp.unlink(missing_ok=True)
        raise model_error(err) from None
    existing = await anyio.to_thread.run_sync(
        lambda: storage.find_model(owner=user.name, content_hash=upload.sha256)
    )
    if existing is not None:
        temp.unlink(missing_ok=True)
        if fmt is not None and existing.format != fmt:
            raise ApiError(
                415,
                "wrong_format",
                f"the file was declared as {fmt} but its content is {existing.format}",
            )
        _check_same_buckets(existing, buckets)
        response.status_code = status.HTTP_200_OK
        response.headers["Location"] = f"{request.url.path}/{existing.id}"
        return await anyio.to_thread.run_sync(model_detail, storage, existing)

    def work():
        row = intake.validate_and_store(
            storage,
            files,
            upload,
            owner=user.name,
            target=target,
            expected_format=fmt,
            limits=settings.model_limits(),
            process_limits=settings.validation_limits(),
            buckets=buckets,
        )
        return model_detail(storage, row)

    try:
        detail = await _validate_in_slot(settings, work)
    except ModelError as err:
        raise model_error(err) from None
    finally:
        temp.unlink(missing_ok=True)
    response.headers["Location"] = f"{request.url.path}/{detail.id}"
    return detail


@router.get("", response_model=ModelsPublic, summary="Your models, newest first")
def list_models(storage: StorageDep, user: CurrentUser) -> ModelsPublic:
    rows = storage.list_models(owner=user.name)
    return ModelsPublic(data=[ModelPublic.from_record(r) for r in rows], count=len(rows))


@router.get(
    "/{model_id}",
    response_model=ModelDetail,
    responses={404: {"model": ErrorBody}},
    summary="A model with its tuning-task table",
)
def get_model(model_id: ModelId, storage: StorageDep, user: CurrentUser) -> ModelDetail:
    return model_detail(storage, owned_model(storage, user, model_id))


@router.delete(
    "/{model_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
    summary="Delete a model (refused while a queued or running job uses it)",
)
def delete_model(
    model_id: ModelId, storage: StorageDep, files: FilesDep, user: CurrentUser
) -> Response:
    owned_model(storage, user, model_id)
    intake.delete_model(storage, files, model_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
