"""One router per resource, assembled in :mod:`service.api.main`."""
