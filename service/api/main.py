"""The versioned API router: one router per resource under ``/api/v1``."""
from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import API_PREFIX
from service.api.routes import artifacts, health, jobs, models, tuning_db, workers

api_router = APIRouter(prefix=API_PREFIX)
for module in (health, models, jobs, artifacts, tuning_db, workers):
    api_router.include_router(module.router)
