"""Settings from the environment, with defaults that work on a fresh machine.

Every part (CLI, Celery worker, ML backend) builds its Settings with `Settings.from_env()`; nothing else
reads os.environ, so a test can run a whole stack against its own directory by setting SENSE7_HOME.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

RATING_PROJECT_TITLE = "SENSE-7 empathy ratings"
PROFILE_PROJECT_TITLE = "SENSE-7 rater profile"


@dataclass(frozen=True)
class Settings:
    home: Path
    ls_port: int
    ls_url: str
    ls_token: str
    ls_admin_email: str
    ls_admin_password: str
    store_url: str
    redis_url: str | None
    backend_port: int
    backend_url: str
    backend_user: str | None
    backend_password: str | None
    webhook_secret: str
    model_dir: Path
    ls_database_url: str | None = None  # PostgreSQL for Label Studio itself; None = SQLite in home
    rating_project_title: str = RATING_PROJECT_TITLE
    profile_project_title: str = PROFILE_PROJECT_TITLE
    taxonomy_path: Path | None = None  # the study's taxonomy YAML (SENSE7_TAXONOMY); None = the packaged one

    @classmethod
    def from_env(cls, env: dict | None = None) -> "Settings":
        env = os.environ if env is None else env
        home = Path(env.get("SENSE7_HOME", Path.cwd() / ".sense7")).resolve()
        ls_port = int(env.get("SENSE7_LS_PORT", "8080"))
        backend_port = int(env.get("SENSE7_BACKEND_PORT", "9090"))
        return cls(
            home=home,
            ls_port=ls_port,
            ls_url=env.get("SENSE7_LS_URL", f"http://127.0.0.1:{ls_port}").rstrip("/"),
            ls_token=env.get("SENSE7_LS_TOKEN") or _local_secret(home, "ls_token"),
            ls_admin_email=env.get("SENSE7_LS_ADMIN_EMAIL", "admin@sense7.local"),
            ls_admin_password=env.get("SENSE7_LS_ADMIN_PASSWORD") or _local_secret(home, "ls_password"),
            store_url=env.get("SENSE7_STORE_URL", f"sqlite:///{home / 'store.sqlite'}"),
            redis_url=env.get("SENSE7_REDIS_URL") or env.get("CELERY_BROKER_URL") or None,
            backend_port=backend_port,
            backend_url=env.get("SENSE7_BACKEND_URL", f"http://127.0.0.1:{backend_port}").rstrip("/"),
            backend_user=env.get("SENSE7_BACKEND_USER") or None,
            backend_password=env.get("SENSE7_BACKEND_PASSWORD") or None,
            webhook_secret=env.get("SENSE7_WEBHOOK_SECRET") or _local_secret(home, "webhook_secret"),
            model_dir=Path(env.get("SENSE7_MODEL_DIR", home / "models")).resolve(),
            ls_database_url=env.get("SENSE7_LS_DATABASE_URL") or None,
            rating_project_title=env.get("SENSE7_RATING_PROJECT_TITLE") or RATING_PROJECT_TITLE,
            profile_project_title=env.get("SENSE7_PROFILE_PROJECT_TITLE") or PROFILE_PROJECT_TITLE,
            taxonomy_path=taxonomy_path_from_env(env),
        )


def taxonomy_path_from_env(env: dict | None = None) -> Path | None:
    """SENSE7_TAXONOMY (the study's taxonomy YAML) without building a whole Settings (which creates the
    local secrets): for commands such as `sense7 evaluate` that need nothing else. None = packaged file."""
    env = os.environ if env is None else env
    value = env.get("SENSE7_TAXONOMY")
    return Path(value).expanduser().resolve() if value else None


def _local_secret(home: Path, name: str) -> str:
    """A random secret generated once per SENSE7_HOME and kept in a 0600 file, never printed or logged."""
    path = home / "secrets" / name
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    value = secrets.token_hex(20)
    # O_EXCL: two processes starting at once agree on the first value written.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    return value
