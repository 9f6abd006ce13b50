"""TuneHub settings, read from ``TUNEHUB_*`` environment variables (pydantic-settings).

One class for the CLI, the service and the workers, so a limit set once applies everywhere.
"""
from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from compiler.model_spec import ModelLimits


class Settings(BaseSettings):
    """Environment: ``TUNEHUB_MAX_MODEL_BYTES``, ``TUNEHUB_MAX_INPUT_ELEMENTS``, ..."""

    model_config = SettingsConfigDict(env_prefix="TUNEHUB_", extra="ignore")

    max_model_bytes: int = Field(512 * 1024 * 1024, gt=0, description="largest accepted model file")
    max_input_elements: int = Field(1 << 26, gt=0, description="largest declared input tensor")
    max_total_input_bytes: int = Field(1 << 30, gt=0, description="all inputs together")

    def model_limits(self) -> ModelLimits:
        return ModelLimits(
            max_bytes=self.max_model_bytes,
            max_input_elements=self.max_input_elements,
            max_total_input_bytes=self.max_total_input_bytes,
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
