"""The versioned API router: one router per resource under ``/api/v1``."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import API_PREFIX
from service.api.routes import artifacts, health, job_history, jobs, models, tuning_db, workers
from service.api.schemas import ErrorBody

AUTH_ERRORS = {
    401: {"model": ErrorBody, "description": "missing, unknown or revoked token"},
    403: {"model": ErrorBody, "description": "a token of the wrong kind"},
}

api_router = APIRouter(prefix=API_PREFIX)
api_router.include_router(health.router)
for module in (models, jobs, job_history, artifacts, tuning_db, workers):
    api_router.include_router(module.router, responses=AUTH_ERRORS)
