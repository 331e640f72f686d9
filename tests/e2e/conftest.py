"""The jobs tests' stack fixtures (Redis, worker, backend on the session's Label Studio), for the rater page."""

from tests.jobs.conftest import job_stack, redis_server  # noqa: F401  (fixtures)
