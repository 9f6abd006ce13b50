"""The REST API: routers per resource (:mod:`service.api.routes`), dependencies, schemas, errors."""
