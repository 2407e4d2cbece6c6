"""The service fixtures (real service over HTTP, SQLite and PostgreSQL) of the service tests."""

from tests.scheduler_svc.conftest import db_url, http, pg_url, service, settings  # noqa: F401
